"""One call, both outputs: capture once, then write an artifact per target.

``convert(model, args, targets=["tpu-v6e", "android"], out_dir=...)`` (or per-target options:
``targets={"web": {}, "iot": {"calibration_data": cal}, "tpu-v6e": {"topology": "2x2"}}``) resolves
every target and checks every target's options and every backend's op support before any work; every artifact is
built in a staging folder inside ``out_dir`` and all of them are published together, then the
summary.json beside them: a failure leaves ``out_dir`` as it was.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from tpu_export.converter.atomic import discard, publish_dir, staging_dir, write_file
from tpu_export.converter.errors import ConversionError
from tpu_export.converter.pipeline import SignatureRequest, prepare_many
from tpu_export.targets.files import artifact_size

if TYPE_CHECKING:
    import onnx
    import torch

__all__ = ["convert"]


def _backend(name: str):
    # targets/ picks the backend, its options and its checks for each target.
    from tpu_export.targets.backends import BACKENDS

    return BACKENDS[name]


def convert(
    module: torch.nn.Module | torch.export.ExportedProgram | str | os.PathLike[str] | onnx.ModelProto,
    sample_args: tuple[Any, ...] | None = None,
    sample_kwargs: dict[str, Any] | None = None,
    *,
    targets: str | Sequence[str] | Mapping[str, Any],
    out_dir: str | os.PathLike[str],
    dynamic_shapes: Any = None,
    strict: bool | str = "auto",
    enable_x64: bool = False,
    progress: Callable[[str], None] | None = None,
    dim_sizes: dict[str, int] | None = None,
    max_rel_err: float | None = None,
    **options: Any,
) -> dict[str, str]:
    """Capture ``module`` once and write one artifact per target into ``out_dir``.

    Targets are TPU chips (``tpu-v5e``, ``tpu-v6e``, ``tpu-v5p``, ``tpu-v7x``: a StableHLO artifact, AOT-compiled
    for the chip when libtpu is installed), the same artifact for a GPU or CPU (``cuda``, ``cpu-xla``) and edge
    devices (``android``, ``ios``, ``cpu``: a ``.tflite``; ``web``: LiteRT.js; ``iot``: int8 TFLite Micro);
    ``tpu-export targets`` lists them with their options. Every
    target's options and every backend's op support are checked before any work. The artifacts are built in a
    staging folder inside ``out_dir`` and published together with a ``summary.json`` beside them: a failure
    leaves ``out_dir`` as it was. Converting again into the same ``out_dir`` replaces only the targets named.

    Args:
        module: An ``nn.Module`` (called as ``module(*sample_args, **sample_kwargs)``), a
            ``torch.export.ExportedProgram``, a ``.pt2`` path, or an ONNX model (an ``.onnx`` path or an
            ``onnx.ModelProto``: no sample inputs needed, shapes come from the graph).
        sample_args: Example positional inputs: a tuple, or a single tensor.
        sample_kwargs: Example keyword inputs.
        targets: A target name, a list of names, or ``{name: options}`` where each target's options are a dict
            (or its options dataclass, ``tpu_export.targets.options``).
        out_dir: The folder to write into (created if missing): one sub-folder per target, and ``summary.json``.
        dynamic_shapes: ``torch.export``'s dynamic-shape spec (a ``torch.export.Dim`` per dynamic dim).
        strict: ``torch.export`` tracing: ``"auto"`` (non-strict first, then strict), ``True`` or ``False``.
        enable_x64: Keep 64-bit dtypes 64-bit (by default int64 and float64 compute as 32-bit).
        progress: Called with one line per step (capture, each target's lowering, publishing).
        dim_sizes: For an ONNX model: sizes for its named dims (``{"batch": 1}``); the others stay dynamic.
        max_rel_err: Accuracy-driven mixed precision for the edge targets quantized with a weight scheme
            (``dynamic_int8``, ``weight_only_int8``, ``dynamic_int4_block32``, ``weight_only_int4``): the ops whose
            quantization costs the most accuracy stay float until the output's relative error against torch eager
            on the sample inputs is at most this; ``summary.json`` says which ops stayed float and what that costs.
        **options: Options shared by the targets: each target takes those of its kind (``topology`` and ``aot``
            go to TPU chips, ``quant_config`` and ``calibration_data`` to edge targets...). An option that no
            target of the call takes is an error. Per-target options add to (and override) the shared ones.

    Returns:
        Target name -> the path of its main file (the ``.tflite``, or the ``.tpuexp`` artifact).

    Raises:
        ValueError: A target name is unknown, ``targets`` is empty, or names a target twice.
        TypeError: An option is unknown to every target of the call or has the wrong type (``OptionsError``), or
            ``dim_sizes`` is given for a model that is not ONNX.
        tpu_export.converter.ExportFailedError: ``torch.export`` failed on the module (the message explains the
            cause and the fix).
        tpu_export.converter.UnsupportedOpsError: A target's backend does not lower some ops (all of them are
            listed, with their source lines, before anything is written).
        tpu_export.converter.ConversionError: ``out_dir`` is a file, or holds a folder of a target's name that this
            tool did not write.

    Examples:
        >>> import os, tempfile
        >>> import torch
        >>> import tpu_export
        >>> m = torch.nn.Sequential(torch.nn.Linear(4, 2), torch.nn.ReLU()).eval()
        >>> out = tempfile.mkdtemp()
        >>> written = tpu_export.convert(m, (torch.ones(1, 4),), out_dir=out,
        ...                              targets={"android": {}, "tpu-v6e": {"aot": False}})  # aot: no TPU compile
        >>> sorted(os.path.relpath(p, out) for p in written.values())
        ['android/android.tflite', 'tpu-v6e/model.tpuexp']
        >>> sorted(os.listdir(out))
        ['android', 'summary.json', 'tpu-v6e']

        An ONNX model (built here with ``onnx.helper``; usually an ``.onnx`` path), its batch dim fixed:

        >>> from onnx import TensorProto, helper
        >>> graph = helper.make_graph(
        ...     [helper.make_node("Relu", ["x"], ["y"])], "relu",
        ...     [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        ...     [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])])
        >>> onnx_model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        >>> tpu_export.convert(onnx_model, targets="cpu", out_dir=tempfile.mkdtemp(), dim_sizes={"batch": 1})
        {'cpu': '.../cpu/cpu.tflite'}
    """
    say = progress or (lambda msg: None)
    resolved, opts = _targets_and_options(targets, options)  # unknown names and bad options fail before any work
    mixed = _mixed_targets(resolved, opts, max_rel_err)
    out_dir = os.fspath(out_dir)
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise ConversionError(f"out_dir {out_dir!r} exists and is not a directory")
    backends = {t.backend: _backend(t.backend) for t in resolved}

    t0 = time.perf_counter()
    from tpu_export.converter.onnx import is_onnx

    if is_onnx(module):
        from tpu_export.converter.onnx import capture_inputs

        say("import: ONNX graph -> torch module")
        module, sample_args, dynamic_shapes = capture_inputs(module, sample_args, dynamic_shapes, dim_sizes)
    elif dim_sizes is not None:
        raise TypeError("dim_sizes is for ONNX models (an .onnx path or a ModelProto); give a torch model "
                        "dynamic_shapes instead")
    say("capture: torch.export + core ATen decomposition + shared passes")
    req = SignatureRequest("serving_default", module, sample_args if sample_args is not None else (), sample_kwargs,
                           dynamic_shapes)
    prog = prepare_many([req], strict=strict, enable_x64=enable_x64)
    capture_s = time.perf_counter() - t0

    from tpu_export.converter.support import check_support

    for name, b in backends.items():
        check_support(prog, name, b.is_supported)  # every backend, before anything is written

    earlier = _check_out_dir(out_dir, resolved)
    os.makedirs(out_dir, exist_ok=True)
    # Every target is built in one staging folder inside out_dir; only when all of them (and the summary)
    # are complete are they published, so a failing target leaves out_dir as it was.
    stage = staging_dir(os.path.join(out_dir, _STAGE))
    try:
        # targets converted into out_dir by earlier calls stay listed: their folders are still the tool's
        summary = {"capture_seconds": round(capture_s, 3), "targets": dict(earlier)}
        for t, o in zip(resolved, opts):
            t1 = time.perf_counter()
            say(f"{t.name}: lowering and writing ({t.backend} backend)")
            _say_layout(prog, t, o, say)
            if t.name in mixed:  # written float, then quantized op by op within max_rel_err
                o = dataclasses.replace(o, quant_config=None)
            if _streams(t, o):
                path, info = _write_edge_streamed(prog, t, stage, o, say)
            else:
                path, info = backends[t.backend].write_for_target(prog, t, stage, o, say)
            if t.name in mixed:
                info["mixed_precision"] = _mix(module, sample_args, sample_kwargs, path, mixed[t.name], max_rel_err,
                                               f"{t.name}: ", say)
            summary["targets"][t.name] = {"path": os.path.relpath(path, stage),
                                          "seconds": round(time.perf_counter() - t1, 3),
                                          "bytes": artifact_size(path), **info}
        summary["signatures"] = {
            s.name: {"inputs": [(i.name, list(i.shape), str(i.dtype)) for i in s.inputs],
                     "outputs": [(o.name, list(o.shape), str(o.dtype)) for o in s.outputs]}
            for s in prog.signatures.values()
        }
        summary_bytes = json.dumps(summary, indent=2, default=str).encode()
        say(f"publishing {len(resolved)} target(s) into {out_dir}")
        _publish(stage, out_dir, [t.name for t in resolved])
        write_file(os.path.join(out_dir, "summary.json"), summary_bytes)
    finally:
        discard(stage)
    return {t.name: os.path.join(out_dir, summary["targets"][t.name]["path"]) for t in resolved}


def _mixed_targets(resolved, opts, max_rel_err) -> dict:
    """{target name: scheme} of the edge targets max_rel_err applies to; checked before any work."""
    if max_rel_err is None:
        return {}
    from tpu_export.explore.mixed import SCHEMES as weight_schemes

    if isinstance(max_rel_err, bool) or not isinstance(max_rel_err, (int, float)) or not max_rel_err > 0:
        raise ValueError(f"max_rel_err must be a positive number, got {max_rel_err!r}")
    mixed = {}
    for t, o in zip(resolved, opts):
        qc = getattr(o, "quant_config", None)
        scheme = getattr(qc, "scheme", qc)
        if t.backend != "edge" or scheme is None:
            continue
        if scheme not in weight_schemes or not _plain_edge(t) or getattr(qc, "recipe", None) is not None:
            raise ValueError(f"max_rel_err: target {t.name} with quant_config {scheme!r}: the mixed precision search "
                             f"takes the weight schemes ({', '.join(weight_schemes)}) on android, ios and cpu")
        mixed[t.name] = scheme
    if not mixed:
        raise ValueError("max_rel_err applies to edge targets quantized with a weight scheme; give quant_config "
                         "(e.g. quant_config='dynamic_int8') to an android, ios or cpu target")
    return mixed


def _mix(module, sample_args, sample_kwargs, path, scheme, max_rel_err, prefix, say) -> dict:
    """The staged float .tflite at ``path`` replaced by its mixed-precision quantization; the report as a dict."""
    from tpu_export.explore.mixed import mixed_precision

    args = sample_args if isinstance(sample_args, tuple) else (() if sample_args is None else (sample_args,))
    _, report = mixed_precision(module, path, args, sample_kwargs, max_rel_err=max_rel_err, scheme=scheme,
                                out=path)
    for line in report.summary().splitlines():
        say(prefix + line)
    return report.as_dict()


def _say_layout(prog, t, opts, say) -> None:
    """Where an edge target lays image tensors out NHWC at the boundary (android, ios, iot by default), say which
    and how to keep torch's layout: the same model's files differ by target there, and a caller feeding NCHW
    would otherwise learn it from a shape error."""
    if t.backend != "edge" or not opts.channel_last_for(t):
        return
    from tpu_export.targets.mobile import channel_last_io

    for sig_name, (ins, outs) in channel_last_io(prog).items():
        sig = prog.signatures[sig_name]
        names = [f"input {sig.inputs[i].name!r}" for i in ins] + [f"output {sig.outputs[i].name!r}" for i in outs]
        if names:
            where = "" if len(prog.signatures) == 1 else f" (signature {sig_name!r})"
            listed = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
            verb = "is" if len(names) == 1 else "are"
            say(f"{t.name}: {listed}{where} {verb} NHWC in the .tflite (this target's default; "
                f"channel_last_io=False keeps torch's NCHW)")


_STAGE = "convert"  # staging folder: out_dir/.convert.tmp-<pid>-*


def _streams(t, opts) -> bool:
    """A float .tflite whose package is the file alone (android, ios, cpu): written straight to disk.
    Targets with their own I/O check, package files or int8 step (web, iot), and quantized models,
    keep the bytes path (their steps read the whole flatbuffer)."""
    return _plain_edge(t) and opts.quant_config is None and opts.calibration_data is None


def _plain_edge(t) -> bool:
    """An edge target whose package is the .tflite alone (android, ios, cpu): no I/O check, package files or
    finishing step of its own (web, iot have them)."""
    if t.backend != "edge":
        return False
    from tpu_export.targets.registry import EdgeTarget

    return all(getattr(type(t), h) is getattr(EdgeTarget, h) for h in ("finish", "package_files", "check_io"))


def _write_edge_streamed(prog, t, stage: str, opts, say) -> tuple[str, dict]:
    """The float .tflite streamed into the staged target folder (weights written from where they live, the
    large-model form past 2 GiB, so a model of any size converts), then its delegate checks on a read-only
    map of the file: the same file, report and summary entry as the bytes path, without the model in memory."""
    from tpu_export.edge.tflite_check import map_tflite
    from tpu_export.targets.compat import compatibility
    from tpu_export.targets.mobile import write_edge

    name = opts.name or t.name
    os.makedirs(os.path.join(stage, t.name), exist_ok=True)
    path = write_edge(prog, os.path.join(stage, t.name, f"{name}.tflite"), channel_last=opts.channel_last_for(t),
                      progress=say)
    data = map_tflite(path, check=True)
    try:
        reports = [compatibility(data, t, delegate=d) for d in t.delegates]
    finally:
        data.close()
    info = {"files": [f"{name}.tflite"], "compatibility": {}}
    for d, rep in zip(t.delegates, reports):
        say(rep.summary())
        info["compatibility"][d] = {"accelerated": rep.accelerated_count, "fallback": rep.fallback,
                                    "total": rep.total}
    if opts.strict_ops:
        for rep in reports:
            rep.raise_if_fallback()
    return path, info


def _targets_and_options(targets, shared: dict) -> tuple[list, list]:
    """[Target], [its checked options] from a name, a list of names or {name: options}."""
    from tpu_export.targets import get_target, options_for
    from tpu_export.targets.options import split_shared

    if isinstance(targets, str):
        targets = [targets]
    own = dict(targets) if isinstance(targets, dict) else {}
    names = list(targets)
    resolved = [get_target(t) for t in names]  # unknown names fail here, before any work
    if not resolved:
        raise ValueError("targets is empty; name at least one (see `tpu-export targets`)")
    seen = [t.name for t in resolved]
    twice = sorted({n for n in seen if seen.count(n) > 1})
    if twice:
        raise ValueError(f"target(s) {', '.join(twice)} named twice; name each target once")
    opts = []
    for t, name, common in zip(resolved, names, split_shared(resolved, shared)):
        mine = own.get(name)
        if mine is not None and not isinstance(mine, dict):  # the target's options dataclass, taken whole
            if common:
                raise TypeError(f"target {t.name!r} has its options as {type(mine).__name__}; put the shared "
                                f"option(s) {', '.join(sorted(common))} in it")
            opts.append(options_for(t, mine))
            continue
        opts.append(options_for(t, {**common, **(mine or {})}))
    for t, o in zip(resolved, opts):
        if getattr(o, "slots", None) is not None:
            raise ValueError(f"target {t.name!r}: option slots is for convert_lm (an LM's decode_slots); convert "
                             "exports no KV cache: drop it")
    return resolved, opts


def _check_out_dir(out_dir: str, targets) -> dict:
    """Each target replaces its own folder in out_dir: only a folder this tool wrote (listed in out_dir's
    summary.json) or an empty one is ever replaced, checked before any work is written. Returns the
    summary entries of the other targets listed there whose folders still exist."""
    listed = {}
    try:
        with open(os.path.join(out_dir, "summary.json"), "rb") as f:
            data = json.loads(f.read(16 << 20))
        listed = {k: v for k, v in data["targets"].items()
                  if isinstance(v, dict) and isinstance(v.get("path"), str) and v["path"].split("/")[0] == k}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass
    for t in targets:
        d = os.path.join(out_dir, t.name)
        if not os.path.lexists(d) or t.name in listed:
            continue
        if os.path.isdir(d) and not os.path.islink(d) and not os.listdir(d):
            continue
        raise ConversionError(f"refusing to replace {d}: it exists and was not written by tpu-export (not listed in "
                              f"{os.path.join(out_dir, 'summary.json')}). Fix: choose another out_dir or remove it.")
    names = {t.name for t in targets}
    return {k: v for k, v in listed.items() if k not in names and os.path.isdir(os.path.join(out_dir, k))}


def _publish(stage: str, out_dir: str, names: list[str]) -> None:
    """Move each staged target folder into out_dir; if one cannot be moved, put back those already moved."""
    done = []
    try:
        for name in names:
            done.append((name, publish_dir(os.path.join(stage, name), os.path.join(out_dir, name), keep_old=True)))
    except BaseException:
        for name, old in reversed(done):
            dest = os.path.join(out_dir, name)
            if old is None:
                discard(dest)
            else:
                publish_dir(old, dest)
        raise
    for _, old in done:
        if old is not None:
            discard(old)
