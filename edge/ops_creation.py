"""Creation ops and copies: constants where the shape is static, FILL / RANGE otherwise.
"""

from __future__ import annotations

import numpy as np
import torch

from .helpers import binary, broadcast_plain, static_out
from .registry import lowering, supported_if
from .values import SymVal, Val

__all__ = []

aten = torch.ops.aten


# _to_copy(Tensor self, *, ScalarType? dtype=None, ...) -> Tensor
@lowering(aten._to_copy.default)
def to_copy(lw, x, *_):
    dtype = lw.out_dtype
    if dtype == x.dtype:
        return lw.alias(x)
    if dtype == np.bool_:
        return binary(lw, "NOT_EQUAL", x, 0, dtype=x.dtype, shape=x.shape)
    return lw.cast(x, dtype)


# scalar_tensor(Scalar s, *, ScalarType? dtype=None, ...) -> Tensor: a constant, or (a symbolic
# size under dynamic shapes) its int32 [1] run-time tensor reshaped to a scalar
@lowering(aten.scalar_tensor.default)
def scalar_tensor(lw, s, *_):
    dtype = lw.out_dtype
    if not isinstance(s, SymVal) or s.value is not None:
        return lw.const(np.array(s.value if isinstance(s, SymVal) else s, dtype))
    t = Val((1,), np.dtype(np.int32), (0,), tensor=lw.sym_tensor(s))
    return lw.cast(lw.reshape(t, []), dtype)


# empty.memory_format(SymInt[] size, *, ScalarType? dtype=None, ...) -> Tensor
# empty_strided(SymInt[] size, SymInt[] stride, *, ...) -> Tensor: contents are unspecified; zeros
@lowering(aten.empty.memory_format)
def empty(lw, size, *_):
    shape = lw.out_shape
    dtype = lw.out_dtype
    dims = lw.const_tensor(list(shape), np.int32) if None not in shape else lw.shape_tensor(lw.out_dims, infer=False)
    return lw.op("FILL", [dims, lw.const_tensor(np.array(0, dtype))], shape, dtype)


@lowering(aten.empty_strided.default)
@supported_if(static_out)
def empty_strided(lw, size, *_):
    return empty(lw, size)


# copy(Tensor self, Tensor src, bool non_blocking=False) -> Tensor: src in self's dtype and shape
@lowering(aten.copy.default)
@supported_if(static_out)
def copy(lw, x, src, non_blocking=False):
    shape = lw.out_shape
    v = lw.cast(src, lw.out_dtype)
    if tuple(v.shape) == tuple(shape):
        return lw.alias(v)
    return broadcast_plain(lw, v, shape)


# full(SymInt[] size, Scalar fill_value, *, ScalarType? dtype=None, ...) -> Tensor
@lowering(aten.full.default)
def full(lw, size, fill_value, *_):
    shape = lw.out_shape
    dtype = lw.out_dtype
    dims = lw.shape_tensor([shape[i] if shape[i] is not None else size[i] for i in range(len(shape))])
    return lw.op("FILL", [dims, lw.const_tensor(np.array(fill_value, dtype))], shape, dtype)


# full_like(Tensor self, Scalar fill_value, *, ...) -> Tensor ; zeros_like / ones_like
@lowering(aten.full_like.default)
def full_like(lw, x, fill_value, *_):
    return _fill_like(lw, x, fill_value)


@lowering(aten.zeros_like.default)
def zeros_like(lw, x, *_):
    return _fill_like(lw, x, 0)


@lowering(aten.ones_like.default)
def ones_like(lw, x, *_):
    return _fill_like(lw, x, 1)


def _fill_like(lw, x, value):
    dtype = lw.out_dtype
    if x.static:
        dims = lw.const_tensor(list(x.phys_shape()), np.int32)
    else:
        (dims,), _ = lw.emit("SHAPE", [lw.tensor(x)], [(x.rank,)], [np.int32], lw.options("Shape", outType=2),
                             suffix="shape")
    return lw.op("FILL", [dims, lw.const_tensor(np.array(value, dtype))], x.shape, dtype, x.perm)


# arange.start_step(Scalar start, Scalar end, Scalar step=1, *, ScalarType? dtype=None, ...) -> Tensor
# A symbolic bound (a dynamic size) is read at run time: RANGE takes 0-d tensors.
@lowering(aten.arange.start_step)
@supported_if(lambda n: all(not isinstance(a, torch.fx.Node) or isinstance(a.meta.get("val"), (int, torch.SymInt))
                            for a in n.args))
def arange(lw, start, end, step=1, *_):
    dtype = lw.out_dtype
    ins = [lw.sym_scalar(v, dtype) if isinstance(v, SymVal) else lw.const_tensor(np.array(v, dtype))
           for v in (start, end, step)]
    return lw.op("RANGE", ins, lw.out_shape, dtype)
