"""XLA:CPU: a dense 2-d convolution as lax.conv_general_dilated vs as one matmul over im2col patches
(tpu_backend/lowering/ops_conv.py's CPU branch), one thread, 3x3 and 1x1 kernels, by width and size.

    .venv/bin/python bench/cpu_conv.py

Prints the median ms of each (best of 3 rounds of 9 calls) and the speedup of the matmul form; the
lowering takes the matmul where Cin*k*k >= 2304 and Cout >= 256.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

os.environ["XLA_FLAGS"] = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# (Cin, Cout, k, H=W, stride)
CASES = [(c, c, 3, hw, s) for c, hw, s in [(512, 7, 1), (256, 7, 1), (128, 7, 1), (64, 7, 1), (512, 14, 2),
                                           (256, 14, 1), (128, 14, 1), (256, 28, 2), (128, 28, 2), (64, 56, 2),
                                           (512, 14, 1), (1024, 7, 1)]]
CASES += [(32, 192, 1, 56, 1), (144, 24, 1, 56, 1), (96, 576, 1, 14, 1), (576, 96, 1, 14, 1), (320, 1280, 1, 7, 1),
          (64, 256, 1, 56, 1), (1024, 256, 1, 14, 1), (2048, 512, 1, 7, 1), (256, 512, 1, 28, 2)]


def main():
    import jax
    import numpy as np
    from jax import lax

    from tpu_export.tpu_backend.lowering.ops_conv import _im2col

    def native(x, w, s):
        p = w.shape[2] // 2
        return lax.conv_general_dilated(x, w, (s, s), [(p, p), (p, p)], dimension_numbers=("NCHW", "OIHW", "NCHW"))

    def matmul(x, w, s):
        p = w.shape[2] // 2
        return _im2col(x, w, (s, s), (p, p), (1, 1), None)

    def timed(f, *a):
        f(*a).block_until_ready()
        ts = []
        for _ in range(9):
            t0 = time.perf_counter()
            f(*a).block_until_ready()
            ts.append(time.perf_counter() - t0)
        return statistics.median(ts) * 1e3

    print("| Cin | Cout | k | H=W | stride | conv ms | matmul ms | speedup |")
    for c, co, k, hw, s in CASES:
        rng = np.random.default_rng(0)
        x = rng.standard_normal((1, c, hw, hw), dtype=np.float32)
        w = rng.standard_normal((co, c, k, k), dtype=np.float32) * 0.05
        a, b = jax.jit(native, static_argnums=2), jax.jit(matmul, static_argnums=2)
        ta = min(timed(a, x, w, s) for _ in range(3))
        tb = min(timed(b, x, w, s) for _ in range(3))
        print(f"| {c} | {co} | {k} | {hw} | {s} | {ta:.2f} | {tb:.2f} | {ta / tb:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
