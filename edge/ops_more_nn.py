"""Creation ops, diagonal, whole-tensor prod, the native (three-output) norms and cdist,
each a few LiteRT builtins."""

from __future__ import annotations

import numpy as np
import torch

from . import layout as L
from .ops_elementwise import binary
from .ops_reduce import _dims, reduce
from .registry import lowering, supported_if
from .values import SymVal, Val

__all__ = []

aten = torch.ops.aten


def _static_out(n):
    v = n.meta["val"]
    vals = v if isinstance(v, (tuple, list)) else (v,)
    return all(isinstance(d, int) for t in vals if t is not None for d in t.shape)


def _plain(lw, v: Val) -> Val:
    return lw.with_perm(v, L.identity(v.rank))


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
@lowering(aten.empty.memory_format, aten.empty_strided.default)
@supported_if(_static_out)
def empty(lw, size, *_):
    shape = lw.out_shape
    dtype = lw.out_dtype
    return lw.op("FILL", [lw.const_tensor(list(shape), np.int32), lw.const_tensor(np.array(0, dtype))], shape, dtype)


# copy(Tensor self, Tensor src, bool non_blocking=False) -> Tensor: src in self's dtype and shape
@lowering(aten.copy.default)
@supported_if(_static_out)
def copy(lw, x, src, non_blocking=False):
    shape = lw.out_shape
    v = lw.cast(src, lw.out_dtype)
    if tuple(v.shape) == tuple(shape):
        return lw.alias(v)
    v = _plain(lw, v)
    if v.rank < len(shape):
        v = lw.reshape(v, [1] * (len(shape) - v.rank) + list(v.shape))
    return lw.op("BROADCAST_TO", [lw.tensor(v), lw.const_tensor(list(shape), np.int32)], shape, v.dtype)


# prod(Tensor self, *, ScalarType? dtype=None) -> Tensor
@lowering(aten.prod.default)
def prod_all(lw, x, *_):
    return reduce(lw, "REDUCE_PROD", x, _dims(x, None), False)


# diagonal(Tensor(a) self, int offset=0, int dim1=0, int dim2=1) -> Tensor(a)
# GATHER_ND on x laid out (dim1, dim2, rest...); the diagonal comes out first and is the last
# logical dim, so the result only carries a layout, no TRANSPOSE.
@lowering(aten.diagonal.default)
@supported_if(lambda n: all(isinstance(d, int) for d in n.args[0].meta["val"].shape))
def diagonal(lw, x, offset=0, dim1=0, dim2=1):
    d1, d2 = dim1 % x.rank, dim2 % x.rank
    rest = [d for d in range(x.rank) if d not in (d1, d2)]
    shape = lw.out_shape
    n = shape[-1]
    i = np.arange(n, dtype=np.int32)
    coords = np.stack([i, i + offset] if offset >= 0 else [i - offset, i], -1).astype(np.int32)
    xt = lw.tensor(x, (d1, d2, *rest))
    perm = (len(rest), *range(len(rest)))
    return lw.op("GATHER_ND", [xt, lw.const_tensor(coords)], shape, x.dtype, perm)


def _mean_rstd(lw, x: Val, dims, eps):
    """(x - mean) * rstd, mean and rstd (both keepdim) over ``dims``."""
    m = reduce(lw, "MEAN", x, dims, True, dtype=x.dtype, shape=tuple(1 if i in dims else s for i, s in
                                                                      enumerate(x.shape)))
    d = lw.op("SUB", [lw.tensor(x), lw.tensor(m, x.perm)], x.shape, x.dtype, x.perm, lw.options("Sub"), suffix="d")
    sq = lw.op("SQUARE", [lw.tensor(d)], x.shape, x.dtype, x.perm, suffix="sq")
    v = reduce(lw, "MEAN", sq, dims, True, dtype=x.dtype, shape=m.shape)
    ve = lw.op("ADD", [lw.tensor(v), lw.const_tensor(np.array(eps, x.dtype))], v.shape, x.dtype, v.perm,
               lw.options("Add"), suffix="eps")
    r = lw.op("RSQRT", [lw.tensor(ve)], v.shape, x.dtype, v.perm, suffix="rstd")
    y = lw.op("MUL", [lw.tensor(d), lw.tensor(r, d.perm)], x.shape, x.dtype, x.perm, lw.options("Mul"), suffix="y")
    return y, m, r


def _affine(lw, y, weight, bias, wshape):
    for op, p in (("MUL", weight), ("ADD", bias)):
        if p is not None:
            p = lw.const(p.const.reshape(wshape)) if p.is_const else lw.reshape(_plain(lw, p), wshape)
            y = binary(lw, op, y, p, shape=y.shape, dtype=y.dtype)
    return y


# native_layer_norm(Tensor input, SymInt[] normalized_shape, Tensor? weight, Tensor? bias, float eps)
#     -> (Tensor out, Tensor mean, Tensor rstd)
@lowering(aten.native_layer_norm.default)
@supported_if(_static_out)
def native_layer_norm(lw, x, normalized_shape, weight, bias, eps):
    dims = list(range(x.rank - len(normalized_shape), x.rank))
    y, m, r = _mean_rstd(lw, x, dims, eps)
    return _affine(lw, y, weight, bias, list(normalized_shape)), m, r


# native_group_norm(Tensor input, Tensor? weight, Tensor? bias, SymInt N, SymInt C, SymInt HxW, int group,
#     float eps) -> (Tensor out, Tensor mean, Tensor rstd): statistics over [N, group, C/group * HxW]
@lowering(aten.native_group_norm.default)
@supported_if(_static_out)
def native_group_norm(lw, x, weight, bias, n, c, hxw, group, eps):
    g = lw.reshape(_plain(lw, x), [n, group, (c // group) * hxw])
    y, m, r = _mean_rstd(lw, g, [2], eps)
    y = lw.reshape(y, list(x.shape))
    y = _affine(lw, y, weight, bias, [c] + [1] * (x.rank - 2))
    return y, lw.reshape(m, [n, group]), lw.reshape(r, [n, group])


# _cdist_forward(Tensor x1, Tensor x2, float p, int? compute_mode) -> Tensor
# |x1[..., i, None, :] - x2[..., None, j, :]| reduced over the last dim: the direct form
# torch uses for small inputs (no |a|^2 + |b|^2 - 2ab cancellation).
@lowering(aten._cdist_forward.default)
@supported_if(lambda n: n.args[2] in (1.0, 2.0, float("inf")) and _static_out(n))
def cdist(lw, x1, x2, p, compute_mode=None):
    a, b = _plain(lw, x1), _plain(lw, x2)
    *batch, pn, m = a.shape
    rn = b.shape[-2]
    a = lw.reshape(a, [*batch, pn, 1, m])
    b = lw.reshape(b, [*batch, 1, rn, m])
    shape = (*batch, pn, rn, m)
    d = lw.op("SUB", [lw.tensor(a), lw.tensor(b)], shape, a.dtype, opts=lw.options("Sub"), suffix="diff")
    last = [len(shape) - 1]
    if p == 2.0:
        return lw.op("SQRT", [lw.tensor(reduce(lw, "SUM", lw.op("SQUARE", [lw.tensor(d)], shape, d.dtype), last,
                                               False))], lw.out_shape, d.dtype)
    ad = lw.op("ABS", [lw.tensor(d)], shape, d.dtype, suffix="abs")
    return reduce(lw, "SUM" if p == 1.0 else "REDUCE_MAX", ad, last, False)
