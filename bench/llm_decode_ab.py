"""A/B of the decode cost of two .litertlm bundles in the LiteRT-LM engine (1 CPU thread): each run in a fresh
process, the two alternating (order flipped every block); per token: CPU ms of the process during run_decode
(time.process_time: all its threads; unlike wall time it does not count the time other processes on a shared host
held the core), wall ms, and the engine's own benchmark figure, from bench/llm.py's engine worker.

    .venv/bin/python bench/llm_decode_ab.py OURS.litertlm PEER.litertlm [BLOCKS]

bench/llm.py writes both bundles (--keep DIR keeps them). Prints medians and the per-block ratios A/B.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

LLM_BENCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "llm.py")
PROMPT = " ".join(f"t{100 + 37 * i}" for i in range(24))
FIGURES = {"cpu_ms": "decode_cpu_ms", "wall_ms": "decode_wall_ms_per_token", "engine_ms": "decode_ms"}


def run(bundle: str) -> dict:
    """One fresh-process run of bench/llm.py's engine worker: prefill PROMPT, 128 greedy decode steps."""
    out = subprocess.run([sys.executable, LLM_BENCH, "--engine-worker", bundle, "--prompt", PROMPT, "--threads", "1",
                          "--decode", "128"], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    a, b = sys.argv[1], sys.argv[2]
    blocks = int(sys.argv[3]) if len(sys.argv) > 3 else 10
    res = {a: [], b: []}
    for i in range(blocks):
        for bundle in ((a, b) if i % 2 == 0 else (b, a)):
            res[bundle].append(run(bundle))
    for k, field in FIGURES.items():
        ma = statistics.median(r[field] for r in res[a])
        mb = statistics.median(r[field] for r in res[b])
        pair = [round(x[field] / y[field], 3) for x, y in zip(res[a], res[b])]
        print(f"{k}: A {ma:.2f} B {mb:.2f} ratio {ma / mb:.3f} pairwise {pair}")
