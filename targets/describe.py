"""`tpu-export inspect`: what an artifact holds, for a .tflite, a TPU artifact or a .litertlm alike.

``inspect_data(path)`` is the machine-readable description (``tpu-export inspect --json``); ``describe(path)`` the
short human summary made from it: signatures with their inputs and outputs, sizes, the op histogram, and for a TPU
artifact each compiled target's compile time, cost (FLOPs, bytes accessed) and memory, a figure XLA does not know
shown as ``unknown``.
"""

from __future__ import annotations

import json
import math
import mmap
import os
import re
from collections import Counter

__all__ = ["describe", "describe_tflite", "describe_artifact", "inspect_data", "resolve_artifact"]


def resolve_artifact(path: str) -> str:
    """``path``, or the model file in a target folder that convert / convert-lm wrote (``out/android``:
    its .litertlm, else its one .tflite; ``out/tpu-v6e``: its model.tpuexp)."""
    path = os.fspath(path)
    if not os.path.isdir(path) or os.path.exists(os.path.join(path, "manifest.json")):
        return path
    names = sorted(os.listdir(path))
    for pick in ([n for n in names if n.endswith(".tpuexp")], [n for n in names if n.endswith(".litertlm")],
                 [n for n in names if n.endswith(".tflite")]):
        if len(pick) == 1:
            return os.path.join(path, pick[0])
    targets = [n for n in names if os.path.isdir(os.path.join(path, n))]
    if "summary.json" in names and targets:
        raise FileNotFoundError(f"{path}: the output folder of a conversion; inspect one target in it: "
                                + ", ".join(os.path.join(path, t) for t in targets))
    raise FileNotFoundError(f"{path}: a folder with no model.tpuexp, .litertlm or single .tflite in it (nor a TPU "
                            "artifact's manifest.json)")


def _kind(path: str) -> str:
    if path.endswith(".tflite"):
        return "tflite"
    if path.endswith(".litertlm"):
        return "litertlm"
    return "tpu-artifact"


def inspect_data(path: str, *, isolate: bool = False) -> dict:
    """The description as data (JSON-ready): ``kind`` (tflite, tpu-artifact, litertlm), sizes, signatures and
    the rest of what the kind holds. ``isolate``: parse a TPU artifact's StableHLO in a child process first."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such file or directory")
    kind = _kind(path)
    if kind == "tflite":
        return _tflite_data(path)
    if kind == "litertlm":
        return _litertlm_data(path)
    return _artifact_data(path, isolate=isolate)


def describe(path: str, *, isolate: bool = False) -> str:
    """The human summary. ``isolate``: parse a TPU artifact's StableHLO in a child process first (see
    tpu_backend.load)."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such file or directory")
    kind = _kind(path)
    if kind == "tflite":
        return describe_tflite(path)
    if kind == "litertlm":
        from .lm_describe import describe_litertlm

        return describe_litertlm(path)
    return describe_artifact(path, isolate=isolate)


# ---------------------------------------------------------------------------------------------- .tflite


def _tflite_data(path: str) -> dict:
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
        return _mapped_data(path, data, it)
    finally:
        data.close()


def _mapped_data(path, data, it) -> dict:
    from tpu_export.edge import op_histogram

    from .compat import compatibility
    from .registry import TARGETS

    sigs = {}
    for name in it.get_signature_list():
        runner = it.get_signature_runner(name)
        sigs[name] = {kind: [{"name": tname, "shape": [int(x) for x in d.get("shape_signature", d["shape"])],
                              "dtype": d["dtype"].__name__} for tname, d in details.items()]
                      for kind, details in (("inputs", runner.get_input_details()),
                                            ("outputs", runner.get_output_details()))}
    delegates = {}
    for tname in ("android", "ios", "iot"):
        t = TARGETS[tname]
        for d in t.delegates:
            try:
                rep = compatibility(data, t, delegate=d)
                delegates[f"{tname}/{d}"] = {"accelerated": rep.accelerated_count, "total": rep.total}
            except Exception as e:  # noqa: BLE001 - a report line, never a failure
                delegates[f"{tname}/{d}"] = {"error": str(e)}
    return {"path": path, "kind": "tflite", "bytes": len(data), "signatures": sigs,
            "op_histogram": _sorted_hist(op_histogram(data)), "delegates": delegates}


def _sorted_hist(hist: dict) -> dict:
    return dict(sorted(hist.items(), key=lambda kv: (-kv[1], kv[0])))


def _fmt_hist(hist: dict, indent="    ") -> list[str]:
    return [f"{indent}{k:32s} {v}" for k, v in _sorted_hist(hist).items()]


