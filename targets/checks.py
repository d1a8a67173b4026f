"""The conversion flow's per-target step: check an artifact against its target, then package it.

    reports = check_for_target(prog_or_tflite, "android", strict=False)   # prints the summary
    written = package("web", prog, "out/")                                 # {file name: path}

What differs between targets (I/O dtypes, quantization, the package's files) is a hook of the target
(targets/registry.py); the options are the target's typed options (targets/options.py).
"""

from __future__ import annotations

import dataclasses
import mmap
from typing import Callable

import numpy as np

from .compat import compatibility
from .options import EdgeOptions, options_for
from .registry import get_target

__all__ = ["check_for_target", "package", "package_edge", "lower_for_target", "calibration_samples", "PackageJob"]


def _say(say):
    return say if say is not None else print


def _is_tflite(x) -> bool:
    return isinstance(x, (bytes, bytearray, memoryview, mmap.mmap))


def lower_for_target(prog, target, *, channel_last_io=None) -> bytes:
    """Program -> float .tflite with the target's layout default (NHWC image I/O on android/ios/iot)."""
    from .mobile import lower_edge

    t = get_target(target)
    if t.backend != "edge":
        raise ValueError(f"target {t.name!r} uses the {t.backend} backend, not LiteRT")
    return lower_edge(prog, channel_last=t.channel_last_io if channel_last_io is None else channel_last_io)


def check_for_target(prog_or_bytes, target, strict: bool = False, *, delegates=None, topology=None,
                     say=None, channel_last_io=None) -> list:
    """Check a Program, .tflite bytes or a map of a .tflite file (edge.tflite_check.map_tflite) against
    ``target``; returns the compatibility Reports printed.

    Edge targets: every delegate table of the target (or ``delegates``) reports accelerated vs
    fallback ops; ``strict`` turns any fallback into CompatibilityError naming the ops. TPU targets:
    the topology must be one the chip comes in (InvalidTopologyError lists the valid ones).
    """
    t = get_target(target)
    say = _say(say)
    if t.backend == "tpu":
        if t.chip is not None:
            from .tpu import check_topology

            topo = check_topology(t, topology)
            say(f"{t.name}: topology {topo.libtpu_name} ({topo.chips} chips, {topo.devices} devices)")
        return []
    if isinstance(prog_or_bytes, mmap.mmap):  # a written (maybe multi-GB) file: the checks read its tables only
        tflite = prog_or_bytes
    else:
        tflite = bytes(prog_or_bytes) if _is_tflite(prog_or_bytes) else lower_for_target(
            prog_or_bytes, t, channel_last_io=channel_last_io)
    t.check_io(tflite)
    reports = [compatibility(tflite, t, delegate=d) for d in (delegates or t.delegates)]
    for r in reports:
        say(r.summary())
    if strict:
        for r in reports:
            r.raise_if_fallback()
    return reports


def calibration_samples(tflite: bytes, samples, *, channel_last_inputs=()) -> list[dict]:
    """Calibration/verification samples as [{input name: array}] in the .tflite's layout and dtypes.

    A sample is either such a dict already, or a tuple of the module's positional args in torch's
    layout: 4-D inputs listed in ``channel_last_inputs`` go NCHW -> NHWC, dtypes follow the .tflite.
    """
    from .tflite_io import signatures

    ins = next(iter(signatures(tflite).values()))[0]
    out = []
    for sample in samples:
        if isinstance(sample, dict):
            out.append({k: np.asarray(v) for k, v in sample.items()})
            continue
        args = sample if isinstance(sample, (tuple, list)) else (sample,)
        if len(args) != len(ins):
            raise ValueError(f"a calibration sample has {len(args)} tensors; the model takes {len(ins)} "
                             f"({', '.join(s.name for s in ins)})")
        d = {}
        for i, (spec, a) in enumerate(zip(ins, args)):
            a = a.detach().cpu().numpy() if hasattr(a, "detach") else np.asarray(a)
            if i in channel_last_inputs and a.ndim == 4:
                a = a.transpose(0, 2, 3, 1)
            d[spec.name] = np.ascontiguousarray(a.astype(spec.dtype))
        out.append(d)
    return out


