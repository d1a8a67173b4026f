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

The engine maps the XNNPACK weight cache it writes beside a bundle (``<bundle>_<stamp>.xnnpack_cache``, the packed
float32 weights a decode step streams) from the page cache, and how much of that file the kernel maps with 2 MiB
pages depends on the folios the file got when it was last read or written, not on the bundle: one float Llama
bundle's cache was 13% huge-page mapped, another's 69%, and that alone moved their decode CPU time by 10-20% (the
same bytes re-read later: 17% and 87%). So before every run both files are dropped from the page cache
(posix_fadvise DONTNEED) and read fresh, and each run reports ``pmd``: the share of the cache file that a mapping
of it gets in 2 MiB pages right after the run (the same folios the engine had). Compare ratios only where the pmd
shares are alike. A .tflite in CompiledModel packs its weights into anonymous memory (no such file).
"""
from __future__ import annotations

import glob
import json
import mmap
import os
import statistics
import subprocess
import sys
import time

LLM_BENCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "llm.py")
PROMPT = " ".join(f"t{100 + 37 * i}" for i in range(24))
FIGURES = {"cpu_ms": "decode_cpu_ms", "wall_ms": "decode_wall_ms_per_token", "engine_ms": "decode_ms"}


def _cache_files(path: str) -> list[str]:
    return sorted(glob.glob(glob.escape(path) + "_*.xnnpack_cache"))


def evict(path: str) -> None:
    """Drop ``path`` and its XNNPACK weight caches from the page cache (clean pages: nothing is lost)."""
    for f in [path] + _cache_files(path):
        fd = os.open(f, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def pmd_share(path: str) -> float | None:
    """The share of ``path``'s XNNPACK weight cache a read-only mapping gets in 2 MiB pages (its cached folios)."""
    caches = _cache_files(path)
    if not caches:
        return None
    with open(caches[-1], "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as m:
        m[::4096]  # touch every page (all cached already: nothing is read from disk); smaps is read while mapped
        fields, mine = {}, False
        with open("/proc/self/smaps") as sm:
            for line in sm:
                if "-" in line.split(" ", 1)[0]:
                    mine = line.rstrip().endswith(caches[-1])
                elif mine and line.split(":")[0] in ("Rss", "FilePmdMapped"):
                    fields[line.split(":")[0]] = int(line.split()[1])
    return fields.get("FilePmdMapped", 0) / fields["Rss"] if fields.get("Rss") else None


def run(path: str) -> dict:
    """One fresh-process run: the engine worker for a bundle, the CompiledModel worker for a .tflite; the files
    are read fresh (see the module docstring)."""
    evict(path)
    if path.endswith(".tflite"):
        cmd = [sys.executable, os.path.abspath(__file__), "--tflite-worker", path]
    else:
        cmd = [sys.executable, LLM_BENCH, "--engine-worker", path, "--prompt", PROMPT, "--threads", "1",
               "--decode", "128"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return {**json.loads(out.stdout.strip().splitlines()[-1]), "pmd": pmd_share(path)}


def open_decode(path: str, pos: int):
    """(CompiledModel, inputs, outputs) of ``path``'s decode signature on 1 CPU thread, each cache one buffer in and
    out (as the engine passes them), the inputs zero but ``input_pos``, warmed up."""
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
    return cm, ins, outs


def tflite_worker(path: str, steps: int = 200, rounds: int = 3, pos: int = 100):
    """The decode signature of ``path`` in CompiledModel, 1 thread; caches aliased in/out; one JSON line."""
    cm, ins, outs = open_decode(path, pos)
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
    for name, path in (("A", a), ("B", b)):
        if res[path][0]["pmd"] is not None:
            print(f"{name} xnnpack cache in 2 MiB pages: {[round(r['pmd'], 2) for r in res[path]]}")
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
