"""The conversion flow's per-target step: check an artifact against its target, then package it.

    reports = check_for_target(prog_or_tflite, "android", strict=False)   # prints the summary
    written = package("web", prog, "out/")                                 # {file name: path}
"""

from __future__ import annotations

import numpy as np

from .compat import compatibility
from .registry import get_target

__all__ = ["check_for_target", "package", "lower_for_target", "calibration_samples", "resolve_quant"]


def _say(say):
    return say if say is not None else print


def _is_tflite(x) -> bool:
    return isinstance(x, (bytes, bytearray, memoryview))


def lower_for_target(prog, target, *, channel_last=None) -> bytes:
    """Program -> float .tflite with the target's layout default (NHWC image I/O on android/ios/iot)."""
    from .mobile import lower_edge

    t = get_target(target)
    if t.backend != "edge":
        raise ValueError(f"target {t.name!r} uses the {t.backend} backend, not LiteRT")
    if channel_last is None:
        channel_last = t.options.get("channel_last_io", False)
    return lower_edge(prog, channel_last=channel_last)


def check_for_target(prog_or_bytes, target, strict: bool = False, *, delegates=None, topology=None,
                     say=None, channel_last=None) -> list:
    """Check a Program or .tflite bytes against ``target``; returns the compatibility Reports printed.

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
    tflite = bytes(prog_or_bytes) if _is_tflite(prog_or_bytes) else lower_for_target(
        prog_or_bytes, t, channel_last=channel_last)
    if t.name == "web":
        from .web import check_web_io

        check_web_io(tflite)
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


def package(target, prog_or_bytes, out_dir: str, *, name: str = "model", strict: bool = False, say=None,
            **options) -> dict:
    """Lower (if given a Program), check, and write ``target``'s files into ``out_dir``; {file: path}.

    Options: ``channel_last`` (edge layout override), ``quant_config`` (a scheme of edge/quantize.py the
    target's runtime runs; iot: always static int8), ``calibration_data`` (static int8), ``fp16_weights``
    (= quant_config "fp16"), ``verify_inputs``, ``flash_kib``, ``ram_kib`` (iot), ``topology``, ``aot`` (TPU).
    """
    t = get_target(target)
    say = _say(say)
    if t.backend == "tpu":
        return _package_tpu(t, prog_or_bytes, out_dir, name, say, **options)
    channel_last = options.pop("channel_last", None)
    if channel_last is None:
        channel_last = t.options.get("channel_last_io", False)
    # before lowering: the scheme against the target, the calibration samples against the signature
    quant, calibration = _quant_options(t, options)
    _no_leftovers(t, {k: v for k, v in options.items() if not (t.name == "iot" and k in _IOT_OPTIONS)})
    feeds = _program_feeds(prog_or_bytes, calibration, channel_last) if calibration is not None else None
    tflite = bytes(prog_or_bytes) if _is_tflite(prog_or_bytes) else lower_for_target(
        prog_or_bytes, t, channel_last=channel_last)
    if calibration is not None and feeds is None:
        feeds = _tflite_feeds(prog_or_bytes, tflite, calibration, channel_last)
    if t.name == "iot":
        return _package_iot(t, prog_or_bytes, tflite, out_dir, name, strict, say, channel_last, quant, feeds,
                            **options)
    if quant is not None:
        from edge.quantize import quantize_tflite

        tflite = quantize_tflite(tflite, quant, feeds)
    check_for_target(tflite, t, strict=strict, say=say)
    from .files import write_files

    if t.name == "web":
        from .web import write_web_package

        return write_web_package(tflite, out_dir, name)
    return write_files(out_dir, {f"{name}.tflite": tflite})


_IOT_OPTIONS = ("verify_inputs", "flash_kib", "ram_kib")


def _no_leftovers(t, options) -> None:
    if options:
        raise TypeError(f"target {t.name!r} does not take option(s) {', '.join(sorted(options))}")


def _quant_options(t, options) -> tuple:
    """(QuantConfig or None, calibration data) from the options, which it consumes."""
    quant, calibration = resolve_quant(t, options)
    for k in ("quant_config", "fp16_weights", "calibration_data"):
        options.pop(k, None)
    return quant, calibration


def resolve_quant(t, options) -> tuple:
    """(QuantConfig or None, calibration data) that ``options`` ask of target ``t``; iot is always static
    int8. Checks the scheme against the target's runtime and the calibration data against the scheme,
    without touching the model: converter.convert runs it for every target before capture."""
    from .quantize import QuantizationError, check_scheme

    t = get_target(t)
    quant = options.get("quant_config")
    if options.get("fp16_weights", t.options.get("fp16_weights", False)):
        quant = quant or "fp16"
    if t.name == "iot" and quant is None:
        quant = "static_int8"
    quant = check_scheme(t, quant)
    calibration = options.get("calibration_data")
    if quant is not None and quant.needs_calibration and calibration is None:
        raise QuantizationError(f"target {t.name!r}: {quant.scheme} builds a full-integer int8 model and needs "
                                "calibration_data (a list of sample inputs: tuples of the module's args, or "
                                "{input name: array})")
    if calibration is not None and (quant is None or not quant.needs_calibration):
        raise TypeError(f"target {t.name!r} does not take option calibration_data without a static quant_config "
                        "(e.g. quant_config='static_int8')")
    return quant, calibration


def _channel_last_inputs(prog_or_bytes, channel_last) -> tuple:
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
    from edge.quantize import calibration_feeds

    return calibration_feeds(prog_or_bytes, samples, channel_last_inputs=_channel_last_inputs(prog_or_bytes,
                                                                                               channel_last))


def _tflite_feeds(prog_or_bytes, tflite, calibration, channel_last) -> dict:
    if isinstance(calibration, dict):
        return calibration  # {signature: [{input name: array}]} already
    from .tflite_io import signatures

    cl_inputs = _channel_last_inputs(prog_or_bytes, channel_last)
    return {next(iter(signatures(tflite))): calibration_samples(tflite, calibration, channel_last_inputs=cl_inputs)}


def _package_iot(t, prog_or_bytes, float_tflite, out_dir, name, strict, say, channel_last, quant, cal, *,
                 verify_inputs=None, flash_kib=None, ram_kib=None) -> dict:
    from .iot import convert_iot, write_iot_package

    ver = None if verify_inputs is None else calibration_samples(
        float_tflite, verify_inputs, channel_last_inputs=_channel_last_inputs(prog_or_bytes, channel_last))
    model = convert_iot(float_tflite, cal, verify_inputs=ver, io_dtype=quant.io_dtype)
    say(model.compat.summary())
    say(model.summary())
    return write_iot_package(model, out_dir, name, flash_kib=flash_kib, ram_kib=ram_kib)


def _package_tpu(t, prog, out_dir, name, say, *, topology=None, aot=False, **rest) -> dict:
    import os

    import tpu_backend

    _no_leftovers(t, rest)
    check_for_target(prog, t, topology=topology, say=say)
    bundle = tpu_backend.export_program(prog, platforms=t.platforms)
    if aot and t.chip is not None:
        bundle.compile_for(t.name, topology or t.default_topology)
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"{name}.tpuexp")
    tpu_backend.save(bundle, path)
    return {f"{name}.tpuexp": path}
