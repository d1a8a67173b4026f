"""Run a Program graph under the 32-bit dtype policy, on real or fake tensors.

Some ATen ops always return int64 (argmax, topk indices, sort indices) or insist on int64
indices (gather). Under the policy those values are int32 in both backends; this interpreter
gives torch the same view: int64 results are narrowed to int32, and an op that rejects an
int32 argument is retried with it widened back to int64.
"""

from __future__ import annotations

import torch

from ._torch_compat import tree_map
from .dtypes import NARROW

__all__ = ["narrowed", "call_narrowed", "NarrowingInterpreter"]


def _narrow(v):
    if isinstance(v, torch.Tensor) and v.dtype in NARROW:
        return v.to(NARROW[v.dtype])
    return v


def narrowed(tree):
    """``tree`` (a value or a pytree of values) with its 64-bit tensors narrowed under the policy."""
    return tree_map(_narrow, tree)


def _widen(v):
    if isinstance(v, torch.Tensor) and v.dtype == torch.int32:
        return v.to(torch.int64)
    return v


# ops that take int64 indices natively: their int32 indices are widened before the call, since torch 2.13's CPU
# gather reads an expanded (stride-0) int32 index wrongly (Funnel's relative-position table, folded at conversion)
_INDEX_OPS = frozenset({
    torch.ops.aten.gather.default, torch.ops.aten.scatter.src, torch.ops.aten.scatter.value,
    torch.ops.aten.scatter_add.default, torch.ops.aten.scatter_reduce.two, torch.ops.aten.index_select.default,
    torch.ops.aten.index.Tensor, torch.ops.aten.index_put.default,
})


def call_narrowed(target, args, kwargs):
    if target in _INDEX_OPS:
        args, kwargs = tree_map(_widen, (args, kwargs))
    try:
        out = target(*args, **kwargs)
    except (RuntimeError, TypeError, IndexError) as first:
        wa, wk = tree_map(_widen, (args, kwargs))
        try:
            out = target(*wa, **wk)
        except Exception:  # noqa: BLE001
            raise first from None
    return narrowed(out)


class NarrowingInterpreter(torch.fx.Interpreter):
    def call_function(self, target, args, kwargs):
        return call_narrowed(target, args, kwargs)
