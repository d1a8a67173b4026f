"""One call, both outputs: capture once, then write an artifact per target.

``convert(model, args, targets=["tpu-v6e", "android"], out_dir=...)`` resolves every target and
checks every backend's op support before writing anything; each artifact is written atomically
by its backend, then a summary.json beside them.
"""

from __future__ import annotations

import json
import os
import time
from typing import Callable

from .errors import ConversionError
from .pipeline import SignatureRequest, prepare_many

__all__ = ["convert", "artifact_size"]


def _backend(name: str):
    # targets/ picks the backend, its options and its checks for each target.
    from targets.backends import BACKENDS

    return BACKENDS[name]


def convert(
    module,
    sample_args=None,
    sample_kwargs=None,
    *,
    targets,
    out_dir,
    dynamic_shapes=None,
    strict="auto",
    enable_x64=False,
    progress: Callable[[str], None] | None = None,
    **options,
) -> dict[str, str]:
    """Capture ``module`` once and write one artifact per target into ``out_dir``.

    Options pass through to the backends: ``topology=``, ``use_pallas=``, ``dtype=``,
    ``quant_config=``, ``calibration_data=``, ``to_channel_last_io=``, ``strict_ops=``.
    Returns {target name: path written}.
    """
    from targets import get_target

    say = progress or (lambda msg: None)
    if isinstance(targets, str):
        targets = [targets]
    resolved = [get_target(t) for t in targets]  # unknown names fail here, before any work
    if not resolved:
        raise ValueError("targets is empty; name at least one (see `tpu-export targets`)")
    out_dir = os.fspath(out_dir)
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise ConversionError(f"out_dir {out_dir!r} exists and is not a directory")
    backends = {t.backend: _backend(t.backend) for t in resolved}
    for t in resolved:
        backends[t.backend].validate_options(t, options)

    t0 = time.perf_counter()
    say("capture: torch.export + core ATen decomposition + shared passes")
    req = SignatureRequest("serving_default", module, sample_args if sample_args is not None else (), sample_kwargs,
                           dynamic_shapes)
    prog = prepare_many([req], strict=strict, enable_x64=enable_x64)
    capture_s = time.perf_counter() - t0

    from .support import check_support

    for name, b in backends.items():
        check_support(prog, name, b.is_supported)  # every backend, before anything is written

    os.makedirs(out_dir, exist_ok=True)
    written, summary = {}, {"capture_seconds": round(capture_s, 3), "targets": {}}
    for t in resolved:
        t1 = time.perf_counter()
        say(f"{t.name}: lowering and writing ({t.backend} backend)")
        path, info = backends[t.backend].write_for_target(prog, t, out_dir, options, say)
        written[t.name] = path
        summary["targets"][t.name] = {"path": os.path.relpath(path, out_dir), "seconds": round(time.perf_counter() - t1, 3),
                                      "bytes": artifact_size(path), **info}
    summary["signatures"] = {
        s.name: {"inputs": [(i.name, list(i.shape), str(i.dtype)) for i in s.inputs],
                 "outputs": [(o.name, list(o.shape), str(o.dtype)) for o in s.outputs]}
        for s in prog.signatures.values()
    }
    tmp = os.path.join(out_dir, ".summary.json.tmp")
    with open(tmp, "w") as f:
        json.dump(summary, f, indent=2, default=str)
    os.replace(tmp, os.path.join(out_dir, "summary.json"))
    return written


def artifact_size(path: str) -> int:
    """Bytes of an artifact: a file, or every file under a directory."""
    if os.path.isdir(path):
        return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)
    return os.path.getsize(path)
