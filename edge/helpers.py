"""Emitters the edge lowerings share: broadcasting binary and unary ops in their input's layout
(a broadcast operand is brought to that layout; a constant is permuted at conversion time, never
at run time), reductions on remapped axes, and small predicates.
"""

from __future__ import annotations

import numpy as np
import torch

from ..converter import layout as L
from .values import SymVal, Val

__all__ = ["NHWC", "as_val", "ref_perm", "operand", "binary", "unary", "promote", "plain", "broadcast_plain",
           "static_out", "reduce_dims", "reduce"]

aten = torch.ops.aten
NHWC = (0, 2, 3, 1)  # a 4-D value laid out channel-last


def as_val(lw, x, dtype) -> Val:
    if isinstance(x, SymVal):  # a dynamic size used as a number: its run-time value, a 0-d tensor
        if x.value is None:
            return lw.cast(Val((), np.dtype(np.int32), (), tensor=lw.sym_scalar(x)), dtype)
        x = x.value
    return x if isinstance(x, Val) else lw.const(np.asarray(x, dtype=dtype))


def ref_perm(vals, rank) -> tuple:
    """The layout an elementwise op runs in: that of its first full-rank non-constant input."""
    for v in vals:
        if isinstance(v, Val) and not v.is_const and v.rank == rank:
            return tuple(v.perm)
    return L.identity(rank)


def operand(lw, v: Val, rank: int, perm) -> int:
    """v's tensor, broadcast-ready for an op of ``rank`` running in layout ``perm``."""
    if v.rank < rank and v.is_const and v.const.size == 1:
        return lw.tensor(lw.const(v.const.reshape(())))  # a scalar broadcasts in any layout
    if v.rank < rank:
        if L.is_identity(perm):
            return lw.tensor(v, L.identity(v.rank))  # numpy-style right-aligned broadcasting
        full = [1] * (rank - v.rank) + lw.dims(v)
        v = lw.const(v.const.reshape(full)) if v.is_const else lw.reshape(v, full)
    return lw.tensor(v, perm)


_SMALL_INTS = (np.dtype(np.int8), np.dtype(np.uint8))


def binary(lw, op, a, b, *, dtype=None, kind=None, shape=None, out_dtype=None):
    """``op`` on a and b broadcast, computed in ``dtype`` (default: the node's output dtype)."""
    out_dtype = np.dtype(out_dtype or lw.out_dtype)
    dtype = np.dtype(dtype or out_dtype)
    if dtype in _SMALL_INTS:
        # LiteRT's int8/uint8 kernels expect quantized tensors: on plain ones they abort or
        # rescale. Compute in int32 and cast back (wrapping, as torch's int8 arithmetic does).
        wide = np.dtype(np.int32) if out_dtype in _SMALL_INTS else out_dtype
        r = binary(lw, op, a, b, dtype=np.int32, shape=shape, out_dtype=wide)
        return lw.cast(r, out_dtype)
    a, b = lw.cast(as_val(lw, a, dtype), dtype), lw.cast(as_val(lw, b, dtype), dtype)
    shape = lw.out_shape if shape is None else shape
    perm = ref_perm([a, b], len(shape))
    ins = [operand(lw, a, len(shape), perm), operand(lw, b, len(shape), perm)]
    opts = lw.options(kind, fusedActivationFunction=0) if kind else None
    return lw.op(op, ins, shape, out_dtype, perm, opts, fusable=kind is not None)


def unary(lw, op, x: Val, opts=None, dtype=None) -> Val:
    x = lw.cast(x, dtype or lw.out_dtype)
    return lw.op(op, [lw.tensor(x)], x.shape, lw.out_dtype, x.perm, opts)


def promote(*xs) -> np.dtype:
    """The dtype torch computes a comparison in (tensor dtypes win over Python scalars)."""
    tens = [x for x in xs if isinstance(x, Val)]
    floats = [x.dtype for x in tens if x.dtype.kind == "f"]
    if floats:
        return max(floats, key=lambda d: d.itemsize)
    if any(isinstance(x, float) for x in xs):
        return np.dtype(np.float32)
    ints = [x.dtype for x in tens if x.dtype.kind in "iu"]
    if ints:
        return max(ints, key=lambda d: d.itemsize)
    return tens[0].dtype if tens else np.dtype(np.int32)


def plain(lw, v: Val) -> Val:
    return lw.with_perm(v, L.identity(v.rank))


def broadcast_plain(lw, v: Val, shape, suffix=None) -> Val:
    """v in the plain layout, broadcast to the static ``shape`` (numpy-style: leading unit dims
    first) by BROADCAST_TO; v itself where it has that shape already."""
    v = plain(lw, v)
    shape = tuple(shape)
    if tuple(v.shape) == shape:
        return v
    if v.rank < len(shape):
        v = lw.reshape(v, [1] * (len(shape) - v.rank) + lw.dims(v))
    return lw.op("BROADCAST_TO", [lw.tensor(v), lw.const_tensor(list(shape), np.int32)], shape, v.dtype,
                 suffix=suffix)


def static_out(n):
    v = n.meta["val"]
    vals = v if isinstance(v, (tuple, list)) else (v,)
    return all(isinstance(d, int) for t in vals if t is not None for d in t.shape)


def reduce_dims(x, dim):
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
