"""The LLM TPU figures on the v6e cost model: a Llama-style ~1B model (random init, bf16) exported with its KV
cache (prefill_<L> at batch B, decode at cache C), AOT-compiled for one v6e chip through libtpu on this host, and
tpu_backend.llm's report: bytes per decode token against the lower bound (goal <= 1.2x) and prefill MFU (goal >= 50%).

    .venv/bin/python bench/llm_tpu.py [--layers 16] [--batch 8] [--prefill 2048] [--cache 4096] [--no-pallas]

The model is transformers' LlamaForCausalLM built directly in bfloat16 (hidden 2048, 32 heads / 8 kv heads, head
dim 64, intermediate 8192, vocab 32000; 16 layers by default: ~1.1 B parameters, 2.2 GB), captured with bf16 caches
(converter.llm.KVCacheLM(dtype=bfloat16)), so its logits are bf16 too. Nothing runs: the figures are XLA's cost
analysis of the v6e executables (tpu_backend/llm/report.py says how each is derived).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--prefill", type=int, default=2048)
    ap.add_argument("--cache", type=int, default=4096)
    ap.add_argument("--no-pallas", action="store_true", help="plain XLA attention on TPU too")
    ap.add_argument("--json", help="write the report's llm section here")
    a = ap.parse_args()
    from tpu_export.tpu_backend.aot import prepare_cpu_host

    prepare_cpu_host()
    import warnings

    warnings.simplefilter("ignore")
    import torch
    import transformers

    from tpu_export.converter.llm import KVCacheLM, lm_requests
    from tpu_export.converter.pipeline import prepare_many
    from tpu_export.tpu_backend.llm import export_lm

    times = {}
    t0 = time.perf_counter()
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=8192,
                                   num_hidden_layers=a.layers, num_attention_heads=32, num_key_value_heads=8,
                                   max_position_embeddings=max(8192, a.cache))
    torch.set_default_dtype(torch.bfloat16)  # built in bf16: half the host memory of a float32 build
    try:
        hf = transformers.LlamaForCausalLM(cfg).eval()
    finally:
        torch.set_default_dtype(torch.float32)
    params = sum(p.numel() for p in hf.parameters())
    times["build_s"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    lm = KVCacheLM(hf, a.cache, dtype=torch.bfloat16, batch=a.batch).eval()
    with torch.no_grad():
        prog = prepare_many(lm_requests(lm, (a.prefill,)))
    times["capture_s"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    bundle, spec = export_lm(prog, lm.spec, dtype="bfloat16", platforms=("tpu",),
                             use_pallas=not a.no_pallas, generation="v6e")
    times["export_s"] = time.perf_counter() - t0

    compile_s, full = {}, {}
    for name in bundle.signatures:  # one at a time: each compile's figures are kept, its executable dropped
        t0 = time.perf_counter()
        compiled = bundle.compile_for("tpu-v6e", signatures=[name])
        compile_s[name] = time.perf_counter() - t0
        full.update(compiled.report["llm"])
        bundle.compiled.clear()

    print(f"model: Llama-style, {a.layers} layers, hidden 2048, 32/8 heads, vocab 32000: {params / 1e9:.3f} B params "
          f"(bf16); batch {a.batch}, prefill_{a.prefill}, cache {a.cache}, Pallas {'off' if a.no_pallas else 'on'}")
    print("times: " + ", ".join(f"{k} {v:.1f} s" for k, v in times.items()) + "; compile for v6e: "
          + ", ".join(f"{k} {v:.1f} s" for k, v in compile_s.items()))
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB")
    dec = full["decode"]
    lb = dec["lower_bound_bytes_per_step"]
    print(f"decode (per step of {dec['batch']} tokens, cache {dec['cache_len']} {dec['cache_dtype']}): lower bound "
          f"{_gb(lb['total'])} (weights {_gb(lb['weights'])} + embedding rows {_gb(lb['embedding_rows'])} + KV read "
          f"{_gb(lb['kv_cache_read'])}) -> {_num(dec['tokens_per_s_per_chip_at_lower_bound'])} tokens/s per chip")
    for count in ("xla", "hbm_estimate"):
        d = dec[count]
        print(f"  {count:12s}: {_gb(d['bytes_per_step'])} per step, ratio {_num(d['ratio_to_lower_bound'])} (goal "
              f"<= 1.2), {_num(d['tokens_per_s_per_chip'])} tokens/s per chip at 1638 GB/s")
    for name, p in full.items():
        if name.startswith("prefill_"):
            print(f"{name} (batch {a.batch}): model {_num(p['model_flops'], 1e12)} TFLOP, XLA "
                  f"{_num(p['xla_flops'], 1e12)} TFLOP; bytes: XLA {_gb(p['xla_bytes_accessed'])}, HBM estimate "
                  f"{_gb(p['hbm_traffic_bytes'])}; roofline {_num(p['roofline_seconds'], 1e-3)} ms "
                  f"({p.get('bound', '?')} bound) -> MFU {_pct(p['mfu_at_roofline'])} (goal >= 50%); at XLA's "
                  f"estimated time: {_pct(p['mfu_at_xla_estimate'])}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"args": vars(a), "times": times, "compile_s": compile_s, "llm": full}, f, indent=1)


def _gb(v):
    return v["unknown"] if isinstance(v, dict) else f"{v / 1e9:.3f} GB"


def _num(v, unit=1.0):
    return v["unknown"] if isinstance(v, dict) else f"{v / unit:,.2f}"


def _pct(v):
    return v["unknown"] if isinstance(v, dict) else f"{100 * v:.1f}%"


if __name__ == "__main__":
    main()
