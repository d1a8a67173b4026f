"""Comparisons, logical and bitwise ops, where, and the isnan family.

Comparisons keep jax's promotion of the two operands (torch compares in the promoted dtype
too) and give bool; logical ops treat any nonzero as true, as torch does.
"""

from __future__ import annotations

import jax.numpy as jnp
import torch

from .helpers import cast, cast_all
from .registry import lowering

aten = torch.ops.aten

_COMPARE = {
    "eq": jnp.equal,
    "ne": jnp.not_equal,
    "lt": jnp.less,
    "le": jnp.less_equal,
    "gt": jnp.greater,
    "ge": jnp.greater_equal,
}


def _compare(jfn):
    def lower(ctx, x, y):
        return jfn(x, y)

    return lower


# aten::{eq,ne,lt,le,gt,ge}.Tensor(Tensor self, Tensor other) -> Tensor
# aten::{eq,ne,lt,le,gt,ge}.Scalar(Tensor self, Scalar other) -> Tensor
for _name, _jfn in _COMPARE.items():
    _packet = getattr(aten, _name)
    lowering(_packet.Tensor, _packet.Scalar)(_compare(_jfn))


# aten::logical_not(Tensor self) -> Tensor
@lowering(aten.logical_not.default)
def logical_not(ctx, x):
    return jnp.logical_not(x)


# aten::logical_and(Tensor self, Tensor other) -> Tensor
@lowering(aten.logical_and.default)
def logical_and(ctx, x, y):
    return jnp.logical_and(x, y)


# aten::logical_or(Tensor self, Tensor other) -> Tensor
@lowering(aten.logical_or.default)
def logical_or(ctx, x, y):
    return jnp.logical_or(x, y)


# aten::logical_xor(Tensor self, Tensor other) -> Tensor
@lowering(aten.logical_xor.default)
def logical_xor(ctx, x, y):
    return jnp.logical_xor(x, y)


# aten::bitwise_{and,or,xor}.Tensor(Tensor self, Tensor other) -> Tensor
# aten::bitwise_{and,or,xor}.Scalar(Tensor self, Scalar other) -> Tensor
def _bitwise(jfn):
    def lower(ctx, x, y):
        return jfn(*cast_all(ctx.out_dtype, x, y))

    return lower


for _name, _jfn in {"bitwise_and": jnp.bitwise_and, "bitwise_or": jnp.bitwise_or,
                    "bitwise_xor": jnp.bitwise_xor}.items():
    _packet = getattr(aten, _name)
    lowering(_packet.Tensor, _packet.Scalar)(_bitwise(_jfn))


# aten::bitwise_left_shift.Tensor / bitwise_right_shift.Tensor(Tensor self, Tensor other) -> Tensor
_SHIFT = {aten.bitwise_left_shift.Tensor: jnp.left_shift, aten.bitwise_right_shift.Tensor: jnp.right_shift}


@lowering(*_SHIFT)
def shift(ctx, x, y):
    return _SHIFT[ctx.node.target](*cast_all(ctx.out_dtype, x, y))


# aten::where.self(Tensor condition, Tensor self, Tensor other) -> Tensor
@lowering(aten.where.self)
def where(ctx, cond, x, y):
    x, y = cast_all(ctx.out_dtype, x, y)
    return jnp.where(cast(cond, jnp.bool_), x, y)


# aten::isnan / isinf / isposinf / isneginf / isfinite / signbit(Tensor self) -> Tensor
_PREDICATE = {aten.isnan.default: jnp.isnan, aten.isinf.default: jnp.isinf, aten.isposinf.default: jnp.isposinf,
              aten.isneginf.default: jnp.isneginf, aten.isfinite.default: jnp.isfinite,
              aten.signbit.default: jnp.signbit}


@lowering(*_PREDICATE)
def predicate(ctx, x):
    return _PREDICATE[ctx.node.target](x)
