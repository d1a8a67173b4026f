"""Math ops with no LiteRT builtin, written as short sequences of builtins."""

from __future__ import annotations

import numpy as np
import torch

from converter.registry import arguments

from .ops_elementwise import binary, unary
from .ops_reduce import _dims, reduce
from .registry import lowering, supported_if

__all__ = []

aten = torch.ops.aten

# Abramowitz & Stegun 7.1.26: |error| <= 1.5e-7 over the whole real line
_ERF_P = 0.3275911
_ERF_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)


# erf(Tensor self) -> Tensor
@lowering(aten.erf.default)
def erf(lw, x):
    s = x.shape
    ax = unary(lw, "ABS", x)
    t = binary(lw, "DIV", 1.0, binary(lw, "ADD", binary(lw, "MUL", ax, _ERF_P, shape=s), 1.0, shape=s), shape=s)
    poly = lw.const(np.array(_ERF_A[-1], x.dtype))
    for a in reversed(_ERF_A[:-1]):
        poly = binary(lw, "ADD", binary(lw, "MUL", t, poly, shape=s), a, shape=s)
    poly = binary(lw, "MUL", poly, t, shape=s)
    e = unary(lw, "EXP", unary(lw, "NEG", unary(lw, "SQUARE", x)))
    y = binary(lw, "SUB", 1.0, binary(lw, "MUL", poly, e, shape=s), shape=s)
    return binary(lw, "MUL", unary(lw, "SIGN", x), y, shape=s)


# logical_xor(Tensor self, Tensor other) -> Tensor
@lowering(aten.logical_xor.default)
def logical_xor(lw, a, b):
    def as_bool(v):
        return v if v.dtype == np.bool_ else binary(lw, "NOT_EQUAL", v, 0, dtype=v.dtype, shape=v.shape)
    return binary(lw, "NOT_EQUAL", as_bool(a), as_bool(b), dtype=np.bool_)


# bitwise_xor.Tensor(Tensor self, Tensor other) -> Tensor
@lowering(aten.bitwise_xor.Tensor)
def bitwise_xor(lw, a, b):
    if lw.out_dtype == np.bool_:
        return binary(lw, "NOT_EQUAL", a, b, dtype=np.bool_)
    return binary(lw, "BITWISE_XOR", a, b)


# bitwise_right_shift.Tensor(Tensor self, Tensor other) -> Tensor
@lowering(aten.bitwise_right_shift.Tensor)
def bitwise_right_shift(lw, a, b):
    return binary(lw, "RIGHT_SHIFT", a, b)


# fmod.Tensor(Tensor self, Tensor other) -> Tensor ; fmod.Scalar(Tensor self, Scalar other) -> Tensor
# a - b * trunc(a / b): integer DIV truncates already; for floats trunc = floor or ceil by sign
@lowering(aten.fmod.Tensor, aten.fmod.Scalar)
def fmod(lw, a, b):
    dtype = lw.out_dtype
    q = binary(lw, "DIV", a, b)
    if dtype.kind == "f":
        neg = binary(lw, "LESS", q, 0.0, dtype=dtype, shape=q.shape)
        fl, ce = unary(lw, "FLOOR", q), unary(lw, "CEIL", q)
        q = lw.op("SELECT_V2", [lw.tensor(neg), lw.tensor(ce), lw.tensor(fl, ce.perm)], q.shape, dtype, ce.perm)
    return binary(lw, "SUB", a, binary(lw, "MUL", q, b))


# linalg_vector_norm(Tensor self, Scalar ord=2, int[1]? dim=None, bool keepdim=False, *, ScalarType? dtype=None)
@lowering(aten.linalg_vector_norm.default)
@supported_if(lambda n: arguments(n)["ord"] in (1, 2, float("inf")))
def vector_norm(lw, x, ord=2, dim=None, keepdim=False, *_):  # noqa: A002 - ATen's argument name
    dims = _dims(x, dim)
    if ord == 2:
        return unary(lw, "SQRT", reduce(lw, "SUM", unary(lw, "SQUARE", x), dims, keepdim))
    if ord == 1:
        return reduce(lw, "SUM", unary(lw, "ABS", x), dims, keepdim)
    return reduce(lw, "REDUCE_MAX", unary(lw, "ABS", x), dims, keepdim)