def package(target, prog_or_bytes, out_dir: str, *, name: str = "model", say=None, **options) -> dict:
    """Lower (if given a Program), check, and write ``target``'s files into ``out_dir``; {file: path}.

    ``options`` are the target's (targets/options.py), checked before anything is lowered: edge targets
    ``channel_last_io``, ``strict_ops``, ``quant_config`` (a scheme the target's runtime runs; iot: always
    static int8), ``calibration_data`` (static int8), and on iot ``verify_inputs``, ``flash_kib``,
    ``ram_kib``; TPU targets ``topology``, ``aot`` (here: off unless asked), ``use_pallas``, ``dtype``, ...
    """
    t = get_target(target)
    say = _say(say)
    if t.backend == "tpu":
        import os

        from .tpu import write_tpu_artifact

        if t.chip is not None:
            options.setdefault("aot", False)  # a package compiles only when asked; convert does when it can
        opts = options_for(t, options)
        check_for_target(prog_or_bytes, t, topology=getattr(opts, "topology", None), say=say)
        path = os.path.join(out_dir, f"{name}.tpuexp")
        write_tpu_artifact(prog_or_bytes, t, opts, path, say)
        return {f"{name}.tpuexp": path}
    return package_edge(t, prog_or_bytes, out_dir, options_for(t, {"name": name, **options}), say)


@dataclasses.dataclass(frozen=True)
class PackageJob:
    """What a target's ``finish`` hook needs beside the float .tflite."""

    prog_or_bytes: object  # the Program (or the .tflite bytes) being packaged
    out_dir: str
    name: str  # file stem
    options: EdgeOptions
    quant: object  # QuantConfig or None
    feeds: object  # calibration samples in the .tflite's layout, or None
    channel_last_io: bool  # resolved: the option, or the target's default
    say: Callable[[str], None]


def package_edge(t, prog_or_bytes, out_dir: str, opts: EdgeOptions, say) -> dict:
    """``package`` for an edge target whose options are already checked."""
    from .quantize import resolve_quant

    channel_last = opts.channel_last_for(t)
    quant = resolve_quant(t, opts.quant_config, opts.calibration_data)
    calibration = opts.calibration_data
    # before lowering: the calibration samples against the signature
    feeds = _program_feeds(prog_or_bytes, calibration, channel_last) if calibration is not None else None
    tflite = bytes(prog_or_bytes) if _is_tflite(prog_or_bytes) else lower_for_target(
        prog_or_bytes, t, channel_last_io=channel_last)
    if calibration is not None and feeds is None:
        feeds = _tflite_feeds(prog_or_bytes, tflite, calibration, channel_last)
    job = PackageJob(prog_or_bytes, out_dir, opts.name or "model", opts, quant, feeds, channel_last, say)
    return t.finish(tflite, job)


def nhwc_inputs(prog_or_bytes, channel_last) -> tuple:
    """Indices of the inputs the .tflite takes NHWC (none for .tflite bytes or channel_last False)."""
    if _is_tflite(prog_or_bytes) or not channel_last:
        return ()
    from .mobile import channel_last_io

    return next(iter(channel_last_io(prog_or_bytes).values()))[0]


def _program_feeds(prog_or_bytes, calibration, channel_last) -> dict | None:
    """{signature: [{input name: array}]} in the .tflite's layout, for samples given as tuples of the
    module's args and checked against the Program's signature; None when only the .tflite can tell."""
    from .quantize import QuantizationError

    samples = calibration if isinstance(calibration, dict) else list(calibration)
    if not samples:
        raise QuantizationError("calibration_data is empty; static int8 needs representative samples")
    if _is_tflite(prog_or_bytes) or isinstance(samples, dict) or any(isinstance(x, dict) for x in samples):
        return None
    from tpu_export.edge.quantize import calibration_feeds

    return calibration_feeds(prog_or_bytes, samples, channel_last_inputs=nhwc_inputs(prog_or_bytes, channel_last))


def _tflite_feeds(prog_or_bytes, tflite, calibration, channel_last) -> dict:
    if isinstance(calibration, dict):
        return calibration  # {signature: [{input name: array}]} already
    from .tflite_io import signatures

    cl_inputs = nhwc_inputs(prog_or_bytes, channel_last)
    return {next(iter(signatures(tflite))): calibration_samples(tflite, calibration, channel_last_inputs=cl_inputs)}
