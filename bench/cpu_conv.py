"""XLA:CPU: a dense 2-d convolution as lax.conv_general_dilated vs as one matmul over im2col patches
(tpu_backend/lowering/ops_conv.py's CPU branch), one thread, 3x3 kernels, by width and size.

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

CASES = [(512, 7, 1), (256, 7, 1), (128, 7, 1), (64, 7, 1), (512, 14, 2), (256, 14, 1), (128, 14, 1),
         (256, 28, 2), (128, 28, 2), (64, 56, 2), (512, 14, 1), (1024, 7, 1)]


def main():
    import jax
    import numpy as np
    from jax import lax

    from tpu_backend.lowering.ops_conv import _im2col

    def native(x, w, s):
        return lax.conv_general_dilated(x, w, (s, s), [(1, 1), (1, 1)], dimension_numbers=("NCHW", "OIHW", "NCHW"))

    def matmul(x, w, s):
        return _im2col(x, w, (s, s), (1, 1), (1, 1), None)

    def timed(f, *a):
        f(*a).block_until_ready()
        ts = []
        for _ in range(9):
            t0 = time.perf_counter()
            f(*a).block_until_ready()
            ts.append(time.perf_counter() - t0)
        return statistics.median(ts) * 1e3

    print("| Cin=Cout | H=W | stride | conv ms | matmul ms | speedup |")
    for c, hw, s in CASES:
        rng = np.random.default_rng(0)
        x = rng.standard_normal((1, c, hw, hw), dtype=np.float32)
        w = rng.standard_normal((c, c, 3, 3), dtype=np.float32) * 0.05
        a, b = jax.jit(native, static_argnums=2), jax.jit(matmul, static_argnums=2)
        ta = min(timed(a, x, w, s) for _ in range(3))
        tb = min(timed(b, x, w, s) for _ in range(3))
        print(f"| {c} | {hw} | {s} | {ta:.2f} | {tb:.2f} | {ta / tb:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
