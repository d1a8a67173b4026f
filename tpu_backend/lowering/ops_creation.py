"""Tensor creation and dtype conversion: full/zeros/ones/empty (+ _like), arange, scalar_tensor,
_to_copy, copy. Output dtypes come from the node (already narrowed to 32 bits by the policy)."""

from __future__ import annotations

import jax.numpy as jnp
import torch
from jax import lax

from .helpers import cast
from .registry import lowering

aten = torch.ops.aten


def _filled(ctx, shape, value):
    return jnp.full(tuple(shape), value, dtype=ctx.out_dtype)


# aten::full(SymInt[] size, Scalar fill_value, *, ScalarType? dtype=None, Layout? layout=None,
#     Device? device=None, bool? pin_memory=None) -> Tensor
@lowering(aten.full.default)
def full(ctx, size, fill_value, *_):
    return _filled(ctx, size, fill_value)


# aten::full_like(Tensor self, Scalar fill_value, *, ScalarType? dtype=None, ..., MemoryFormat? memory_format=None)
@lowering(aten.full_like.default)
def full_like(ctx, x, fill_value, *_):
    return _filled(ctx, x.shape, fill_value)


# aten::zeros(SymInt[] size, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None)
# aten::empty.memory_format(SymInt[] size, *, ScalarType? dtype=None, ..., MemoryFormat? memory_format=None)
# aten::empty_strided(SymInt[] size, SymInt[] stride, *, ScalarType? dtype=None, ...)
@lowering(aten.zeros.default, aten.empty.memory_format, aten.empty_strided.default)
def zeros(ctx, size, *_):
    return _filled(ctx, size, 0)  # empty's contents are unspecified; zeros are one valid choice


# aten::ones(SymInt[] size, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None)
@lowering(aten.ones.default)
def ones(ctx, size, *_):
    return _filled(ctx, size, 1)


# aten::zeros_like(Tensor self, *, ScalarType? dtype=None, ..., MemoryFormat? memory_format=None) -> Tensor
# aten::empty_like(Tensor self, *, ScalarType? dtype=None, ..., MemoryFormat? memory_format=None) -> Tensor
@lowering(aten.zeros_like.default, aten.empty_like.default)
def zeros_like(ctx, x, *_):
    return _filled(ctx, x.shape, 0)


# aten::ones_like(Tensor self, *, ScalarType? dtype=None, ..., MemoryFormat? memory_format=None) -> Tensor
@lowering(aten.ones_like.default)
def ones_like(ctx, x, *_):
    return _filled(ctx, x.shape, 1)


# aten::new_full(Tensor self, SymInt[] size, Scalar fill_value, *, ScalarType? dtype=None, ...) -> Tensor
@lowering(aten.new_full.default)
def new_full(ctx, x, size, fill_value, *_):
    return _filled(ctx, size, fill_value)


# aten::new_zeros(Tensor self, SymInt[] size, *, ScalarType? dtype=None, ...) -> Tensor
# aten::new_empty(Tensor self, SymInt[] size, *, ScalarType? dtype=None, ...) -> Tensor
# aten::new_empty_strided(Tensor self, SymInt[] size, SymInt[] stride, *, ScalarType? dtype=None, ...)
@lowering(aten.new_zeros.default, aten.new_empty.default, aten.new_empty_strided.default)
def new_zeros(ctx, x, size, *_):
    return _filled(ctx, size, 0)


# aten::new_ones(Tensor self, SymInt[] size, *, ScalarType? dtype=None, ...) -> Tensor
@lowering(aten.new_ones.default)
def new_ones(ctx, x, size, *_):
    return _filled(ctx, size, 1)


# aten::scalar_tensor(Scalar s, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None,
#     bool? pin_memory=None) -> Tensor
@lowering(aten.scalar_tensor.default)
def scalar_tensor(ctx, s, *_):
    return jnp.asarray(s, dtype=ctx.out_dtype)


def _arange(ctx, start, step):
    # The length torch recorded (possibly symbolic); values start + i*step, as torch computes them.
    n = ctx.out_shape[0]
    dt = ctx.out_dtype
    if jnp.issubdtype(dt, jnp.integer):
        return lax.iota(dt, n) * step + start if (step != 1 or start != 0) else lax.iota(dt, n)
    i = lax.iota(jnp.float32 if dt != jnp.float64 else dt, n)
    return cast(i * step + start, dt)


# aten::arange.start_step(Scalar start, Scalar end, Scalar step=1, *, ScalarType? dtype=None, ...) -> Tensor
@lowering(aten.arange.start_step)
def arange_start_step(ctx, start, end, step=1, *_):
    return _arange(ctx, start, step)


# aten::arange.start(Scalar start, Scalar end, *, ScalarType? dtype=None, ...) -> Tensor
@lowering(aten.arange.start)
def arange_start(ctx, start, end, *_):
    return _arange(ctx, start, 1)


# aten::arange(Scalar end, *, ScalarType? dtype=None, ...) -> Tensor
@lowering(aten.arange.default)
def arange(ctx, end, *_):
    return _arange(ctx, 0, 1)


# aten::linspace(Scalar start, Scalar end, int steps, *, ScalarType? dtype=None, ...) -> Tensor
@lowering(aten.linspace.default)
def linspace(ctx, start, end, steps, *_):
    return jnp.linspace(start, end, steps, dtype=jnp.float32).astype(ctx.out_dtype)


# aten::eye(SymInt n, *, ScalarType? dtype=None, ...) -> Tensor
@lowering(aten.eye.default)
def eye(ctx, n, *_):
    return jnp.eye(n, dtype=ctx.out_dtype)


# aten::_to_copy(Tensor self, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None,
#     bool? pin_memory=None, bool non_blocking=False, MemoryFormat? memory_format=None) -> Tensor
# aten::_to_copy's result dtype is the node's (narrowed) dtype; float -> int truncates, as torch.
@lowering(aten._to_copy.default)
def to_copy(ctx, x, *_):
    return cast(x, ctx.out_dtype)


# aten::to.dtype(Tensor(a) self, ScalarType dtype, bool non_blocking=False, bool copy=False,
#     MemoryFormat? memory_format=None) -> Tensor(a)
@lowering(aten.to.dtype)
def to_dtype(ctx, x, *_):
    return cast(x, ctx.out_dtype)


# aten::copy(Tensor self, Tensor src, bool non_blocking=False) -> Tensor
@lowering(aten.copy.default)
def copy(ctx, x, src, non_blocking=False):
    return jnp.broadcast_to(cast(src, x.dtype), x.shape)


# aten::fill.Scalar(Tensor self, Scalar value) -> Tensor
# aten::fill.Tensor(Tensor self, Tensor value) -> Tensor
@lowering(aten.fill.Scalar, aten.fill.Tensor)
def fill(ctx, x, value):
    return jnp.broadcast_to(cast(value, ctx.out_dtype), x.shape)
