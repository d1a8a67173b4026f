"""The one relative-error metric of the project: max|got - want| / max(max|want|, 1e-6).

Accepts torch tensors, numpy arrays or scalars. Shapes must match. Infinities of the same sign
and NaNs in the same place count as equal (torch's ops give them on purpose in some rows); any
other NaN makes the error infinite. The 1e-6 floor keeps an all-zero reference from dividing
by zero while still failing on a non-zero result. The test suite (tests/numerics.py) and
convert-lm's check of what it wrote (targets/lm_verify.py) both measure with it.
"""

from __future__ import annotations

import numpy as np

__all__ = ["FLOOR", "rel_err"]

FLOOR = 1e-6


def _array(x) -> np.ndarray:
    if hasattr(x, "detach"):  # a torch tensor (bfloat16 has no numpy dtype: widen in torch first)
        import torch

        return x.detach().cpu().to(torch.float64).numpy()
    return np.asarray(x, dtype=np.float64)


def rel_err(got, want) -> float:
    a, b = _array(got), _array(want)
    if a.shape != b.shape:
        raise AssertionError(f"shape {a.shape} != expected {b.shape}")
    if b.size == 0:
        return 0.0
    both_inf = np.isinf(a) & np.isinf(b) & (np.sign(a) == np.sign(b))
    diff = np.where(both_inf, 0.0, np.abs(a - b))
    diff = np.where(np.isnan(a) & np.isnan(b), 0.0, diff)
    if np.isnan(diff).any():
        return float("inf")
    scale = np.abs(np.where(np.isinf(b), 0.0, b)).max()
    return float(diff.max() / max(scale, FLOOR))
