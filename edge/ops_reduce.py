"""Reductions, arg-reductions, cumulative sums and top-k, on their input's layout (axes remapped)."""

from __future__ import annotations

import numpy as np
import torch

from . import layout as L
from .ops_elementwise import binary
from .registry import lowering, supported_if
from .values import Val

__all__ = ["reduce"]

aten = torch.ops.aten
INT32 = 2  # TensorType.INT32


def _dims(x, dim):
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return list(range(x.rank))
    if isinstance(dim, int):
        dim = [dim]
    return sorted({d % x.rank for d in dim})


def reduce(lw, op, x: Val, dims, keepdim, dtype=None, shape=None) -> Val:
    """``op`` (MEAN, SUM, REDUCE_MAX, ...) over logical ``dims`` of x in x's own layout."""
    dtype = np.dtype(dtype or lw.out_dtype)
    if x.dtype != dtype:
        x = lw.cast(x, dtype)
    axes = sorted(x.perm.index(d) for d in dims)
    perm = x.perm if keepdim else L.drop_dims(x.perm, dims)
    if shape is None:
        shape = tuple(1 if i in dims else s for i, s in enumerate(x.shape)) if keepdim else \
            tuple(s for i, s in enumerate(x.shape) if i not in dims)
    ins = [lw.tensor(x), lw.const_tensor(axes, np.int32)]
    return lw.op(op, ins, shape, dtype, perm, lw.options("Reducer", keepDims=bool(keepdim)))


# mean.dim(Tensor self, int[1]? dim, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor
@lowering(aten.mean.dim)
def mean(lw, x, dim=None, keepdim=False, *_):
    return reduce(lw, "MEAN", x, _dims(x, dim), keepdim)


# mean.default(Tensor self, *, ScalarType? dtype=None) -> Tensor
@lowering(aten.mean.default)
def mean_all(lw, x, *_):
    return reduce(lw, "MEAN", x, _dims(x, None), False)


# sum.dim_IntList(Tensor self, int[1]? dim, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor
@lowering(aten.sum.dim_IntList)
def sum_dim(lw, x, dim=None, keepdim=False, *_):
    return reduce(lw, "SUM", x, _dims(x, dim), keepdim)


# sum.default(Tensor self, *, ScalarType? dtype=None) -> Tensor
@lowering(aten.sum.default)
def sum_all(lw, x, *_):
    return reduce(lw, "SUM", x, _dims(x, None), False)


# amax(Tensor self, int[1] dim=[], bool keepdim=False) -> Tensor ; amin: the same
@lowering(aten.amax.default)
def amax(lw, x, dim=(), keepdim=False):
    return reduce(lw, "REDUCE_MAX", x, _dims(x, dim), keepdim)


@lowering(aten.amin.default)
def amin(lw, x, dim=(), keepdim=False):
    return reduce(lw, "REDUCE_MIN", x, _dims(x, dim), keepdim)


# max.default(Tensor self) -> Tensor ; min.default
@lowering(aten.max.default)
def max_all(lw, x):
    return reduce(lw, "REDUCE_MAX", x, _dims(x, None), False)


@lowering(aten.min.default)
def min_all(lw, x):
    return reduce(lw, "REDUCE_MIN", x, _dims(x, None), False)


# prod.dim_int(Tensor self, int dim, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor
@lowering(aten.prod.dim_int)
def prod(lw, x, dim, keepdim=False, *_):
    return reduce(lw, "REDUCE_PROD", x, _dims(x, dim), keepdim)


# any.dim(Tensor self, int dim, bool keepdim=False) -> Tensor ; any.dims ; any.default
@lowering(aten.any.dim, aten.any.dims, aten.any.default)
def any_(lw, x, dim=None, keepdim=False):
    if x.dtype != np.bool_:
        x = binary(lw, "NOT_EQUAL", x, 0, dtype=x.dtype, shape=x.shape)
    return reduce(lw, "REDUCE_ANY", x, _dims(x, dim), keepdim, dtype=np.bool_)


