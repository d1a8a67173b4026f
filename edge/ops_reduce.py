"""Reductions, arg-reductions, softmax, cumulative sums and top-k, on their input's layout (axes remapped).
"""

from __future__ import annotations

import numpy as np
import torch

from tpu_export.converter.registry import arguments

from ..converter import layout as L
from .helpers import binary, reduce, reduce_dims, unary
from .registry import lowering, supported_if
from .values import Val

__all__ = ["softmax"]

aten = torch.ops.aten


INT32 = 2  # TensorType.INT32


_REDUCER = {aten.mean.dim: "MEAN", aten.mean.default: "MEAN", aten.sum.dim_IntList: "SUM", aten.sum.default: "SUM",
            aten.amax.default: "REDUCE_MAX", aten.max.default: "REDUCE_MAX", aten.amin.default: "REDUCE_MIN",
            aten.min.default: "REDUCE_MIN", aten.prod.dim_int: "REDUCE_PROD", aten.prod.default: "REDUCE_PROD"}


# mean.dim / sum.dim_IntList(Tensor self, int[1]? dim, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor
# amax / amin(Tensor self, int[1] dim=[], bool keepdim=False) -> Tensor
# prod.dim_int(Tensor self, int dim, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor
@lowering(aten.mean.dim, aten.sum.dim_IntList, aten.amax.default, aten.amin.default, aten.prod.dim_int)
def reduce_dim(lw, x, dim=None, keepdim=False, *_):
    return reduce(lw, _REDUCER[lw.node.target], x, reduce_dims(x, dim), keepdim)


# mean / sum / prod.default(Tensor self, *, ScalarType? dtype=None) -> Tensor ; max / min.default(Tensor self)
@lowering(aten.mean.default, aten.sum.default, aten.max.default, aten.min.default, aten.prod.default)
def reduce_all(lw, x, *_):
    return reduce(lw, _REDUCER[lw.node.target], x, reduce_dims(x, None), False)


# any.dim(Tensor self, int dim, bool keepdim=False) -> Tensor ; any.dims ; any.default
@lowering(aten.any.dim, aten.any.dims, aten.any.default)
def any_(lw, x, dim=None, keepdim=False):
    if x.dtype != np.bool_:
        x = binary(lw, "NOT_EQUAL", x, 0, dtype=x.dtype, shape=x.shape)
    return reduce(lw, "REDUCE_ANY", x, reduce_dims(x, dim), keepdim, dtype=np.bool_)


# var.correction(Tensor self, int[1]? dim=None, *, Scalar? correction=None, bool keepdim=False) -> Tensor
@lowering(aten.var.correction)
@supported_if(lambda n: all(isinstance(d, int) for d in n.args[0].meta["val"].shape))
def var(lw, x, dim=None, correction=None, keepdim=False):
    dims = reduce_dims(x, dim)
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
    return (reduce(lw, "REDUCE_MAX", x, reduce_dims(x, dim), keepdim, shape=lw.out_shape, dtype=x.dtype),
            _arg(lw, "ARG_MAX", x, dim, keepdim, 1))


@lowering(aten.min.dim)
def min_dim(lw, x, dim, keepdim=False):
    return (reduce(lw, "REDUCE_MIN", x, reduce_dims(x, dim), keepdim, shape=lw.out_shape, dtype=x.dtype),
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


# linalg_vector_norm(Tensor self, Scalar ord=2, int[1]? dim=None, bool keepdim=False, *, ScalarType? dtype=None)
@lowering(aten.linalg_vector_norm.default)
@supported_if(lambda n: arguments(n)["ord"] in (1, 2, float("inf")))
def vector_norm(lw, x, ord=2, dim=None, keepdim=False, *_):  # noqa: A002 - ATen's argument name
    dims = reduce_dims(x, dim)
    if ord == 2:
        return unary(lw, "SQRT", reduce(lw, "SUM", unary(lw, "SQUARE", x), dims, keepdim))
    if ord == 1:
        return reduce(lw, "SUM", unary(lw, "ABS", x), dims, keepdim)
    return reduce(lw, "REDUCE_MAX", unary(lw, "ABS", x), dims, keepdim)


def softmax(lw, op, x: Val, dim: int) -> Val:
    dim %= x.rank
    x = lw.with_perm(x, L.last_dim_layout(x.perm, dim))
    opts = lw.options("Softmax", beta=1.0) if op == "SOFTMAX" else lw.options("LogSoftmax")
    return lw.op(op, [lw.tensor(x)], x.shape, x.dtype, x.perm, opts)


# _softmax(Tensor self, int dim, bool half_to_float) -> Tensor
@lowering(aten._softmax.default)
def _softmax(lw, x, dim, half_to_float=False):
    return softmax(lw, "SOFTMAX", lw.cast(x, lw.out_dtype), dim)


# _log_softmax(Tensor self, int dim, bool half_to_float) -> Tensor
@lowering(aten._log_softmax.default)
def _log_softmax(lw, x, dim, half_to_float=False):
    return softmax(lw, "LOG_SOFTMAX", lw.cast(x, lw.out_dtype), dim)
