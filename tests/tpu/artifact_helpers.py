"""Shared helpers of the TPU artifact / runtime / AOT / sharding tests: real torch models
converted once per test process."""

from __future__ import annotations

import functools
import re

import torch
import torch.utils._pytree as pytree

from tests.numerics import rel_err  # noqa: F401 - re-exported for the TPU tests
from tests.zoo import ZOO, batch_like
from tpu_export import converter

__all__ = ["MLP", "mlp_program", "zoo_program", "rel_err", "assert_close_tree"]


class MLP(torch.nn.Module):
    """fc1 -> gelu -> fc2, returning a dict with a nested tuple: exercises the output pytree,
    keyword inputs, an int64 input and an integer (argmax) output."""

    def __init__(self, d_in=16, d_hidden=32, d_out=8):
        super().__init__()
        self.fc1 = torch.nn.Linear(d_in, d_hidden)
        self.fc2 = torch.nn.Linear(d_hidden, d_out)

    def forward(self, x, *, offset):
        h = self.fc2(torch.nn.functional.gelu(self.fc1(x)))
        return {"logits": h + offset.unsqueeze(-1).to(h.dtype), "stats": (h.sum(-1), h.argmax(-1))}


def mlp_inputs(batch=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(batch, 16, generator=g),), {"offset": torch.randint(0, 5, (batch,), generator=g)}


@functools.lru_cache(maxsize=None)
def mlp_program(dynamic: bool = True):
    torch.manual_seed(0)
    model = MLP().eval()
    args, kwargs = mlp_inputs()
    dyn = None
    if dynamic:
        b = torch.export.Dim("batch", min=1, max=64)
        dyn = {"x": {0: b}, "offset": {0: b}}
    prog = converter.prepare(model, args, kwargs, dynamic_shapes=dyn)
    return model, prog


@functools.lru_cache(maxsize=None)
def zoo_program(name: str, dynamic: bool = False):
    """(module, sample args, Program); with ``dynamic`` dim 0 of every input is "batch"."""
    model, args = ZOO[name].build()
    dyn = None
    if dynamic:
        args = batch_like(args, 2)
        b = torch.export.Dim("batch", min=1, max=32)
        dyn = tuple({0: b} for _ in args)
    return model, args, converter.prepare(model, args, dynamic_shapes=dyn)


# the Mosaic kernel names in a TPU lowering's StableHLO text
KERNEL = re.compile(r'kernel_name = "([^"]+)"')


def first_output_rel_err(got, want) -> float:
    """max |got - want| / max |want| over the first output (the whole output if it is one tensor)."""
    got = got if isinstance(got, torch.Tensor) else got[0]
    want = want if isinstance(want, torch.Tensor) else want[0]
    return float((got.float() - want.float()).abs().max() / want.float().abs().max())


def assert_close_tree(out, ref, tol=1e-5):
    """Same pytree structure, every float leaf within ``tol`` relative error, ints equal."""
    out_leaves, out_spec = pytree.tree_flatten(out)
    ref_leaves, ref_spec = pytree.tree_flatten(ref)
    assert out_spec == ref_spec, f"output structure {out_spec} != torch's {ref_spec}"
    for i, (o, r) in enumerate(zip(out_leaves, ref_leaves)):
        assert isinstance(o, torch.Tensor), type(o)
        e = rel_err(o, r)
        assert e <= tol, f"leaf {i}: relative error {e:.3g} > {tol}"
