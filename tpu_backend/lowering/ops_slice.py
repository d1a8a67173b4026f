"""Slicing and windows: slice/select/narrow, flip, roll, constant/reflect/replicate padding,
tril/triu, unfold.

Sizes may be jax symbolic dims (dynamic shapes), so slice bounds are read from the node's
recorded output shape rather than recomputed with python min/max.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

import tpu_export.converter.llm_ops  # noqa: F401  (registers tpu_export::cache_write, lowered below)

from .helpers import norm_dim, norm_dims, static_int
from .registry import lowering

aten = torch.ops.aten


def slice_bounds(size, start, step, out_len):
    """Normalized static-or-symbolic (start, limit) of torch's x[start:end:step] along a dim."""
    if start is None:
        start = 0
    if isinstance(start, int) and start < 0:
        start = start + size
        if static_int(start) is not None:
            start = max(start, 0)
    if static_int(size) is not None and isinstance(start, int):
        start = min(start, int(size))
    limit = start + (out_len - 1) * step + 1 if static_int(out_len) != 0 else start
    return start, limit


# aten::slice.Tensor(Tensor(a) self, int dim=0, SymInt? start=None, SymInt? end=None, SymInt step=1)
@lowering(aten.slice.Tensor, aten.slice_copy.Tensor)
def slice_(ctx, x, dim=0, start=None, end=None, step=1):
    d = norm_dim(dim, x.ndim)
    out_len = ctx.out_shape[d]
    start, limit = slice_bounds(x.shape[d], start, step, out_len)
    if static_int(out_len) == 0:
        return jnp.zeros(ctx.out_shape, x.dtype)
    if isinstance(start, int) and start == 0 and step == 1 and static_int(out_len) is not None \
            and static_int(out_len) == static_int(x.shape[d]):
        return x
    if static_int(start) is None and step == 1:
        # start counted from a symbolic end (x[-2:] on a dynamic dim): lax.slice would need
        # start >= 0 proven; a dynamic_slice takes the start as a value.
        return lax.dynamic_slice_in_dim(x, jnp.asarray(start, jnp.int32), out_len, axis=d)
    return lax.slice_in_dim(x, start, limit, step, axis=d)


# aten::select.int(Tensor(a) self, int dim, SymInt index) -> Tensor(a)
@lowering(aten.select.int, aten.select_copy.int)
def select(ctx, x, dim, index):
    d = norm_dim(dim, x.ndim)
    if isinstance(index, int) and index < 0:
        index = index + x.shape[d]
    if static_int(index) is None:
        return lax.dynamic_index_in_dim(x, index, axis=d, keepdims=False)
    return lax.index_in_dim(x, index, axis=d, keepdims=False)


# aten::narrow(Tensor(a) self, int dim, SymInt start, SymInt length) -> Tensor(a)
@lowering(aten.narrow.default)
def narrow(ctx, x, dim, start, length):
    d = norm_dim(dim, x.ndim)
    if isinstance(start, int) and start < 0:
        start = start + x.shape[d]
    return lax.slice_in_dim(x, start, start + length, axis=d)


# aten::flip(Tensor self, int[] dims) -> Tensor
@lowering(aten.flip.default)
def flip(ctx, x, dims):
    return jnp.flip(x, norm_dims(dims, x.ndim)) if dims else x


# aten::roll(Tensor self, SymInt[1] shifts, int[1] dims=[]) -> Tensor
@lowering(aten.roll.default)
def roll(ctx, x, shifts, dims=()):
    if not dims:
        return jnp.roll(x.reshape(-1), shifts[0]).reshape(x.shape)
    return jnp.roll(x, tuple(shifts), norm_dims(dims, x.ndim))


# aten::constant_pad_nd(Tensor self, SymInt[] pad, Scalar value=0) -> Tensor
@lowering(aten.constant_pad_nd.default)
def constant_pad_nd(ctx, x, pad, value=0):
    # pad lists (lo, hi) pairs from the last dim backwards; negative entries crop.
    config = [(0, 0, 0)] * x.ndim
    for i in range(len(pad) // 2):
        config[x.ndim - 1 - i] = (pad[2 * i], pad[2 * i + 1], 0)
    return lax.pad(x, jnp.asarray(value, x.dtype), config)


def _pad_edge_or_reflect(mode):
    def lower(ctx, x, padding):
        n = len(padding) // 2
        widths = [(0, 0)] * (x.ndim - n) + [(padding[2 * i], padding[2 * i + 1]) for i in reversed(range(n))]
        return jnp.pad(x, widths, mode=mode)

    return lower


# aten::reflection_pad{1,2,3}d(Tensor self, SymInt[2|4|6] padding) -> Tensor
# aten::replication_pad{1,2,3}d(Tensor self, SymInt[2|4|6] padding) -> Tensor
lowering(aten.reflection_pad1d.default, aten.reflection_pad2d.default, aten.reflection_pad3d.default)(
    _pad_edge_or_reflect("reflect"))
lowering(aten.replication_pad1d.default, aten.replication_pad2d.default, aten.replication_pad3d.default)(
    _pad_edge_or_reflect("edge"))


# aten::tril(Tensor self, int diagonal=0) -> Tensor
@lowering(aten.tril.default)
def tril(ctx, x, diagonal=0):
    return jnp.tril(x, diagonal)


# aten::triu(Tensor self, int diagonal=0) -> Tensor
@lowering(aten.triu.default)
def triu(ctx, x, diagonal=0):
    return jnp.triu(x, diagonal)


# aten::unfold(Tensor(a) self, int dimension, int size, int step) -> Tensor(a)
@lowering(aten.unfold.default)
def unfold(ctx, x, dimension, size, step):
    if x.ndim == 0:
        return x.reshape(1)
    d = norm_dim(dimension, x.ndim)
    n = (x.shape[d] - size) // step + 1
    idx = np.arange(n)[:, None] * step + np.arange(size)[None, :]
    out = jnp.take(x, jnp.asarray(idx.reshape(-1), jnp.int32), axis=d)
    out = out.reshape(x.shape[:d] + (n, size) + x.shape[d + 1:])
    return jnp.moveaxis(out, d + 1, -1)


# tpu_export::cache_write(Tensor cache, Tensor update, Tensor pos, int dim) -> Tensor
@lowering(torch.ops.tpu_export.cache_write.default)
def cache_write(ctx, cache, update, pos, dim):
    """lax.dynamic_update_slice at pos[0] along ``dim``: an in-place update when the cache buffer is donated;
    XLA clamps the start like the op's eager definition (converter.llm_ops)."""
    dim = norm_dim(dim, cache.ndim)
    start = pos.reshape(-1)[0].astype(jnp.int32)
    zero = jnp.zeros((), jnp.int32)
    idx = tuple(start if d == dim else zero for d in range(cache.ndim))
    return lax.dynamic_update_slice(cache, update.astype(cache.dtype), idx)
