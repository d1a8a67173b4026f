"""TPU path per model: export time, AOT compile time per TPU generation, artifact size, XLA:CPU
latency of the artifact vs torch eager on the same threads, and the TPU cost report.

    .venv/bin/python bench/tpu_path.py [--models resnet18,bert] [--runs 30] [--threads 1]

The XLA:CPU vs eager ratio is measured side by side in this one process (median of --runs each,
in alternating blocks of 5), torch limited to --threads and XLA's CPU client to the same count. The cost report
is XLA's estimate for the compiled TPU executable (batch 1, float32 as exported): optimal_seconds
and the model-FLOPs utilisation it implies at the chip's bf16 peak (source: tpu_backend/chips.py).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

DEFAULT_MODELS = ["resnet18", "mobilenet_v2", "efficientnet", "convnext", "vit", "swin", "bert", "llama", "t5"]
GENERATIONS = [("tpu-v5e", None), ("tpu-v6e", None), ("tpu-v7x", None)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default=",".join(DEFAULT_MODELS))
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    if a.threads == 1:
        # one thread on both sides: on a shared 2-core host, OpenMP/Eigen pools that spin-wait
        # oversubscribe the cores and turn medians into scheduler noise
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                                   " --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1").strip()
    from tpu_backend.aot import prepare_cpu_host

    prepare_cpu_host()
    import warnings

    warnings.simplefilter("ignore")
    import torch

    import converter
    import tpu_backend
    from tests.zoo import build

    torch.set_num_threads(a.threads)
    rows = []
    for name in a.models.split(","):
        module, args = build(name)
        t0 = time.perf_counter()
        prog = converter.prepare(module, args)
        capture_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        bundle = tpu_backend.export_program(prog)
        export_s = time.perf_counter() - t0
        compiled = {}
        for target, topo in GENERATIONS:
            t0 = time.perf_counter()
            ct = bundle.compile_for(target, topo)
            sig = ct.report["signatures"]["serving_default"]
            compiled[target] = (time.perf_counter() - t0, sig)
        with tempfile.TemporaryDirectory() as tmp:
            path = tpu_backend.save(bundle, os.path.join(tmp, "m.tpuexp"))
            size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)
            runner = tpu_backend.load(path)
            np_args = [x.numpy() for x in args]
            for _ in range(3):
                runner(*np_args)
                with torch.no_grad():
                    module(*args)
            t_x, t_e = [], []
            # Alternating blocks (not single calls): XLA's CPU thread pool spins for a while after
            # each run and would starve torch's threads if the two were interleaved call by call.
            for _block in range(max(1, a.runs // 5)):
                time.sleep(0.05)
                for _ in range(5):
                    t = time.perf_counter()
                    out = runner(*np_args)
                    _ = [o.numpy() for o in torch.utils._pytree.tree_leaves(out)]
                    t_x.append(time.perf_counter() - t)
                time.sleep(0.05)
                for _ in range(5):
                    t = time.perf_counter()
                    with torch.no_grad():
                        module(*args)
                    t_e.append(time.perf_counter() - t)
        rows.append(dict(model=name, capture_s=capture_s, export_s=export_s, size=size,
                         xla_ms=statistics.median(t_x) * 1e3, eager_ms=statistics.median(t_e) * 1e3,
                         compiled=compiled))
        r = rows[-1]
        print(f"{name}: capture {capture_s:.2f}s export {export_s:.2f}s size {size:,} xla {r['xla_ms']:.3f}ms "
              f"eager {r['eager_ms']:.3f}ms", file=sys.stderr, flush=True)
    report(rows)


def report(rows):
    print(f"{'model':14s} {'capture s':>9s} {'export s':>8s} {'size':>10s} {'xla ms':>8s} {'eager ms':>8s} "
          f"{'ratio':>6s}  "
          + "  ".join(f"{t:>26s}" for t, _ in GENERATIONS))
    print(f"{'':14s} {'':>9s} {'':>8s} {'':>10s} {'':>8s} {'':>8s} {'':>6s}  "
          + "  ".join(f"{'compile s / opt us / MFU':>26s}" for _ in GENERATIONS))
    ratios = []
    for r in rows:
        ratio = r["xla_ms"] / r["eager_ms"]
        ratios.append(ratio)
        cells = []
        for t, _ in GENERATIONS:
            cs, sig = r["compiled"][t]
            opt = sig["cost"]["optimal_seconds"]["value"]
            mfu = sig.get("implied_utilisation_at_bf16_peak")
            cells.append(f"{cs:7.2f} / {opt * 1e6:8.2f} / {100 * (mfu or 0):5.2f}%")
        print(f"{r['model']:14s} {r['capture_s']:9.2f} {r['export_s']:8.2f} {r['size']:10,d} {r['xla_ms']:8.3f} "
              f"{r['eager_ms']:8.3f} {ratio:6.2f}  " + "  ".join(f"{c:>26s}" for c in cells))
    if ratios:
        print(f"\nXLA:CPU artifact / torch eager latency: median {statistics.median(ratios):.2f}x (goal <= 0.8x)")
        from tpu_backend.chips import CHIPS

        for t, _ in GENERATIONS:
            c = CHIPS.get(t)
            if c is not None:
                print(f"  {t}: bf16 peak {c.peak_bf16_flops_per_chip / 1e12:.0f} TFLOP/s per chip (source: {c.source})")


if __name__ == "__main__":
    main()
