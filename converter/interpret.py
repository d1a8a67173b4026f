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


def call_narrowed(target, args, kwargs):
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