def _fmt_io(sigs: dict, indent="  ") -> list[str]:
    lines = []
    for name, sig in sigs.items():
        lines.append(f"{indent}signature {name!r}")
        for kind in ("inputs", "outputs"):
            for s in sig[kind]:
                extra = f" sharding={s['sharding']}" if s.get("sharding") else ""
                lines.append(f"{indent}  {kind[:-1]:6s} {s['name']:24s} {s['shape']} {s['dtype']}{extra}")
    return lines


def describe_tflite(path: str) -> str:
    d = _tflite_data(path)
    lines = [f"{path}: LiteRT flatbuffer, {d['bytes']:,} bytes ({_bytes(d['bytes'])})"]
    lines += _fmt_io(d["signatures"])
    lines.append(f"  op histogram ({sum(d['op_histogram'].values())} ops):")
    lines += _fmt_hist(d["op_histogram"])
    for key, rep in d["delegates"].items():
        lines.append(f"  {key}: {rep['error']}" if "error" in rep
                     else f"  {key}: {rep['accelerated']}/{rep['total']} ops accelerated")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------ TPU artifact


def _artifact_data(path: str, *, isolate: bool = False) -> dict:
    from tpu_export import tpu_backend

    from .files import artifact_size

    art = tpu_backend.read_artifact(path, isolate=isolate)
    m = art.manifest
    sigs = {}
    for name, sig in art.signatures.items():
        entry = {"inputs": [s.to_json() for s in sig.inputs], "outputs": [s.to_json() for s in sig.outputs]}
        text = sig.exported.mlir_module()
        entry["stablehlo_ops"] = _sorted_hist(Counter(re.findall(r"\b(stablehlo\.[a-z_]+|tpu_custom_call)", text)))
        sigs[name] = entry
    return {
        "path": path, "kind": "tpu-artifact", "format_version": m["format_version"], "bytes": artifact_size(path),
        "platforms": list(m["platforms"]), "created_by": m.get("created_by", {}),
        "weights": {"count": len(art.weights),
                    "bytes": sum(getattr(w, "nbytes", 0) for w in art.weights.values())},
        "quant": m.get("quant"),
        "signatures": sigs,
        "compiled": dict(art.reports()),
    }


def describe_artifact(path: str, *, isolate: bool = False) -> str:
    d = _artifact_data(path, isolate=isolate)
    w = d["weights"]
    made = ", ".join(f"{k} {v}" for k, v in d["created_by"].items())
    lines = [f"{path}: TPU artifact format {d['format_version']}, {d['bytes']:,} bytes ({_bytes(d['bytes'])})",
             f"  weights: {w['count']} tensors, {w['bytes']:,} bytes ({_bytes(w['bytes'])})",
             f"  platforms: {', '.join(d['platforms'])}" + (f"; made with {made}" if made else "")]
    if d["quant"]:
        q = d["quant"]
        lines.append(f"  quantized: {q['scheme']}, {len(q['weights'])} weights as int8 + per-channel scales")
    lines += _fmt_io(d["signatures"])
    for name, sig in d["signatures"].items():
        ops = sig["stablehlo_ops"]
        lines.append(f"  StableHLO op histogram of {name!r} ({sum(ops.values())} ops):")
        lines += _fmt_hist(ops)
    if not d["compiled"]:
        lines.append("  compiled: none (a TPU host compiles the StableHLO when it loads it)")
    for key, rep in d["compiled"].items():
        lines += _fmt_compiled(key, rep)
    return "\n".join(lines)


