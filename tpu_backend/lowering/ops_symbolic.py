"""Size arithmetic: aten.sym_size and the python operators torch.export records on SymInts.

Under jax.export shape polymorphism ``x.shape[d]`` is a symbolic dimension, and the python
operators below act on those dims directly, so shapes computed from them stay symbolic.
"""

from __future__ import annotations

import math
import operator

import torch

from .registry import lowering

aten = torch.ops.aten


# aten::sym_size.int(Tensor self, int dim) -> SymInt
@lowering(aten.sym_size.int)
def sym_size(ctx, x, dim):
    return x.shape[dim]


# aten::sym_numel(Tensor self) -> SymInt
@lowering(aten.sym_numel.default)
def sym_numel(ctx, x):
    return math.prod(x.shape, start=1)


# operator.getitem(sequence, index): reads one result of a multi-output op
@lowering(operator.getitem)
def getitem(ctx, seq, i):
    return seq[i]


def _binary(op):
    def lower(ctx, a, b):
        return op(a, b)

    lower.__name__ = op.__name__
    return lower


# operator.{add,sub,mul,floordiv,mod,truediv,pow}(a, b) on SymInts / python numbers
for _op in (operator.add, operator.sub, operator.mul, operator.floordiv, operator.mod, operator.truediv,
            operator.pow):
    lowering(_op)(_binary(_op))


# operator.neg(a)
@lowering(operator.neg)
def neg(ctx, a):
    return -a


# torch.sym_max(a, b) / torch.sym_min(a, b). jax has no public max of symbolic dims; its
# core.max_dim/min_dim build the symbolic max/min that shape polymorphism understands.
@lowering(torch.sym_max)
def sym_max(ctx, a, b):
    if isinstance(a, int) and isinstance(b, int):
        return max(a, b)
    from jax._src import core

    return core.max_dim(a, b)


@lowering(torch.sym_min)
def sym_min(ctx, a, b):
    if isinstance(a, int) and isinstance(b, int):
        return min(a, b)
    from jax._src import core

    return core.min_dim(a, b)
