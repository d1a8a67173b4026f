"""Helpers shared by the edge tests: relative error, output flattening, op histograms."""

from __future__ import annotations

import numpy as np
import torch
import torch.utils._pytree as pytree


def leaves(x) -> list:
    return [t for t in pytree.tree_leaves(x) if isinstance(t, torch.Tensor)]


def rel_err(got, want) -> float:
    """max|a - b| / max(max|b|, 1e-6), as the op table and zoo define it."""
    a = np.asarray(got, dtype=np.float64)
    b = np.asarray(want, dtype=np.float64)
    if a.shape != b.shape:
        raise AssertionError(f"shape {a.shape} != expected {b.shape}")
    if b.size == 0:
        return 0.0
    both_inf = np.isinf(a) & np.isinf(b) & (np.sign(a) == np.sign(b))
    diff = np.where(both_inf, 0.0, np.abs(a - b))
    diff = np.where(np.isnan(a) & np.isnan(b), 0.0, diff)
    scale = np.abs(np.where(np.isinf(b), 0.0, b)).max()
    return float(np.nanmax(diff) / max(scale, 1e-6)) if not np.isnan(diff).any() else float("inf")


def assert_close(got, want, rtol, atol=0.0, exact=False, what=""):
    got_l, want_l = leaves(got), leaves(want)
    assert len(got_l) == len(want_l), f"{what}: {len(got_l)} outputs, expected {len(want_l)}"
    for i, (g, w) in enumerate(zip(got_l, want_l)):
        g, w = g.detach().numpy(), w.detach().numpy()
        if exact or not np.issubdtype(w.dtype, np.floating):
            assert g.shape == w.shape, f"{what}[{i}]: shape {g.shape} != {w.shape}"
            np.testing.assert_array_equal(g.astype(np.float64), w.astype(np.float64), err_msg=f"{what}[{i}]")
            continue
        err = rel_err(g, w)
        assert err <= rtol + atol, f"{what}[{i}]: rel err {err:.3g} > {rtol} (+{atol})"