# var.correction(Tensor self, int[1]? dim=None, *, Scalar? correction=None, bool keepdim=False) -> Tensor
@lowering(aten.var.correction)
@supported_if(lambda n: all(isinstance(d, int) for d in n.args[0].meta["val"].shape))
def var(lw, x, dim=None, correction=None, keepdim=False):
    dims = _dims(x, dim)
    n = int(np.prod([x.shape[d] for d in dims]))
    m = reduce(lw, "MEAN", x, dims, True)
    sq = lw.op("SQUARED_DIFFERENCE", [lw.tensor(x), lw.tensor(m)], x.shape, x.dtype, x.perm)
    s = reduce(lw, "SUM", sq, dims, keepdim)
    c = 1 if correction is None else correction
    return binary(lw, "MUL", s, 1.0 / max(n - c, 0) if n - c > 0 else float("nan"), kind="Mul", shape=s.shape)


def _arg(lw, op, x, dim, keepdim, i=0):
    if dim is None:
        x = lw.reshape(x, [int(np.prod(x.shape))])
        dim = 0
    dim %= x.rank
    ins = [lw.tensor(x), lw.const_tensor([x.perm.index(dim)], np.int32)]
    shape = tuple(s for j, s in enumerate(x.shape) if j != dim)
    perm = L.drop_dims(x.perm, [dim])
    kind = "ArgMax" if op == "ARG_MAX" else "ArgMin"
    v = lw.op(op, ins, shape, np.int32, perm, lw.options(kind, outputType=INT32))
    if keepdim:
        v = lw.reshape(v, lw.out_shapes[i])
    return v


# argmax(Tensor self, int? dim=None, bool keepdim=False) -> Tensor ; argmin: the same
@lowering(aten.argmax.default)
def argmax(lw, x, dim=None, keepdim=False):
    return _arg(lw, "ARG_MAX", x, dim, keepdim)


@lowering(aten.argmin.default)
def argmin(lw, x, dim=None, keepdim=False):
    return _arg(lw, "ARG_MIN", x, dim, keepdim)


# max.dim(Tensor self, int dim, bool keepdim=False) -> (Tensor values, Tensor indices) ; min.dim
@lowering(aten.max.dim)
def max_dim(lw, x, dim, keepdim=False):
    return (reduce(lw, "REDUCE_MAX", x, _dims(x, dim), keepdim, shape=lw.out_shape, dtype=x.dtype),
            _arg(lw, "ARG_MAX", x, dim, keepdim, 1))


@lowering(aten.min.dim)
def min_dim(lw, x, dim, keepdim=False):
    return (reduce(lw, "REDUCE_MIN", x, _dims(x, dim), keepdim, shape=lw.out_shape, dtype=x.dtype),
            _arg(lw, "ARG_MIN", x, dim, keepdim, 1))


# cumsum(Tensor self, int dim, *, ScalarType? dtype=None) -> Tensor
@lowering(aten.cumsum.default)
def cumsum(lw, x, dim, *_):
    x = lw.cast(x, lw.out_dtype)
    ins = [lw.tensor(x), lw.const_tensor(np.array(x.perm.index(dim % x.rank), np.int32))]
    return lw.op("CUMSUM", ins, x.shape, x.dtype, x.perm, lw.options("Cumsum"))


def _topk(lw, x, k, dim, largest):
    dim %= x.rank
    x = lw.with_perm(x, L.last_dim_layout(x.perm, dim))
    src = x if largest else lw.op("NEG", [lw.tensor(x)], x.shape, x.dtype, x.perm, suffix="neg")
    shape = tuple(k if j == dim else s for j, s in enumerate(x.shape))
    phys = tuple(shape[p] for p in x.perm)
    (vals, idx), _ = lw.emit("TOPK_V2", [lw.tensor(src), lw.const_tensor(np.array(k, np.int32))], [phys, phys],
                             [x.dtype, np.int32])
    v = Val(shape, x.dtype, x.perm, tensor=vals)
    if not largest:
        v = lw.op("NEG", [vals], shape, x.dtype, x.perm, suffix="neg")
    return v, Val(shape, np.dtype(np.int32), x.perm, tensor=idx)


# topk(Tensor self, SymInt k, int dim=-1, bool largest=True, bool sorted=True) -> (Tensor values, Tensor indices)
@lowering(aten.topk.default)
def topk(lw, x, k, dim=-1, largest=True, sorted=True):  # noqa: A002
    return _topk(lw, x, k, dim, largest)


# sort(Tensor self, int dim=-1, bool descending=False) -> (Tensor values, Tensor indices)
@lowering(aten.sort.default)
def sort(lw, x, dim=-1, descending=False):
    return _topk(lw, x, x.shape[dim % x.rank], dim, descending)