def _fmt_compiled(key: str, rep: dict) -> list[str]:
    where = [rep.get("device_kind")]
    if rep.get("chips_used") is not None:
        where.append(f"{rep['chips_used']} chip{'s' if rep['chips_used'] != 1 else ''}")
    if rep.get("devices_used") is not None:
        where.append(f"{rep['devices_used']} device{'s' if rep['devices_used'] != 1 else ''}")
    libtpu = (rep.get("versions") or {}).get("libtpu")
    if libtpu:
        where.append(f"libtpu {libtpu}")
    lines = [f"  compiled {key} ({', '.join(str(x) for x in where if x)}):"]
    for name, s in (rep.get("signatures") or {}).items():
        cache = f", cache {s['compile_cache']}" if s.get("compile_cache") else ""
        exe = f", executable {_bytes(s['executable_bytes'])}" if s.get("executable_bytes") is not None else ""
        took = _num(s.get("compile_seconds"))
        lines.append(f"    {name}: compiled in {'unknown' if took is None else f'{took:.2f} s'}{cache}{exe}")
        cost = s.get("cost") or {}
        lines.append(f"      flops {_count(_num(cost.get('flops')))}, transcendentals "
                     f"{_count(_num(cost.get('transcendentals')))}, bytes accessed "
                     f"{_bytes(_num(cost.get('bytes_accessed')))} (per chip)")
        hbm, mem = s.get("hbm") or {}, s.get("memory") or {}
        peak, avail = _num(hbm.get("needed_bytes_per_device")), _num(hbm.get("available_bytes_per_device"))
        share = f" of {_bytes(avail)} HBM ({100 * peak / avail:.2g}%)" if peak is not None and avail else ""
        parts = ", ".join(f"{k.replace('_bytes', '').replace('_', ' ')} {_bytes(_num(v))}" for k, v in mem.items())
        lines.append(f"      peak memory {_bytes(peak)} per device{share}" + (f": {parts}" if parts else ""))
        roof = s.get("roofline") or {}
        best = roof.get("xla_bytes") if isinstance(roof.get("xla_bytes"), dict) else {}
        bound = f" ({best['bound']} bound)" if best.get("bound") else ""
        lines.append(f"      step time: XLA estimate {_secs(_num(cost.get('optimal_seconds')))}, roofline "
                     f"{_secs(_num(best.get('seconds')))}{bound}")
    if rep.get("llm"):
        lines.append("    LLM figures (report.json's llm section; per chip):")
        text = json.dumps(_plain(rep["llm"]), indent=2, default=str)
        lines += ["      " + line for line in text.splitlines()[1:-1]]
    return lines


def _plain(v):
    """The report's figures for a reader: the prose (what / scope / sources) left out, and a figure XLA does not
    know ({"value": None, "unknown": why}, a negative or non-finite number) as "unknown"."""
    if isinstance(v, dict):
        if "unknown" in v and v.get("value", v.get("per_device")) is None:
            return "unknown"
        return {k: _plain(x) for k, x in v.items() if k not in ("what", "scope", "sources", "bandwidth_source")}
    if isinstance(v, list):
        return [_plain(x) for x in v]
    if isinstance(v, float) and (not math.isfinite(v) or v < 0):
        return "unknown"
    return v


def _num(v):
    """A report figure as a number, or None when it is not known: a scoped figure (per chip, else per device,
    else its value), None, a negative or non-finite number (XLA's "unknown"), or a string."""
    if isinstance(v, dict):
        for k in ("per_chip", "per_device", "value", "whole_program"):
            if k in v:
                return _num(v[k])
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return v if math.isfinite(v) and v >= 0 else None


def _bytes(n) -> str:
    if n is None:
        return "unknown"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{int(n)} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover - the loop returns


def _count(n) -> str:
    if n is None:
        return "unknown"
    if n < 1e4:
        return f"{n:g}"
    for scale, unit in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if n >= scale:
            return f"{n / scale:.3g}{unit}"
    return f"{n:g}"  # pragma: no cover


def _secs(s) -> str:
    if s is None:
        return "unknown"
    for scale, unit in ((1, "s"), (1e-3, "ms"), (1e-6, "us"), (1e-9, "ns")):
        if s >= scale:
            return f"{s / scale:.3g} {unit}"
    return f"{s / 1e-9:.3g} ns"


# ------------------------------------------------------------------------------------------------ .litertlm


def _litertlm_data(path: str) -> dict:
    from tpu_export.edge.litertlm import read_litertlm

    info = read_litertlm(path)
    sections = []
    for sec in info["sections"]:
        entry = {k: v for k, v in sec.items()}
        entry["bytes"] = sec["end"] - sec["begin"]
        if sec["type"] == "TFLiteModel":
            entry["signatures"] = _section_signatures(path, sec["begin"], sec["end"])
        sections.append(entry)
    out = {k: v for k, v in info.items() if k != "sections"}
    return {"path": path, "kind": "litertlm", "bytes": os.path.getsize(path), **out, "sections": sections}


def _section_signatures(path: str, begin: int, end: int) -> dict:
    from tpu_export.converter.untrusted import open_regular

    from .tflite_io import signatures

    # a view of the section, not a copy of it (as lm_describe reads it)
    fd, _ = open_regular(path, what="the bundle")
    with os.fdopen(fd, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm, memoryview(mm) as whole:
        with whole[begin:end] as section:
            sigs = signatures(section)
            return {name: {kind: [{"name": s.name, "shape": list(s.shape), "dtype": s.dtype} for s in specs]
                           for kind, specs in (("inputs", ins), ("outputs", outs))}
                    for name, (ins, outs) in sorted(sigs.items())}
