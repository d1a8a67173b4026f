"""Elementwise math: unary functions and binary arithmetic.

Arithmetic runs in the node's output dtype (torch's promoted dtype): tensor operands are cast
to it first, python scalars stay weakly typed. That reproduces torch's promotion (int tensor
/ int tensor -> float, int tensor * 0.5 -> float) without re-deriving its rules.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch
from jax import lax

from .helpers import cast, cast_all, is_array
from .registry import lowering

aten = torch.ops.aten


def _unary(jfn):
    def lower(ctx, x):
        return jfn(cast(x, ctx.out_dtype))

    lower.__name__ = getattr(jfn, "__name__", "unary")
    return lower


# aten::<name>(Tensor self) -> Tensor, for each op below: a float function of one tensor.
_UNARY = {
    aten.abs.default: jnp.abs,
    aten.neg.default: jnp.negative,
    aten.exp.default: jnp.exp,
    aten.exp2.default: jnp.exp2,
    aten.expm1.default: jnp.expm1,
    aten.log.default: jnp.log,
    aten.log1p.default: jnp.log1p,
    aten.log2.default: jnp.log2,
    aten.log10.default: jnp.log10,
    aten.sqrt.default: jnp.sqrt,
    aten.rsqrt.default: lax.rsqrt,
    aten.sin.default: jnp.sin,
    aten.cos.default: jnp.cos,
    aten.tan.default: jnp.tan,
    aten.asin.default: jnp.arcsin,
    aten.acos.default: jnp.arccos,
    aten.atan.default: jnp.arctan,
    aten.sinh.default: jnp.sinh,
    aten.cosh.default: jnp.cosh,
    aten.tanh.default: jnp.tanh,
    aten.asinh.default: jnp.arcsinh,
    aten.acosh.default: jnp.arccosh,
    aten.atanh.default: jnp.arctanh,
    aten.erf.default: jax.scipy.special.erf,
    aten.erfinv.default: jax.scipy.special.erfinv,
    aten.reciprocal.default: jnp.reciprocal,
    aten.sign.default: jnp.sign,
    aten.sgn.default: jnp.sign,
    aten.floor.default: jnp.floor,
    aten.ceil.default: jnp.ceil,
    aten.trunc.default: jnp.trunc,
    aten.round.default: jnp.round,  # half to even, as torch
    aten.frac.default: lambda x: x - jnp.trunc(x),
    aten.sigmoid.default: jax.nn.sigmoid,
    aten.lgamma.default: jax.scipy.special.gammaln,
    aten.digamma.default: jax.scipy.special.digamma,
    aten.i0.default: jax.scipy.special.i0,
    aten.bitwise_not.default: jnp.invert,
}
for _op, _jfn in _UNARY.items():
    lowering(_op)(_unary(_jfn))


# aten::round.decimals(Tensor self, *, int decimals) -> Tensor
@lowering(aten.round.decimals)
def round_decimals(ctx, x, decimals):
    return jnp.round(cast(x, ctx.out_dtype), decimals)


# aten::add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor
# aten::add.Scalar(Tensor self, Scalar other, Scalar alpha=1) -> Tensor
@lowering(aten.add.Tensor, aten.add.Scalar)
def add(ctx, x, y, alpha=1):
    x, y = cast_all(ctx.out_dtype, x, y)
    return x + (y if alpha == 1 else y * alpha)


# aten::sub.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor
# aten::sub.Scalar(Tensor self, Scalar other, Scalar alpha=1) -> Tensor
@lowering(aten.sub.Tensor, aten.sub.Scalar)
def sub(ctx, x, y, alpha=1):
    x, y = cast_all(ctx.out_dtype, x, y)  # self may be a python scalar: (1.0 - mask)
    return x - (y if alpha == 1 else y * alpha)


# aten::rsub.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor
# aten::rsub.Scalar(Tensor self, Scalar other, Scalar alpha=1) -> Tensor
@lowering(aten.rsub.Tensor, aten.rsub.Scalar)
def rsub(ctx, x, y, alpha=1):
    x, y = cast_all(ctx.out_dtype, x, y)
    return y - (x if alpha == 1 else x * alpha)


# aten::mul.Tensor(Tensor self, Tensor other) -> Tensor
# aten::mul.Scalar(Tensor self, Scalar other) -> Tensor
@lowering(aten.mul.Tensor, aten.mul.Scalar)
def mul(ctx, x, y):
    x, y = cast_all(ctx.out_dtype, x, y)
    if ctx.out_dtype == jnp.bool_:
        return jnp.logical_and(x, y)
    return x * y


# aten::div.Tensor(Tensor self, Tensor other) -> Tensor
# aten::div.Scalar(Tensor self, Scalar other) -> Tensor
@lowering(aten.div.Tensor, aten.div.Scalar)
def div(ctx, x, y):
    x, y = cast_all(ctx.out_dtype, x, y)
    return jnp.true_divide(x, y)


def _div_rounded(x, y, rounding_mode):
    if rounding_mode is None:
        return jnp.true_divide(x, y)
    if rounding_mode == "floor":
        return jnp.floor_divide(x, y)
    if rounding_mode == "trunc":
        if jnp.issubdtype(jnp.result_type(x), jnp.integer):
            y = cast(y, jnp.result_type(x)) if not is_array(y) else y
            return lax.div(*jnp.broadcast_arrays(x, y))  # C division truncates
        return jnp.trunc(jnp.true_divide(x, y))
    raise ValueError(f"unknown rounding_mode {rounding_mode!r}")


# aten::div.Tensor_mode(Tensor self, Tensor other, *, str? rounding_mode) -> Tensor
# aten::div.Scalar_mode(Tensor self, Scalar other, *, str? rounding_mode) -> Tensor
@lowering(aten.div.Tensor_mode, aten.div.Scalar_mode)
def div_mode(ctx, x, y, rounding_mode=None):
    x, y = cast_all(ctx.out_dtype, x, y)
    return _div_rounded(x, y, rounding_mode)


# aten::floor_divide(Tensor self, Tensor other) -> Tensor
# aten::floor_divide.Scalar(Tensor self, Scalar other) -> Tensor
@lowering(aten.floor_divide.default, aten.floor_divide.Scalar)
def floor_divide(ctx, x, y):
    x, y = cast_all(ctx.out_dtype, x, y)
    return jnp.floor_divide(x, y)


# aten::remainder.Tensor(Tensor self, Tensor other) -> Tensor   (sign of the divisor, as python %)
# aten::remainder.Scalar(Tensor self, Scalar other) -> Tensor
@lowering(aten.remainder.Tensor, aten.remainder.Scalar)
def remainder(ctx, x, y):
    x, y = cast_all(ctx.out_dtype, x, y)
    return jnp.remainder(x, y)


# aten::fmod.Tensor(Tensor self, Tensor other) -> Tensor   (sign of the dividend, as C fmod)
# aten::fmod.Scalar(Tensor self, Scalar other) -> Tensor
@lowering(aten.fmod.Tensor, aten.fmod.Scalar)
def fmod(ctx, x, y):
    x, y = cast_all(ctx.out_dtype, x, y)
    return jnp.fmod(x, y)


def _pow(x, p):
    if not is_array(p):
        if float(p).is_integer() and abs(p) <= 64:
            return lax.integer_pow(x, int(p)) if p >= 0 or jnp.issubdtype(x.dtype, jnp.inexact) else x**p
        if p == 0.5:
            return jnp.sqrt(x)
        if p == -0.5:
            return lax.rsqrt(x)
    return jnp.power(x, p)


# aten::pow.Tensor_Scalar(Tensor self, Scalar exponent) -> Tensor
@lowering(aten.pow.Tensor_Scalar)
def pow_tensor_scalar(ctx, x, exponent):
    return _pow(cast(x, ctx.out_dtype), exponent)


# aten::pow.Tensor_Tensor(Tensor self, Tensor exponent) -> Tensor
@lowering(aten.pow.Tensor_Tensor)
def pow_tensor_tensor(ctx, x, exponent):
    x, exponent = cast_all(ctx.out_dtype, x, exponent)
    return jnp.power(x, exponent)


# aten::pow.Scalar(Scalar self, Tensor exponent) -> Tensor
@lowering(aten.pow.Scalar)
def pow_scalar(ctx, base, exponent):
    return jnp.power(cast(base, ctx.out_dtype), cast(exponent, ctx.out_dtype))


# Binary ops computed in the output dtype by one jnp function each:
# aten::maximum / minimum / fmax / fmin / atan2 / hypot(Tensor self, Tensor other) -> Tensor
# aten::copysign.Tensor / xlogy.Tensor(Tensor self, Tensor other) -> Tensor
# (maximum/minimum propagate NaN, as lax.max; fmax/fmin ignore it)
_BINARY = {aten.maximum.default: jnp.maximum, aten.minimum.default: jnp.minimum, aten.fmax.default: jnp.fmax,
           aten.fmin.default: jnp.fmin, aten.atan2.default: jnp.arctan2, aten.hypot.default: jnp.hypot,
           aten.copysign.Tensor: jnp.copysign, aten.xlogy.Tensor: jax.scipy.special.xlogy}


@lowering(*_BINARY)
def binary(ctx, x, y):
    return _BINARY[ctx.node.target](*cast_all(ctx.out_dtype, x, y))


# aten::clamp(Tensor self, Scalar? min=None, Scalar? max=None) -> Tensor
# aten::clamp.Tensor(Tensor self, Tensor? min=None, Tensor? max=None) -> Tensor
@lowering(aten.clamp.default, aten.clamp.Tensor)
def clamp(ctx, x, lo=None, hi=None):
    x, lo, hi = cast_all(ctx.out_dtype, x, lo, hi)
    if lo is not None:
        x = jnp.maximum(x, lo)
    if hi is not None:
        x = jnp.minimum(x, hi)  # min > max gives max, as torch
    return x


# aten::clamp_min(Tensor self, Scalar min) -> Tensor
# aten::clamp_min.Tensor(Tensor self, Tensor min) -> Tensor
@lowering(aten.clamp_min.default, aten.clamp_min.Tensor)
def clamp_min(ctx, x, lo):
    return jnp.maximum(*cast_all(ctx.out_dtype, x, lo))


# aten::clamp_max(Tensor self, Scalar max) -> Tensor
# aten::clamp_max.Tensor(Tensor self, Tensor max) -> Tensor
@lowering(aten.clamp_max.default, aten.clamp_max.Tensor)
def clamp_max(ctx, x, hi):
    return jnp.minimum(*cast_all(ctx.out_dtype, x, hi))


# aten::nan_to_num(Tensor self, float? nan=None, float? posinf=None, float? neginf=None) -> Tensor
@lowering(aten.nan_to_num.default)
def nan_to_num(ctx, x, nan=None, posinf=None, neginf=None):
    return jnp.nan_to_num(cast(x, ctx.out_dtype), nan=0.0 if nan is None else nan, posinf=posinf, neginf=neginf)


# aten::lerp.Scalar(Tensor self, Tensor end, Scalar weight) -> Tensor
# aten::lerp.Tensor(Tensor self, Tensor end, Tensor weight) -> Tensor
@lowering(aten.lerp.Scalar, aten.lerp.Tensor)
def lerp(ctx, x, end, weight):
    x, end, weight = cast_all(ctx.out_dtype, x, end, weight)
    return x + weight * (end - x)
