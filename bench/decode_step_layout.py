"""Decode steps of bench/serve.py's LM on PJRT CPU (the 32-row ``decode_slots``, the 8-row ``decode_slots_8`` and
the batch-1 ``decode`` the sequential server runs), its linear weights stored [in, out] (``<name>.io``,
tpu_backend.weight_layout: what a cpu-xla artifact stores) against torch's [out, in] (the same program with that layout
switched off), in one process, the two programs alternating so a shared host's drifting load hits both.

    .venv/bin/python bench/decode_step_layout.py [--rounds 5] [--steps 10] [--layers 12] [--hidden 768]

Prints, per layout and signature, the median wall and CPU (process, all threads) milliseconds of one step, and the
load average. Not written to bench/results: the serve bench (bench/serve.py --lm) is the figure of record.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _bundle(prog, spec, in_out: bool, names):
    from tpu_export.tpu_backend import weight_layout
    from tpu_export.tpu_backend.llm import export_lm

    saved = weight_layout._LAYOUTS
    if not in_out:  # torch's [out, in]: the layout plan without its linear entry
        weight_layout._LAYOUTS = tuple(lo for lo in saved if lo.suffix != weight_layout.IO_SUFFIX)
    try:
        bundle, _ = export_lm(prog, spec, platforms=("cpu",), signatures=names)
    finally:
        weight_layout._LAYOUTS = saved
    assert any(w.endswith(".io") for w in bundle.weights) == in_out
    return bundle


def _inputs(sig, rows: int):
    import numpy as np

    rng = np.random.default_rng(0)
    feeds = {}
    for s in sig.inputs:
        shape = [rows if isinstance(d, str) else d for d in s.shape]
        if s.name.startswith("kv_cache"):
            feeds[s.name] = rng.standard_normal(shape).astype(np.float32) * 0.1
        elif "pos" in s.name:
            feeds[s.name] = rng.integers(20, 100, shape).astype(np.int32)
        else:
            feeds[s.name] = rng.integers(4, 32000, shape).astype(np.int32)
    return feeds


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=10, help="steps per timed run")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--slots", type=int, default=32)
    ap.add_argument("--signatures", default="decode_slots,decode_slots_8,decode")
    a = ap.parse_args()

    import jax
    import torch
    import transformers

    from bench.serve import LM
    from tpu_export.converter.llm import prepare_lm

    cfg = transformers.LlamaConfig(**{**LM, "num_hidden_layers": a.layers, "hidden_size": a.hidden,
                                      "intermediate_size": a.hidden * 8 // 3})
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    prog, spec = prepare_lm(model, prefill_lengths=(16,), cache_len=128, slots=a.slots)
    names = a.signatures.split(",")
    programs = {lay: _bundle(prog, spec, lay == "in_out", names).to_program() for lay in ("out_in", "in_out")}
    rows = {n: a.slots if n == "decode_slots" else int(n.rsplit("_", 1)[1]) if n.startswith("decode_slots_") else 1
            for n in names}
    state = {}
    for lay, p in programs.items():
        for n in names:
            sig = p.signature(n)
            feeds = _inputs(sig, rows[n])
            caches = {k: jax.device_put(v) for k, v in feeds.items() if k.startswith("kv_cache")}
            state[lay, n] = (feeds, caches)

    def run(lay, n, steps):
        feeds, caches = state[lay, n]
        args = [v for k, v in feeds.items() if not k.startswith("kv_cache")]
        for _ in range(steps):
            out = programs[lay].run_on_device(*args, signature_name=n, **caches)
            caches = {k: out[k] for k in caches}
        jax.block_until_ready(out)
        state[lay, n] = (feeds, caches)
        return out

    logits = {}
    for (lay, n) in state:  # compile (the first call, and the second, given device caches), warm up
        logits[lay, n] = jax.device_get(run(lay, n, 3)["logits"])
    for n in names:
        diff = float(abs(logits["in_out", n] - logits["out_in", n]).max())  # the same inputs and steps
        print(json.dumps({"signature": n, "max_abs_logit_diff_between_layouts": diff}), flush=True)
    times = {k: ([], []) for k in state}
    for r in range(a.rounds):
        for n in names:
            for lay in (("out_in", "in_out") if r % 2 == 0 else ("in_out", "out_in")):
                w0, c0 = time.perf_counter(), time.process_time()
                run(lay, n, a.steps)
                times[lay, n][0].append((time.perf_counter() - w0) / a.steps * 1e3)
                times[lay, n][1].append((time.process_time() - c0) / a.steps * 1e3)
    res = {f"{n} {lay}": {"wall_ms": statistics.median(w), "cpu_ms": statistics.median(c)}
           for (lay, n), (w, c) in times.items()}
    print(json.dumps({"rows": rows, "median_per_step": res, "loadavg": os.getloadavg()}, indent=1), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
