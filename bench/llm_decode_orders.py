"""Decode cost of two or more LLM .tflite files in CompiledModel, all loaded in one process and timed in
alternating short rounds, once per load order (every permutation, each in a fresh process); per process and file
the median CPU ms per step, then per pair of files the geometric mean of the per-process ratios.

    .venv/bin/python bench/llm_decode_orders.py A.tflite B.tflite [C.tflite ...] [--pos 100] [--rounds 20]

Why: on a shared host the per-step CPU time of one file moves by 20-40% from one process to the next (where its
packed weights land, what the other tenants stream meanwhile), more than the differences between graphs
measured here. Rounds alternating inside one process see the same host; rotating the load order over processes
cancels what being loaded first or last does. bench/llm_decode_ab.py times each file in its own process (and the
engine's bundles); this one is the steadier A/B of decode graphs at one position. Each file's ``decode``
signature runs at ``input_pos`` = --pos with its caches passed as the same buffers in and out (no copy per
step), zero-filled, 1 thread, 20 warm-up steps (XNNPACK packs the weights on the first runs).
"""
from __future__ import annotations

import itertools
import json
import math
import os
import statistics
import subprocess
import sys
import time

STEPS = 10  # per round


def worker(paths: list[str], rounds: int, pos: int) -> dict:
    from llm_decode_ab import open_decode  # this script's folder is first on sys.path

    runs = []
    for path in paths:
        cm, ins, outs = open_decode(path, pos)
        runs.append((cm, ins, outs))
    cpu = [[] for _ in paths]
    for r in range(rounds):
        for i in [(r + j) % len(paths) for j in range(len(paths))]:  # a rotating order of the files per round
            cm, ins, outs = runs[i]
            c0 = time.process_time()
            for _ in range(STEPS):
                cm.run_by_name("decode", ins, outs)
            cpu[i].append((time.process_time() - c0) * 1e3 / STEPS)
    return {p: statistics.median(c) for p, c in zip(paths, cpu)}


def main(argv: list[str]) -> None:
    opts = {"--pos": 100, "--rounds": 20}
    paths, it = [], iter(argv)
    for a in it:
        if a in opts:
            opts[a] = int(next(it))
        else:
            paths.append(a)
    if len(paths) < 2:
        sys.exit("usage: llm_decode_orders.py A.tflite B.tflite [C.tflite ...] [--pos N] [--rounds N]")
    per_process = []
    for order in itertools.permutations(paths):
        out = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", str(opts["--rounds"]),
                              str(opts["--pos"]), *order], capture_output=True, text=True, check=True)
        per_process.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(json.dumps({"order": [os.path.basename(p) for p in order],
                          **{os.path.basename(p): round(v, 3) for p, v in per_process[-1].items()}}), flush=True)
    for p in paths:
        print(f"{p}: median CPU ms/step {statistics.median(r[p] for r in per_process):.2f}")
    for a, b in itertools.combinations(paths, 2):
        ratios = [r[a] / r[b] for r in per_process]
        gm = math.exp(sum(map(math.log, ratios)) / len(ratios))
        print(f"{os.path.basename(a)} / {os.path.basename(b)}: {gm:.3f} (per process {min(ratios):.3f}-"
              f"{max(ratios):.3f}, {len(ratios)} processes)")
    print(f"position {opts['--pos']}; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    if sys.argv[1] == "--worker":
        print(json.dumps(worker(sys.argv[4:], int(sys.argv[2]), int(sys.argv[3]))))
        sys.exit(0)
    main(sys.argv[1:])
