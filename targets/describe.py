"""`tpu-export inspect`: what an artifact holds, for a .tflite or a TPU artifact alike."""

from __future__ import annotations

import json
import os
import re
from collections import Counter

__all__ = ["describe", "describe_tflite", "describe_artifact"]


def describe(path: str, *, isolate: bool = False) -> str:
    """``isolate``: parse a TPU artifact's StableHLO in a child process first (see tpu_backend.load)."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such file or directory")
    return describe_tflite(path) if path.endswith(".tflite") else describe_artifact(path, isolate=isolate)


def _fmt_hist(hist: dict, indent="    ") -> list[str]:
    return [f"{indent}{k:32s} {v}" for k, v in sorted(hist.items(), key=lambda kv: (-kv[1], kv[0]))]


def describe_tflite(path: str) -> str:
    from ai_edge_litert.interpreter import OpResolverType

    from tpu_export.edge.tflite_check import map_tflite, open_interpreter

    # Mapped, not read: a multi-GB model costs no memory to describe (only its tables are touched).
    # A regular file, checked first: the interpreter trusts the flatbuffer (a bad one crashes it).
    data = map_tflite(path, check=True)
    try:
        # The interpreter maps the file too; without the default XNNPACK delegate it never
        # repacks the weights (which would copy every one) just to list the signatures.
        it = open_interpreter(path, path=path,
                              experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
        return _describe_mapped(path, data, it)
    finally:
        data.close()


def _describe_mapped(path, data, it) -> str:
    from tpu_export.edge import op_histogram

    from .compat import compatibility
    from .registry import TARGETS

    lines = [f"{path}: LiteRT flatbuffer, {len(data):,} bytes"]
    for name in it.get_signature_list():
        runner = it.get_signature_runner(name)
        lines.append(f"  signature {name!r}")
        for kind, details in (("input", runner.get_input_details()), ("output", runner.get_output_details())):
            for tname, d in details.items():
                shape = [int(x) for x in d.get("shape_signature", d["shape"])]
                lines.append(f"    {kind:6s} {tname:24s} {shape} {d['dtype'].__name__}")
    lines.append("  op histogram:")
    lines += _fmt_hist(op_histogram(data))
    for tname in ("android", "ios", "iot"):
        t = TARGETS[tname]
        for d in t.delegates:
            try:
                rep = compatibility(data, t, delegate=d)
                lines.append(f"  {tname}/{d}: {rep.accelerated_count}/{rep.total} ops accelerated")
            except Exception as e:  # noqa: BLE001 - a report line, never a failure
                lines.append(f"  {tname}/{d}: {e}")
    return "\n".join(lines)


def describe_artifact(path: str, *, isolate: bool = False) -> str:
    from tpu_export import tpu_backend

    from .files import artifact_size

    art = tpu_backend.read_artifact(path, isolate=isolate)
    m = art.manifest
    size = artifact_size(path)
    wbytes = sum(getattr(w, "nbytes", 0) for w in art.weights.values())
    lines = [f"{path}: TPU artifact format {m['format_version']}, {size:,} bytes "
             f"(weights {wbytes:,} bytes in {len(art.weights)} tensors)",
             f"  platforms {m['platforms']}; made with {json.dumps(m.get('created_by', {}))}"]
    if m.get("quant"):
        q = m["quant"]
        lines.append(f"  quantized: {q['scheme']}, {len(q['weights'])} weights as int8 + per-channel scales")
    for name, sig in art.signatures.items():
        lines.append(f"  signature {name!r}")
        for kind, specs in (("input", sig.inputs), ("output", sig.outputs)):
            for s in specs:
                extra = f" sharding={s.to_json()['sharding']}" if s.sharding else ""
                lines.append(f"    {kind:6s} {s.name:24s} {list(s.shape)} {s.dtype}{extra}")
        text = sig.exported.mlir_module()
        hist = Counter(re.findall(r"\b(stablehlo\.[a-z_]+|tpu_custom_call)", text))
        lines.append("    StableHLO op histogram:")
        lines += _fmt_hist(dict(hist), indent="      ")
    for key, rep in art.reports().items():
        lines.append(f"  compiled {key}:")
        lines.append("    " + json.dumps(rep, indent=2, default=str).replace("\n", "\n    "))
    return "\n".join(lines)
