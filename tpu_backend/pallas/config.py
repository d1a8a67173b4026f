"""PallasConfig and the documented block-size rule, per TPU generation and shape.

Pure Python + numpy: importing this module does not import jax.
"""

from __future__ import annotations

import dataclasses
import logging

import numpy as np

from ..chips import BY_GENERATION, KernelFacts

__all__ = [
    "PallasConfig", "TpuGeneration", "GENERATIONS", "block_sizes", "LOG", "lane_divisor_block", "matmul_precision",
]

LOG = logging.getLogger("tpu_export.pallas")

LANES = 128  # TPU vector lane width: the last dim of a block is a multiple of this (or the full dim)
MiB = 1 << 20

# Per-generation kernel facts live with the other chip facts (tpu_backend/chips.py, pure Python).
TpuGeneration = KernelFacts
GENERATIONS: dict[str, KernelFacts] = {name: chip.kernel for name, chip in BY_GENERATION.items()}
# generation=None ("any TPU"): the smallest budget and MXU, so the blocks compile everywhere.
_ANY = TpuGeneration("any", mxu=128, vmem_budget=16 * MiB, max_rows=512)


@dataclasses.dataclass(frozen=True)
class PallasConfig:
    """How the TPU lowering treats the hot patterns.

    mode: True   use the Pallas kernel whenever its shape rules allow (else XLA, with a logged reason);
          False  always the plain XLA path (no kernel in the artifact);
          "auto" like True, but only where the kernel is expected to pay off (see each op's
                 ``*_auto_ok`` rule: long enough sequences, lane-aligned widths).
    generation: "v5e" | "v6e" | "v5p" | "tpu7x" | None; selects block sizes (None: blocks that
                compile on every generation).
    interpret: run the Pallas kernel itself through Pallas' interpreter on the current
               backend (CPU in tests) instead of dispatching per platform. For tests only.
    """

    mode: bool | str = "auto"
    generation: str | None = None
    interpret: bool = False

    def __post_init__(self):
        if self.mode not in (True, False, "auto"):
            raise ValueError(f"PallasConfig.mode must be True, False or 'auto', got {self.mode!r}")
        if self.generation is not None and self.generation not in GENERATIONS:
            raise ValueError(
                f"unknown TPU generation {self.generation!r}; expected one of {sorted(GENERATIONS)} or None"
            )

    @property
    def tpu(self) -> TpuGeneration:
        return GENERATIONS[self.generation] if self.generation else _ANY


def matmul_precision(dtype):
    """"highest" for f32 (TPUs and TF32 GPUs otherwise take bf16-class passes, breaking fp32
    parity with torch); the platform default for bf16/f16."""
    return "highest" if np.dtype(dtype) == np.float32 else None


def _itemsize(dtype) -> int:
    try:
        return np.dtype(dtype).itemsize
    except TypeError:  # "bfloat16" / torch.bfloat16 while ml_dtypes (with jax) is not loaded
        name = str(dtype).rsplit(".", 1)[-1]
        if name in ("bfloat16", "float16", "half"):
            return 2
        raise


