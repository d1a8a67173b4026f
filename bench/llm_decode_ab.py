"""A/B of the decode cost of two LLM files, 1 CPU thread, each run in a fresh process, the two alternating (order
flipped every block); per token: CPU ms of the process during decode (time.process_time: all its threads; unlike
wall time it does not count the time other processes on a shared host held the core) and wall ms.

    .venv/bin/python bench/llm_decode_ab.py OURS.litertlm PEER.litertlm [BLOCKS]
    .venv/bin/python bench/llm_decode_ab.py OURS.tflite PEER.tflite [BLOCKS]

A .litertlm runs in the LiteRT-LM engine (bench/llm.py's engine worker: prefill a prompt, 128 greedy decode
steps; also the engine's own benchmark figure). A .tflite runs its ``decode`` signature alone in LiteRT's
CompiledModel (CPU, XNNPACK), with each cache passed as the same buffer in and out as the engine does (no copy of
the caches per step), 3 rounds of 200 steps at position 100: no sampling, tokenizer or engine loop, so a cheaper
and steadier A/B of the graphs themselves (extract a bundle's .tflite with edge.litertlm.read_litertlm's section
offsets). bench/llm.py writes both bundles (--keep DIR keeps them). Prints medians and the per-block ratios A/B.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

LLM_BENCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "llm.py")
PROMPT = " ".join(f"t{100 + 37 * i}" for i in range(24))
FIGURES = {"cpu_ms": "decode_cpu_ms", "wall_ms": "decode_wall_ms_per_token", "engine_ms": "decode_ms"}


def run(path: str) -> dict:
    """One fresh-process run: the engine worker for a bundle, the CompiledModel worker for a .tflite."""
    if path.endswith(".tflite"):
        cmd = [sys.executable, os.path.abspath(__file__), "--tflite-worker", path]
    else:
        cmd = [sys.executable, LLM_BENCH, "--engine-worker", path, "--prompt", PROMPT, "--threads", "1",
               "--decode", "128"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def tflite_worker(path: str, steps: int = 200, rounds: int = 3, pos: int = 100):
    """The decode signature of ``path`` in CompiledModel, 1 thread; caches aliased in/out; one JSON line."""
    import numpy as np
    from ai_edge_litert.compiled_model import CompiledModel
    from ai_edge_litert.hardware_accelerator import HardwareAccelerator
    from ai_edge_litert.options import CpuOptions, Options

    cm = CompiledModel.from_file(path, options=Options(hardware_accelerators=HardwareAccelerator.CPU,
                                                       cpu_options=CpuOptions(num_threads=1)))
    names = cm.get_signature_list()["decode"]
    ins = {n: cm.create_input_buffer_by_name("decode", n) for n in names["inputs"]}
    outs = {n: ins[n] if n in ins else cm.create_output_buffer_by_name("decode", n) for n in names["outputs"]}
    for n, d in cm.get_input_tensor_details("decode").items():
        ins[n].write(np.full(d["shape"], pos if n == "input_pos" else 0, np.dtype(str(d["dtype"]))))
    for _ in range(20):  # warm-up: XNNPACK's first runs pack the weights
        cm.run_by_name("decode", ins, outs)
    cpu, wall = [], []
    for _ in range(rounds):
        c0, w0 = time.process_time(), time.perf_counter()
        for _ in range(steps):
            cm.run_by_name("decode", ins, outs)
        cpu.append((time.process_time() - c0) * 1e3 / steps)
        wall.append((time.perf_counter() - w0) * 1e3 / steps)
    print(json.dumps({"decode_cpu_ms": statistics.median(cpu), "decode_wall_ms_per_token": statistics.median(wall)}))


if __name__ == "__main__":
    if sys.argv[1] == "--tflite-worker":
        tflite_worker(sys.argv[2])
        sys.exit(0)
    a, b = sys.argv[1], sys.argv[2]
    blocks = int(sys.argv[3]) if len(sys.argv) > 3 else 10
    res = {a: [], b: []}
    for i in range(blocks):
        for path in ((a, b) if i % 2 == 0 else (b, a)):
            res[path].append(run(path))
    for k, field in FIGURES.items():
        if any(field not in r for r in res[a] + res[b]):
            continue  # the engine's own figure: bundles only
        ma = statistics.median(r[field] for r in res[a])
        mb = statistics.median(r[field] for r in res[b])
        pair = [round(x[field] / y[field], 3) for x, y in zip(res[a], res[b])]
        print(f"{k}: A {ma:.2f} B {mb:.2f} ratio {ma / mb:.3f} pairwise {pair}")
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
