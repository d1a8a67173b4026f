"""An LLM Program (converter.llm.prepare_lm) -> TPU artifact: donated caches, float32 / bfloat16 / int8 weights."""

from __future__ import annotations

import dataclasses

import torch

from ..export import ExportError, donated_inputs, export_program

__all__ = ["export_lm", "LM_DTYPES"]

LM_DTYPES = (None, "float32", "bfloat16")


def export_lm(prog, spec, *, dtype: str | None = None, quant=None, platforms=("tpu", "cpu"), use_pallas=False,
              generation: str | None = None, **kw):
    """Export every signature of ``prog`` (prefill_<L> and decode, from converter.llm.prepare_lm) and return
    ``(bundle, spec)``, ``spec`` the CacheSpec the artifact's caches have (bf16 under dtype="bfloat16").

    dtype: None / "float32", or "bfloat16": weights and compute bf16 and the caches stored bf16 (half the bytes a
        decode step reads), logits float32;
    quant: None or "int8" / "weight_only_int8" (tpu_backend.quant: linear and embedding weights int8 + scales);
    use_pallas / generation: as ``export_program`` (the decode signature takes the flash-decoding kernel on TPU).
    Every ``kv_cache_*`` input is donated: the exported module aliases it to its output (checked here)."""
    if dtype not in LM_DTYPES:
        raise ExportError(f"LLM dtype {dtype!r} is not supported; choose from {[d for d in LM_DTYPES if d]}")
    dtype = None if dtype == "float32" else dtype
    if dtype == "bfloat16":
        prog, spec = _bf16_caches(prog, spec), dataclasses.replace(spec, dtype=torch.bfloat16)
    bundle = export_program(prog, platforms=platforms, dtype=dtype, quant=quant, use_pallas=use_pallas,
                            generation=generation, **kw)
    names = set(spec.names())
    for sig in bundle.signatures.values():
        donated = donated_inputs(sig.exported, len(sig.weight_names))
        missed = sorted(s.name for i, s in enumerate(sig.inputs) if s.name in names and i not in donated)
        if missed:
            raise ExportError(f"signature {sig.name!r}: caches {missed} are not aliased to their outputs; each must "
                              f"be an input and an output of the same name, shape and dtype")
    # for the report's lower bound: tables a step reads only by rows (embedding lookups)
    # and the model FLOPs of each step (what MFU counts: no padding, no masked attention work)
    bundle.lm_info = {"gathered_only": sorted(_gathered_only(prog, bundle.signatures)),
                      "model_flops": {n: _model_flops(prog.signatures[n]) for n in bundle.signatures}}
    return bundle, spec


def _model_flops(sig) -> int:
    """2 x multiply-adds of the step's matmuls (linear / mm / bmm, from the captured shapes), and its attention:
    a prefill of T tokens from slot 0 attends causally (T (T + 1) / 2 query-key pairs per head), a decode token to
    the whole cache (the last step's figure). 4 FLOPs per pair and channel: QK^T and PV."""
    aten = torch.ops.aten
    total = 0
    for n in sig.graph.nodes:
        val = n.meta.get("val")
        if n.op != "call_function" or not isinstance(val, torch.Tensor):
            continue
        if n.target is aten.linear.default:
            w = n.args[1].meta["val"]
            total += 2 * (val.numel() // w.shape[0]) * w.numel()
        elif n.target in (aten.mm.default, aten.bmm.default, aten.matmul.default):
            k = n.args[0].meta["val"].shape[-1]
            total += 2 * val.numel() * k
        elif n.target is aten.scaled_dot_product_attention.default:
            b, hq, t, d = val.shape
            s = n.args[1].meta["val"].shape[-2]
            pairs = s if t == 1 else t * (t + 1) // 2
            total += 4 * b * hq * d * pairs
    return int(total)


def _gathered_only(prog, names) -> set:
    """Program weights whose every use, in every signature, is the table of an aten.embedding."""
    emb = torch.ops.aten.embedding.default
    seen, other = set(), set()
    for n in names:
        sig = prog.signatures[n]
        for node, w in zip(sig.weight_nodes(), sig.weight_names):  # placeholders come in weight_names' order
            for u in node.users:
                (seen if u.target is emb and u.args[0] is node else other).add(w)
    return seen - other


def _bf16_caches(prog, spec):
    """The program with its cache inputs and outputs declared bfloat16 (same graphs, same weights): under
    dtype="bfloat16" the lowering computes in bf16 anyway, so the caches cross the boundary at that size."""
    names = set(spec.names())
    names |= {f"new_{n}" for n in names}  # insert_slot's batch-1 caches (converter/llm.py)

    def bf16(specs):
        return [dataclasses.replace(s, dtype=torch.bfloat16) if s.name in names else s for s in specs]

    sigs = {n: dataclasses.replace(s, inputs=bf16(s.inputs), outputs=bf16(s.outputs))
            for n, s in prog.signatures.items()}
    return dataclasses.replace(prog, signatures=sigs)