def _sublanes(dtype) -> int:
    # Second-minor tile of a block: 8 rows of 32-bit, 16 of 16-bit, 32 of 8-bit values.
    return 8 * max(1, 4 // _itemsize(dtype))


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def lane_divisor_block(n: int, cap: int) -> int:
    """Largest power-of-two multiple of 128 that is <= cap and divides round_up(n, 128)."""
    padded = _round_up(n, LANES)
    b = LANES
    while b * 2 <= cap and padded % (b * 2) == 0:
        b *= 2
    return b


def block_sizes(kernel: str, generation: str | None, shape: tuple, dtype) -> dict:
    """Block sizes for ``kernel`` on ``generation`` (None: any TPU) at ``shape``.

    The rule, per kernel:

    - "attention", shape (B, Hq, Hkv, Sq, Sk, D): sequences are padded to a multiple of 128
      (lane width). block_q is the largest power-of-two multiple of 128 that divides the
      padded Sq, capped at 4 * MXU width (512 on v5e/v5p, 1024 on v6e/tpu7x): larger q
      blocks mean fewer re-reads of K/V from HBM (K/V traffic = Sk * Sq / block_q). block_kv
      is the same rule on Sk, capped at 512; block_kv_compute (the logits tile held at once,
      block_q x block_kv_compute fp32) is min(block_kv, 512). Then both are halved while the
      double-buffered q/k/v/o tiles plus fp32 logits and accumulators exceed half the
      generation's scoped VMEM budget.
    - "norm", shape (rows, hidden): one block = block_rows full rows. block_rows is the
      largest multiple of the dtype's sublane tile (8 rows of f32, 16 of bf16) such that the
      double-buffered in/out rows plus three fp32 temporaries fit half the VMEM budget,
      capped at the generation's max_rows (512 on v5e/v5p, 1024 on v6e/tpu7x); fewer rows
      than that take one block of all rows.
    - "int8_linear", shape (M, K, N): block_m = M if M <= max_rows / 2, else max_rows / 2;
      block_n = the largest power-of-two multiple of 128 dividing N, capped at 2 * MXU
      width (N not a multiple of 128: all of N); block_k = the largest power-of-two multiple
      of 128 dividing K, capped at 2048 (v6e/tpu7x) or 1024 (v5e/v5p); K not a multiple of
      128 takes the whole K in one block. Then block_k is halved while the double-buffered
      x/w/out tiles plus the fp32 accumulator and dequantized weight tile exceed half the
      VMEM budget.
    """
    tpu = GENERATIONS[generation] if generation else _ANY
    itemsize = _itemsize(dtype)
    half = tpu.vmem_budget // 2
    if kernel == "attention":
        _, _, _, sq, sk, d = shape
        bq = lane_divisor_block(sq, 4 * tpu.mxu)
        bkv = lane_divisor_block(sk, 512)

        def vmem(bq, bkv):
            bkvc = min(bkv, 512)
            tiles = 2 * (2 * bq * d + 2 * bkv * d) * itemsize  # q, o, k, v double-buffered
            return tiles + bq * d * 4 + 2 * bq * LANES * 4 + bq * bkvc * 4

        while vmem(bq, bkv) > half and max(bq, bkv) > LANES:
            if bq >= bkv:
                bq //= 2
            else:
                bkv //= 2
        return {"block_q": bq, "block_kv": bkv, "block_kv_compute": min(bkv, 512)}
    if kernel == "norm":
        rows, hidden = shape
        sub = _sublanes(dtype)
        per_row = hidden * (4 * itemsize + 3 * 4)
        fit = max(sub, (half // max(per_row, 1)) // sub * sub)
        cap = int(min(fit, tpu.max_rows))
        return {"block_rows": rows if rows <= cap else cap}  # a block as tall as the array is always legal
    if kernel == "int8_linear":
        m, k, n = shape
        cap_m = tpu.max_rows // 2
        bm = m if m <= cap_m else cap_m  # a block as tall as the array is always legal
        bn = lane_divisor_block(n, 2 * tpu.mxu) if n % LANES == 0 else n
        if k % LANES:
            bk = k
        else:
            bk = lane_divisor_block(k, 2048 if tpu.mxu == 256 else 1024)

            def vmem(bk):
                tiles = 2 * (bm * bk * itemsize + bn * bk + bm * bn * itemsize)  # x, w (int8), out
                return tiles + bm * bn * 4 + bn * bk * itemsize

            while vmem(bk) > half and bk > LANES:
                bk //= 2
        return {"block_m": bm, "block_n": bn, "block_k": bk}
    raise ValueError(f"unknown kernel {kernel!r}; expected 'attention', 'norm' or 'int8_linear'")
