"""Views and layout ops: reshape, permute, expand, squeeze, cat/split/stack, repeat,
pixel (un)shuffle, as_strided, diagonal.

Functionalized graphs carry no aliasing, so every view is a value here.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from .helpers import cast, norm_dim, norm_dims, static_int
from .registry import lowering, supported_if

aten = torch.ops.aten


# aten::view(Tensor(a) self, SymInt[] size) -> Tensor(a)
# aten::_unsafe_view(Tensor self, SymInt[] size) -> Tensor
# aten::view_copy(Tensor self, SymInt[] size) -> Tensor
# aten::reshape(Tensor(a) self, SymInt[] shape) -> Tensor(a)
@lowering(aten.view.default, aten._unsafe_view.default, aten.view_copy.default, aten.reshape.default)
def view(ctx, x, size):
    if list(size).count(-1) == 1 and not all(isinstance(s, int) for s in size):
        size = ctx.out_shape  # -1 next to a symbolic dim: use the size torch worked out
    return jnp.reshape(x, tuple(size))


# aten::clone(Tensor self, *, MemoryFormat? memory_format=None) -> Tensor
# aten::alias(Tensor(a) self) -> Tensor(a);  aten::lift_fresh_copy(Tensor self) -> Tensor
# aten::detach(Tensor(a) self) -> Tensor(a);  aten::contiguous(Tensor(a) self, *, MemoryFormat ...)
@lowering(aten.clone.default, aten.alias.default, aten.lift_fresh_copy.default, aten.detach.default,
          aten.contiguous.default)
def identity(ctx, x, *_):
    return x


# aten::permute(Tensor(a) self, int[] dims) -> Tensor(a)
@lowering(aten.permute.default, aten.permute_copy.default)
def permute(ctx, x, dims):
    return jnp.transpose(x, norm_dims(dims, x.ndim) if x.ndim else ())


# aten::transpose.int(Tensor(a) self, int dim0, int dim1) -> Tensor(a)
@lowering(aten.transpose.int)
def transpose(ctx, x, dim0, dim1):
    return jnp.swapaxes(x, norm_dim(dim0, x.ndim), norm_dim(dim1, x.ndim)) if x.ndim else x


# aten::t(Tensor(a) self) -> Tensor(a)
@lowering(aten.t.default)
def t(ctx, x):
    return x.T


# aten::expand(Tensor(a) self, SymInt[] size, *, bool implicit=False) -> Tensor(a)
@lowering(aten.expand.default, aten.expand_copy.default)
def expand(ctx, x, size, implicit=False):
    lead = len(size) - x.ndim
    shape = [x.shape[i - lead] if (isinstance(s, int) and s == -1) else s for i, s in enumerate(size)]
    return jnp.broadcast_to(x, tuple(shape))


def _squeezable(x, dims):
    return tuple(d for d in dims if static_int(x.shape[d]) == 1)


# aten::squeeze.dims(Tensor(a) self, int[] dim) -> Tensor(a)   (only size-1 dims go, as torch)
# aten::squeeze.dim(Tensor(a) self, int dim) -> Tensor(a)
@lowering(aten.squeeze.dims, aten.squeeze.dim, aten.squeeze_copy.dims, aten.squeeze_copy.dim)
def squeeze_dims(ctx, x, dim):
    if x.ndim == 0:
        return x
    return jnp.squeeze(x, _squeezable(x, norm_dims([dim] if isinstance(dim, int) else dim, x.ndim)))


# aten::squeeze(Tensor(a) self) -> Tensor(a)
@lowering(aten.squeeze.default)
def squeeze(ctx, x):
    return jnp.squeeze(x, _squeezable(x, range(x.ndim)))


# aten::unsqueeze(Tensor(a) self, int dim) -> Tensor(a)
@lowering(aten.unsqueeze.default, aten.unsqueeze_copy.default)
def unsqueeze(ctx, x, dim):
    return jnp.expand_dims(x, dim + x.ndim + 1 if dim < 0 else dim)


# aten::cat(Tensor[] tensors, int dim=0) -> Tensor
@lowering(aten.cat.default)
def cat(ctx, tensors, dim=0):
    # torch still accepts legacy empty 1-d tensors (shape (0,)) next to n-d ones; drop them.
    ts = [cast(t, ctx.out_dtype) for t in tensors if not (t.ndim == 1 and static_int(t.shape[0]) == 0)]
    if not ts:
        return jnp.zeros(ctx.out_shape, ctx.out_dtype)
    return jnp.concatenate(ts, axis=norm_dim(dim, ts[0].ndim))


# aten::stack(Tensor[] tensors, int dim=0) -> Tensor
@lowering(aten.stack.default)
def stack(ctx, tensors, dim=0):
    ts = [cast(t, ctx.out_dtype) for t in tensors]
    return jnp.stack(ts, axis=dim + ts[0].ndim + 1 if dim < 0 else dim)


def _split_at(x, sizes, dim):
    d = norm_dim(dim, x.ndim)
    out, start = [], 0
    for s in sizes:
        out.append(lax.slice_in_dim(x, start, start + s, axis=d))
        start = start + s
    return out


# aten::split_with_sizes(Tensor(a -> *) self, SymInt[] split_sizes, int dim=0) -> Tensor(a)[]
@lowering(aten.split_with_sizes.default, aten.split_with_sizes_copy.default)
def split_with_sizes(ctx, x, split_sizes, dim=0):
    return _split_at(x, split_sizes, dim)


# aten::split.Tensor(Tensor(a -> *) self, SymInt split_size, int dim=0) -> Tensor(a)[]
@lowering(aten.split.Tensor, aten.split_copy.Tensor)
def split(ctx, x, split_size, dim=0):
    sizes = [aval.shape[norm_dim(dim, x.ndim)] for aval in ctx.out_avals]
    return _split_at(x, sizes, dim)


# aten::unbind.int(Tensor(a -> *) self, int dim=0) -> Tensor(a)[]
@lowering(aten.unbind.int, aten.unbind_copy.int)
def unbind(ctx, x, dim=0):
    d = norm_dim(dim, x.ndim)
    return [lax.index_in_dim(x, i, axis=d, keepdims=False) for i in range(x.shape[d])]


# aten::repeat(Tensor self, SymInt[] repeats) -> Tensor
@lowering(aten.repeat.default)
def repeat(ctx, x, repeats):
    x = x.reshape((1,) * (len(repeats) - x.ndim) + tuple(x.shape))
    return jnp.tile(x, tuple(repeats))


# aten::repeat_interleave.self_int(Tensor self, SymInt repeats, int? dim=None, *, SymInt? output_size=None)
@lowering(aten.repeat_interleave.self_int)
def repeat_interleave(ctx, x, repeats, dim=None, output_size=None):
    if dim is None:
        return jnp.repeat(x.reshape(-1), repeats)
    return jnp.repeat(x, repeats, axis=norm_dim(dim, x.ndim))


# aten::pixel_shuffle(Tensor self, int upscale_factor) -> Tensor
@lowering(aten.pixel_shuffle.default)
def pixel_shuffle(ctx, x, upscale_factor):
    r = upscale_factor
    *lead, c, h, w = x.shape
    x = x.reshape(*lead, c // (r * r), r, r, h, w)
    n = len(lead)
    x = jnp.transpose(x, tuple(range(n)) + (n, n + 3, n + 1, n + 4, n + 2))
    return x.reshape(*lead, c // (r * r), h * r, w * r)


# aten::pixel_unshuffle(Tensor self, int downscale_factor) -> Tensor
@lowering(aten.pixel_unshuffle.default)
def pixel_unshuffle(ctx, x, downscale_factor):
    r = downscale_factor
    *lead, c, h, w = x.shape
    x = x.reshape(*lead, c, h // r, r, w // r, r)
    n = len(lead)
    x = jnp.transpose(x, tuple(range(n)) + (n, n + 2, n + 4, n + 1, n + 3))
    return x.reshape(*lead, c * r * r, h // r, w // r)


def _meta_ints(values) -> list:
    # size/stride entries are ints, or fx Nodes (sym_size) whose value is a SymInt
    return [v.meta["val"] if isinstance(v, torch.fx.Node) else v for v in values]


def _as_strided_is_restride(node) -> bool:
    """True when as_strided only restates the layout of its (dense) input: same sizes, and
    the same strides on every dim of size > 1 (what decompositions emit for memory formats)."""
    x = node.args[0].meta["val"]
    size, stride = _meta_ints(node.args[1]), _meta_ints(node.args[2])
    offset = node.args[3] if len(node.args) > 3 else node.kwargs.get("storage_offset")
    if offset not in (None, 0) or len(size) != x.dim():
        return False
    for d, (s, st) in enumerate(zip(size, stride)):
        if str(s) != str(x.shape[d]):
            return False
        if str(s) != "1" and str(st) != str(x.stride()[d]):
            return False
    return True


def _as_strided_static(node) -> bool:
    vals = [node.args[0].meta["val"].shape, node.args[0].meta["val"].stride(), node.args[1], node.args[2]]
    return all(isinstance(v, int) for part in vals for v in part)


# aten::as_strided(Tensor(a) self, SymInt[] size, SymInt[] stride, SymInt? storage_offset=None) -> Tensor(a)
@lowering(aten.as_strided.default, aten.as_strided_copy.default)
@supported_if(lambda n: _as_strided_is_restride(n) or _as_strided_static(n))
def as_strided(ctx, x, size, stride, storage_offset=None):
    if _as_strided_is_restride(ctx.node):
        return x
    # General case: rebuild the input's storage from its recorded strides, then gather.
    meta = ctx.node.args[0].meta["val"]
    in_stride = meta.stride()
    order = sorted(range(x.ndim), key=lambda d: -in_stride[d])
    storage_len = 1 + sum((s - 1) * st for s, st in zip(meta.shape, in_stride) if s > 0)
    storage = jnp.transpose(x, order).reshape(-1)
    if storage.shape[0] != storage_len:
        raise NotImplementedError("as_strided over a non-dense input")
    pos = np.full(tuple(size), storage_offset or 0, dtype=np.int64)
    for d, (s, st) in enumerate(zip(size, stride)):
        shape = [1] * len(size)
        shape[d] = s
        pos = pos + (np.arange(s) * st).reshape(shape)
    return jnp.take(storage, jnp.asarray(pos.astype(np.int32)))


# aten::diagonal(Tensor(a) self, int offset=0, int dim1=0, int dim2=1) -> Tensor(a)
@lowering(aten.diagonal.default, aten.diagonal_copy.default)
def diagonal(ctx, x, offset=0, dim1=0, dim2=1):
    return jnp.diagonal(x, offset, norm_dim(dim1, x.ndim), norm_dim(dim2, x.ndim))
