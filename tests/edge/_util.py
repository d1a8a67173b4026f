"""Helpers shared by the edge tests: relative error, output flattening, op histograms."""

from __future__ import annotations

import numpy as np
import torch
import torch.utils._pytree as pytree

from tests.numerics import rel_err  # noqa: F401 - re-exported for the edge tests


def leaves(x) -> list:
    return [t for t in pytree.tree_leaves(x) if isinstance(t, torch.Tensor)]


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
