"""The conversion flow's hook for edge targets: converter.convert's backend protocol over targets.package.

converter/multi_target.py (converter.convert) calls ``BACKENDS["edge"].write_for_target(prog, target, out_dir, options, say)``
and expects ``(path, info)``; targets.backends.EdgeBackend forwards to ``write_edge_target`` below.
"""

from __future__ import annotations

import os

from .registry import get_target

__all__ = ["write_edge_target", "EDGE_OPTIONS"]

# converter.convert / CLI option names this hook understands (others belong to the TPU backend).
EDGE_OPTIONS = {"to_channel_last_io", "strict_ops", "quant_config", "calibration_data", "verify_inputs",
                "flash_kib", "ram_kib", "fp16_weights", "name"}
_TPU_ONLY = {"topology", "use_pallas", "dtype"}


def write_edge_target(prog, target, out_dir: str, options: dict, say=None) -> tuple[str, dict]:
    """Package ``prog`` for an edge target into ``out_dir``; returns (main .tflite path, info for summary.json)."""
    from .checks import package
    from .compat import compatibility

    t = get_target(target)
    say = say or (lambda msg: None)
    opts = {k: v for k, v in options.items() if k not in _TPU_ONLY}
    unknown = set(opts) - EDGE_OPTIONS
    if unknown:
        raise TypeError(f"target {t.name!r} does not take option(s) {', '.join(sorted(unknown))}")
    kw = {"name": opts.pop("name", t.name)}
    if "to_channel_last_io" in opts:
        kw["channel_last"] = opts.pop("to_channel_last_io")
    strict = bool(opts.pop("strict_ops", False))
    # quant_config / calibration_data: package() checks the scheme against the target's runtime
    for k in ("quant_config", "calibration_data", "fp16_weights"):
        if k in opts:
            kw[k] = opts.pop(k)
    if t.name == "iot":
        for k in ("verify_inputs", "flash_kib", "ram_kib"):
            if k in opts:
                kw[k] = opts.pop(k)
    if opts:
        raise TypeError(f"target {t.name!r} does not take option(s) {', '.join(sorted(opts))}")
    sub = os.path.join(out_dir, t.name)
    written = package(t, prog, sub, strict=strict, say=say, **kw)
    main = next(p for f, p in written.items() if f.endswith(".tflite"))
    with open(main, "rb") as f:
        tflite = f.read()
    info = {"files": sorted(written), "compatibility": {}}
    for d in t.delegates:
        rep = compatibility(tflite, t, delegate=d)
        info["compatibility"][d] = {"accelerated": rep.accelerated_count, "fallback": rep.fallback, "total": rep.total}
    return main, info
