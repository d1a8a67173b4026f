"""Per-step figures of a compiled LLM artifact (converter.llm's cache protocol) from XLA's cost analysis.

decode: the bytes a step accesses per generated token against the lower bound (every stored weight read once,
an embedding table only by the batch's rows, plus the KV cache read at the cache length the step was compiled for,
plus the new token's K/V written), their ratio, and the tokens/s per chip those bytes imply at the chip's HBM
bandwidth (a decode step is memory bound). Two counts of the bytes: XLA's cost analysis, and the HBM traffic counted
from the compiled HLO's memory spaces (tpu_backend/llm/hbm.py says why XLA's figure counts a weight several times).
The compiled step has static shapes, so XLA counts the whole cache: the figures are those of the last step (the
cache full). The decode kernel reads only the slots up to the position, so earlier steps read less.

prefill_<L>: the model FLOPs (export_lm counts them from the graph: matmuls, causal attention), XLA's FLOPs and
bytes, the step time at the roofline (max of XLA's FLOPs at the bf16 peak and the HBM traffic at the bandwidth) and
MFU = model FLOPs / (that time x peak), so work the program wastes (padding, masked attention blocks computed)
lowers it; and the MFU at XLA's own estimated step time (``optimal_seconds``) when XLA knows it. A figure XLA
does not know (zero, negative, missing) is recorded as unknown with the reason, never as a number.
"""

from __future__ import annotations

import math

__all__ = ["lm_report", "cache_inputs", "gathered_only", "unknown"]


def unknown(reason: str) -> dict:
    return {"value": None, "unknown": reason}


def cache_inputs(sig) -> list:
    """The signature's state inputs named ``kv_cache_*`` (an input and an output of the same name and shape)."""
    outs = {s.name: tuple(s.shape) for s in sig.outputs}
    return [s for s in sig.inputs if s.name.startswith("kv_cache_") and outs.get(s.name) == tuple(s.shape)]


def _nbytes(shape, dtype_name) -> int:
    from ..artifact.dtypes import name_to_numpy

    return math.prod(int(d) for d in shape) * name_to_numpy(dtype_name).itemsize


def _cost(d: dict, what: str):
    """A per-chip figure of the report's cost section (its per-device one without chips), or unknown with the
    reason the report gives."""
    v = d.get("per_chip", d.get("per_device", d.get("value")))
    return unknown(d["unknown"]) if v is None and d.get("unknown") else _known(v, what)


def _known(v, what: str):
    if v is None:
        return unknown(f"XLA's cost analysis has no {what}")
    if not v > 0:
        return unknown(f"XLA's cost analysis gave {what} = {v} (not known for this program)")
    return v


def lm_report(bundle, report: dict, chip=None, figures: dict | None = None) -> dict | None:
    """The LLM section of a compiled target's report (``report``: aot.build_report's dict; ``figures``: aot's raw
    figures per signature, for the HBM-traffic estimate), or None when the bundle has no ``decode`` signature with
    ``kv_cache_*`` state or none of its signatures was compiled. Sections for the signatures compiled. Figures
    are per chip (one chip: the whole program)."""
    sigs = report.get("signatures", {})
    dec = bundle.signatures.get("decode")
    if dec is None or not cache_inputs(dec):
        return None
    figures = figures or {}
    chips = report.get("chips_used") or 1
    bw = getattr(chip, "hbm_bandwidth_bytes_per_s", None) if chip else None
    peak = chip.peak_bf16_flops_per_chip if chip else None
    out = {"scope": "per chip; decode at the cache length compiled for (the last step, cache full)",
           "hbm_bandwidth_bytes_per_s": bw, "bandwidth_source": getattr(chip, "bandwidth_source", None)}
    if "decode" in sigs:
        out["decode"] = _decode(bundle, dec, sigs["decode"], figures.get("decode", {}), chips, bw)
    for name in sorted(sigs):
        if name.startswith("prefill_") and name in bundle.signatures:
            model = (getattr(bundle, "lm_info", None) or {}).get("model_flops", {}).get(name)
            out[name] = _prefill(bundle.signatures[name], sigs[name], figures.get(name, {}), model, chips, peak, bw)
    return out if len(out) > 3 else None  # None: none of the LLM's signatures was compiled


def gathered_only(bundle) -> set:
    """Stored weights a step reads only by rows (embedding tables not also used as a matmul), as export_lm
    records them (``bundle.lm_info``); empty when unknown (the lower bound then counts them whole)."""
    names = set((getattr(bundle, "lm_info", None) or {}).get("gathered_only", ()))
    for n in list(names):
        names.update(bundle.quant_parts.get(n, ()))
    return names


