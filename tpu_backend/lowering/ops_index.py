"""Gathers and scatters: advanced indexing, index_put, gather/scatter, embedding, *_scatter.

Index tensors arrive as int32 under the dtype policy; negative indices wrap as in torch.
Boolean-mask indexing has a data-dependent shape and is reported unsupported up front.
"""

from __future__ import annotations

import jax.numpy as jnp
import torch
from jax import lax

from .helpers import cast, norm_dim
from .ops_slice import slice_bounds
from .registry import lowering, supported_if

aten = torch.ops.aten


def _no_bool_index(node) -> bool:
    idx = node.args[1] if len(node.args) > 1 else node.kwargs.get("indices", [])
    for i in idx:
        v = i.meta.get("val") if isinstance(i, torch.fx.Node) else None
        if v is not None and v.dtype in (torch.bool, torch.uint8):
            return False
    return True


def _index_tuple(indices):
    return tuple(slice(None) if i is None else i for i in indices)


# aten::index.Tensor(Tensor self, Tensor?[] indices) -> Tensor   (numpy advanced-indexing rules)
@lowering(aten.index.Tensor)
@supported_if(_no_bool_index)
def index(ctx, x, indices):
    return x[_index_tuple(indices)]


# aten::index_put(Tensor self, Tensor?[] indices, Tensor values, bool accumulate=False) -> Tensor
@lowering(aten.index_put.default)
@supported_if(_no_bool_index)
def index_put(ctx, x, indices, values, accumulate=False):
    ref = x.at[_index_tuple(indices)]
    values = cast(values, x.dtype)
    return ref.add(values) if accumulate else ref.set(values)


# aten::index_select(Tensor self, int dim, Tensor index) -> Tensor
@lowering(aten.index_select.default)
def index_select(ctx, x, dim, index):
    if x.ndim == 0:
        return x
    return jnp.take(x, index.reshape(-1), axis=norm_dim(dim, x.ndim), mode="clip")


