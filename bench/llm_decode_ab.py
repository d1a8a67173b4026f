"""A/B of the decode cost of two .litertlm bundles in the LiteRT-LM engine (1 CPU thread): each run in a fresh
process, the two alternating (order flipped every block); per token: CPU ms of the process during run_decode
(time.process_time: all its threads; unlike wall time it does not count the time other processes on a shared host
held the core), wall ms, and the engine's own benchmark figure.

    .venv/bin/python bench/llm_decode_ab.py OURS.litertlm PEER.litertlm [BLOCKS]

bench/llm.py writes both bundles (--keep DIR keeps them). Prints medians and the per-block ratios A/B.
"""
from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time


def worker(bundle, decode):
    import litert_lm
    litert_lm.set_min_log_severity(litert_lm.LogSeverity.ERROR)
    eng = litert_lm.Engine(bundle, backend=litert_lm.Backend.CPU(thread_count=1), enable_benchmark=True)
    s = eng.create_session(apply_prompt_template=False, max_output_tokens=decode,
                           sampler_config=litert_lm.SamplerConfig(top_k=1, temperature=0.0))
    s.run_prefill([" ".join(f"t{100 + 37 * i}" for i in range(24))])
    c0, w0 = time.process_time(), time.perf_counter()
    s.run_decode()
    c1, w1 = time.process_time(), time.perf_counter()
    info = s.get_benchmark_info()
    n = info.last_decode_token_count
    print(json.dumps({"cpu_ms": (c1 - c0) * 1e3 / n, "wall_ms": (w1 - w0) * 1e3 / n,
                      "engine_ms": 1e3 / info.last_decode_tokens_per_second, "n": n}))

if __name__ == "__main__":
    if sys.argv[1] == "--worker":
        worker(sys.argv[2], int(sys.argv[3]))
        sys.exit()
    a, b = sys.argv[1], sys.argv[2]
    blocks = int(sys.argv[3]) if len(sys.argv) > 3 else 10
    res = {a: [], b: []}
    for i in range(blocks):
        for bundle in ((a, b) if i % 2 == 0 else (b, a)):
            out = subprocess.run([sys.executable, __file__, "--worker", bundle, "128"], capture_output=True, text=True)
            res[bundle].append(json.loads(out.stdout.strip().splitlines()[-1]))
    for k in ("cpu_ms", "wall_ms", "engine_ms"):
        ma = statistics.median(r[k] for r in res[a])
        mb = statistics.median(r[k] for r in res[b])
        pair = [round(x[k] / y[k], 3) for x, y in zip(res[a], res[b])]
        print(f"{k}: A {ma:.2f} B {mb:.2f} ratio {ma / mb:.3f} pairwise {pair}")