def _decode(bundle, sig, entry, fig, chips, bw) -> dict:
    caches = cache_inputs(sig)
    batch, cache_len = int(caches[0].shape[0]), int(caches[0].shape[2])
    rows = gathered_only(bundle)
    weights = gathered = 0
    for w in sig.weight_names:
        t = bundle.weights[w]
        if w in rows:  # one row per token of the batch (a lower bound: rows may repeat)
            gathered += batch * (t.numel() // max(1, t.shape[0])) * t.element_size()
        else:
            weights += t.numel() * t.element_size()
    kv_read = sum(_nbytes(s.shape, s.dtype) for s in caches)
    kv_write = kv_read // cache_len  # one new slot per cache tensor
    lower = (weights + gathered + kv_read + kv_write) / chips
    res = {
        "batch": batch, "cache_len": cache_len, "cache_dtype": caches[0].dtype,
        "lower_bound_bytes_per_step": {"weights": weights / chips, "embedding_rows": gathered / chips,
                                       "kv_cache_read": kv_read / chips, "kv_cache_write": kv_write / chips,
                                       "total": lower},
        "lower_bound_bytes_per_token": lower / batch,
        "tokens_per_s_per_chip_at_lower_bound": batch * bw / lower if bw else _no_bw(),
    }
    xla = entry["cost"]["bytes_accessed"]
    res["xla"] = _per_step(_cost(xla, "bytes accessed"), batch, lower, bw)
    res["xla"]["what"] = ("XLA's cost analysis (bytes accessed): counts each HBM->VMEM prefetch hop of a weight "
                          "(copy/slice start and done, the reading fusion) as its own access")
    hbm = fig.get("hbm_traffic_bytes")
    res["hbm_estimate"] = _per_step(hbm / chips if hbm else unknown("no TPU executable to count HBM traffic from"),
                                    batch, lower, bw)
    res["hbm_estimate"]["what"] = ("HBM reads and writes counted from the optimized HLO's memory spaces "
                                   "(tpu_backend/llm/hbm.py): an estimate from the program's structure")
    return res


def _no_bw():
    return unknown("the chip's HBM bandwidth is not known")


def _per_step(got, batch, lower, bw) -> dict:
    if isinstance(got, dict):
        return {"bytes_per_step": got, "bytes_per_token": got, "ratio_to_lower_bound": got,
                "tokens_per_s_per_chip": got}
    return {"bytes_per_step": got, "bytes_per_token": got / batch, "ratio_to_lower_bound": got / lower,
            "tokens_per_s_per_chip": batch * bw / got if bw else _no_bw()}


def _prefill(sig, entry, fig, model_flops, chips, peak, bw) -> dict:
    tokens = int(sig.inputs[0].shape[0]) * int(sig.inputs[0].shape[1]) if len(sig.inputs[0].shape) == 2 else None
    flops = _cost(entry["cost"]["flops"], "flops")
    xla_bytes = _cost(entry["cost"]["bytes_accessed"], "bytes accessed")
    hbm = fig.get("hbm_traffic_bytes")
    nbytes = hbm / chips if hbm else xla_bytes  # the HBM-traffic count when there is one (see _decode)
    opt = _cost(entry["cost"]["optimal_seconds"], "optimal_seconds")
    model = model_flops / chips if model_flops else unknown("the model FLOPs were not recorded (export_lm does)")
    res = {"tokens": tokens, "model_flops": model, "xla_flops": flops, "xla_bytes_accessed": xla_bytes,
           "hbm_traffic_bytes": hbm / chips if hbm else unknown("no TPU executable to count HBM traffic from"),
           "xla_optimal_seconds": opt, "peak_bf16_flops_per_chip": peak,
           "what": "MFU = model FLOPs / (step time x bf16 peak); step time at the roofline: max(XLA's FLOPs at the "
                   "peak, the HBM traffic (else XLA's bytes) at the bandwidth)"}
    if any(isinstance(v, dict) for v in (flops, nbytes, model)) or not peak or not bw:
        why = "model FLOPs, XLA's FLOPs, the bytes, the bf16 peak or the HBM bandwidth is not known"
        res.update(roofline_seconds=unknown(why), mfu_at_roofline=unknown(why))
    else:
        t = max(flops / peak, nbytes / bw)
        res.update(roofline_seconds=t, bound="compute" if flops / peak >= nbytes / bw else "memory",
                   mfu_at_roofline=model / (t * peak))
    if isinstance(opt, dict):
        res["mfu_at_xla_estimate"] = opt
    elif isinstance(model, dict) or not peak:
        res["mfu_at_xla_estimate"] = unknown("model FLOPs or the bf16 peak is not known")
    else:
        res["mfu_at_xla_estimate"] = model / (opt * peak)
    return res