# aten::embedding(Tensor weight, Tensor indices, SymInt padding_idx=-1, bool scale_grad_by_freq=False,
#     bool sparse=False) -> Tensor
@lowering(aten.embedding.default)
def embedding(ctx, weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    return jnp.take(weight, indices, axis=0, mode="clip")


def _scatter_index(index, dim):
    """Full index tuple for torch's scatter/gather: ``index`` on ``dim``, position elsewhere."""
    return tuple(index if d == dim else lax.broadcasted_iota(jnp.int32, index.shape, d) for d in range(index.ndim))


# aten::gather(Tensor self, int dim, Tensor index, *, bool sparse_grad=False) -> Tensor
@lowering(aten.gather.default)
def gather(ctx, x, dim, index, sparse_grad=False):
    if x.ndim == 0:
        return x.reshape(index.shape)
    d = norm_dim(dim, x.ndim)
    idx = jnp.where(index < 0, index + x.shape[d], index)
    return x[_scatter_index(idx, d)]


def _scatter_setup(x, dim, index, src):
    d = norm_dim(dim, x.ndim)
    idx = jnp.where(index < 0, index + x.shape[d], index)
    where = _scatter_index(idx, d)
    if hasattr(src, "shape") and src.ndim:
        src = src[tuple(slice(0, s) for s in index.shape)]  # torch reads src only over index's extent
    return d, where, src


# aten::scatter.src(Tensor self, int dim, Tensor index, Tensor src) -> Tensor
# aten::scatter.value(Tensor self, int dim, Tensor index, Scalar value) -> Tensor
@lowering(aten.scatter.src, aten.scatter.value)
def scatter(ctx, x, dim, index, src):
    _, where, src = _scatter_setup(x, dim, index, src)
    return x.at[where].set(cast(src, x.dtype), mode="drop")


# aten::scatter_add(Tensor self, int dim, Tensor index, Tensor src) -> Tensor
@lowering(aten.scatter_add.default)
def scatter_add(ctx, x, dim, index, src):
    _, where, src = _scatter_setup(x, dim, index, src)
    return x.at[where].add(cast(src, x.dtype), mode="drop")


_IDENTITY = {"sum": 0, "prod": 1, "mean": 0}


# aten::scatter_reduce.two(Tensor self, int dim, Tensor index, Tensor src, str reduce, *,
#     bool include_self=True) -> Tensor
@lowering(aten.scatter_reduce.two)
def scatter_reduce(ctx, x, dim, index, src, reduce, include_self=True):
    _, where, src = _scatter_setup(x, dim, index, src)
    src = cast(src, x.dtype)
    base = x
    if not include_self:  # touched positions start from the reduction's identity
        if reduce in _IDENTITY:
            ident = _IDENTITY[reduce]
        elif jnp.issubdtype(x.dtype, jnp.floating):
            ident = -jnp.inf if reduce == "amax" else jnp.inf
        else:
            info = jnp.iinfo(x.dtype)
            ident = info.min if reduce == "amax" else info.max
        base = x.at[where].set(ident, mode="drop")
    ref = base.at[where]
    if reduce == "sum":
        return ref.add(src, mode="drop")
    if reduce == "prod":
        return ref.multiply(src, mode="drop")
    if reduce == "amax":
        return ref.max(src, mode="drop")
    if reduce == "amin":
        return ref.min(src, mode="drop")
    if reduce == "mean":
        total = ref.add(src, mode="drop")
        count = jnp.zeros(x.shape, x.dtype).at[where].add(1, mode="drop") + (1 if include_self else 0)
        count = jnp.maximum(count, 1)
        if jnp.issubdtype(x.dtype, jnp.integer):
            return jnp.floor_divide(total, count)
        return total / count
    raise ValueError(f"unknown scatter_reduce reduction {reduce!r}")


# aten::index_add(Tensor self, int dim, Tensor index, Tensor source, *, Scalar alpha=1) -> Tensor
@lowering(aten.index_add.default)
def index_add(ctx, x, dim, index, source, alpha=1):
    d = norm_dim(dim, x.ndim)
    where = (slice(None),) * d + (index,)
    return x.at[where].add(cast(source * alpha if alpha != 1 else source, x.dtype))


# aten::index_copy(Tensor self, int dim, Tensor index, Tensor source) -> Tensor
@lowering(aten.index_copy.default)
def index_copy(ctx, x, dim, index, source):
    d = norm_dim(dim, x.ndim)
    return x.at[(slice(None),) * d + (index,)].set(cast(source, x.dtype))


# aten::index_fill.int_Scalar(Tensor self, int dim, Tensor index, Scalar value) -> Tensor
@lowering(aten.index_fill.int_Scalar)
def index_fill(ctx, x, dim, index, value):
    d = norm_dim(dim, x.ndim)
    return x.at[(slice(None),) * d + (index.reshape(-1),)].set(value)


# aten::slice_scatter(Tensor self, Tensor src, int dim=0, SymInt? start=None, SymInt? end=None,
#     SymInt step=1) -> Tensor
@lowering(aten.slice_scatter.default)
def slice_scatter(ctx, x, src, dim=0, start=None, end=None, step=1):
    d = norm_dim(dim, x.ndim)
    start, limit = slice_bounds(x.shape[d], start, step, src.shape[d])
    src = cast(src, x.dtype)
    if step == 1:
        starts = [0] * x.ndim
        starts[d] = start
        return lax.dynamic_update_slice(x, src, tuple(starts))
    where = (slice(None),) * d + (slice(start, limit, step),)
    return x.at[where].set(src)


# aten::select_scatter(Tensor self, Tensor src, int dim, SymInt index) -> Tensor
@lowering(aten.select_scatter.default)
def select_scatter(ctx, x, src, dim, index):
    d = norm_dim(dim, x.ndim)
    if isinstance(index, int) and index < 0:
        index = index + x.shape[d]
    starts = [0] * x.ndim
    starts[d] = index
    return lax.dynamic_update_slice(x, jnp.expand_dims(cast(src, x.dtype), d), tuple(starts))


# aten::masked_fill.Scalar(Tensor self, Tensor mask, Scalar value) -> Tensor
# aten::masked_fill.Tensor(Tensor self, Tensor mask, Tensor value) -> Tensor
@lowering(aten.masked_fill.Scalar, aten.masked_fill.Tensor)
def masked_fill(ctx, x, mask, value):
    return jnp.where(mask, cast(value, ctx.out_dtype), cast(x, ctx.out_dtype))


# aten::masked_scatter(Tensor self, Tensor mask, Tensor source) -> Tensor
# The k-th True position of the (broadcast) mask takes source's k-th element (row-major).
@lowering(aten.masked_scatter.default)
def masked_scatter(ctx, x, mask, source):
    mask = jnp.broadcast_to(mask, x.shape).reshape(-1)
    pos = jnp.cumsum(mask.astype(jnp.int32)) - 1
    taken = jnp.take(cast(source, x.dtype).reshape(-1), jnp.clip(pos, 0, None), mode="clip")
    return jnp.where(mask, taken, x.reshape(-1)).reshape(x.shape)
