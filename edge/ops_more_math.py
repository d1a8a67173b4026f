"""Inverse trig, hyperbolic and log-base ops, trunc, NaN/Inf tests and scalar bitwise ops.

LiteRT has no builtin for most of these; each is a short sequence of builtins (ATAN2, LOG,
EXP, SQRT, ...), written so the fp32 result stays within 1e-5 of torch's (see edge/op_notes.py).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from .ops_elementwise import binary, unary
from .registry import lowering, supported_if

__all__ = []

aten = torch.ops.aten


def _f(lw, x):
    """x in the node's float output dtype (integer inputs of trig ops promote to float)."""
    return lw.cast(x, lw.out_dtype)


def _one_minus_sq(lw, x):
    # (1 - x)(1 + x) rather than 1 - x*x: no cancellation near |x| = 1
    s = x.shape
    return binary(lw, "MUL", binary(lw, "SUB", 1.0, x, shape=s), binary(lw, "ADD", x, 1.0, shape=s), shape=s)


# atan2(Tensor self, Tensor other) -> Tensor   (the ATAN2 kernel does not broadcast)
@lowering(aten.atan2.default)
@supported_if(lambda n: n.args[0].meta["val"].shape == n.args[1].meta["val"].shape)
def atan2(lw, y, x):
    return binary(lw, "ATAN2", y, x)


# atan(Tensor self) -> Tensor: ATAN2(x, ZEROS_LIKE(x) + 1) (the ATAN2 kernel does not broadcast)
@lowering(aten.atan.default)
def atan(lw, x):
    x = _f(lw, x)
    zeros = lw.op("ZEROS_LIKE", [lw.tensor(x)], x.shape, x.dtype, x.perm, suffix="zeros")
    ones = binary(lw, "ADD", zeros, 1.0, shape=x.shape)
    return binary(lw, "ATAN2", x, ones, shape=x.shape)


# asin(Tensor self) -> Tensor: ATAN2(x, sqrt(1 - x^2))
@lowering(aten.asin.default)
def asin(lw, x):
    x = _f(lw, x)
    return binary(lw, "ATAN2", x, unary(lw, "SQRT", _one_minus_sq(lw, x)), shape=x.shape)


# acos(Tensor self) -> Tensor: ATAN2(sqrt(1 - x^2), x)
@lowering(aten.acos.default)
def acos(lw, x):
    x = _f(lw, x)
    return binary(lw, "ATAN2", unary(lw, "SQRT", _one_minus_sq(lw, x)), x, shape=x.shape)


# tan(Tensor self) -> Tensor: SIN / COS
@lowering(aten.tan.default)
def tan(lw, x):
    x = _f(lw, x)
    return binary(lw, "DIV", unary(lw, "SIN", x), unary(lw, "COS", x), shape=x.shape)


def _exp_pair(lw, x):
    return unary(lw, "EXP", x), unary(lw, "EXP", unary(lw, "NEG", x))


# sinh(Tensor self) -> Tensor: (e^x - e^-x) / 2
@lowering(aten.sinh.default)
def sinh(lw, x):
    x = _f(lw, x)
    ep, en = _exp_pair(lw, x)
    return binary(lw, "MUL", binary(lw, "SUB", ep, en, shape=x.shape), 0.5, shape=x.shape)


# cosh(Tensor self) -> Tensor: (e^x + e^-x) / 2
@lowering(aten.cosh.default)
def cosh(lw, x):
    x = _f(lw, x)
    ep, en = _exp_pair(lw, x)
    return binary(lw, "MUL", binary(lw, "ADD", ep, en, shape=x.shape), 0.5, shape=x.shape)


# asinh(Tensor self) -> Tensor: sign(x) * log(|x| + sqrt(x^2 + 1)) (odd form: no cancellation for x < 0)
@lowering(aten.asinh.default)
def asinh(lw, x):
    x = _f(lw, x)
    s = x.shape
    ax = unary(lw, "ABS", x)
    r = unary(lw, "SQRT", binary(lw, "ADD", unary(lw, "SQUARE", ax), 1.0, shape=s))
    return binary(lw, "MUL", unary(lw, "SIGN", x), unary(lw, "LOG", binary(lw, "ADD", ax, r, shape=s)), shape=s)


# acosh(Tensor self) -> Tensor: log(x + sqrt((x - 1)(x + 1)))
@lowering(aten.acosh.default)
def acosh(lw, x):
    x = _f(lw, x)
    s = x.shape
    r = unary(lw, "SQRT", binary(lw, "MUL", binary(lw, "SUB", x, 1.0, shape=s), binary(lw, "ADD", x, 1.0, shape=s),
                                 shape=s))
    return unary(lw, "LOG", binary(lw, "ADD", x, r, shape=s))


# atanh(Tensor self) -> Tensor: 0.5 * log((1 + x) / (1 - x))
@lowering(aten.atanh.default)
def atanh(lw, x):
    x = _f(lw, x)
    s = x.shape
    q = binary(lw, "DIV", binary(lw, "ADD", x, 1.0, shape=s), binary(lw, "SUB", 1.0, x, shape=s), shape=s)
    return binary(lw, "MUL", unary(lw, "LOG", q), 0.5, shape=s)


# log2(Tensor self) -> Tensor ; log10(Tensor self) -> Tensor: LOG times 1/ln(base)
@lowering(aten.log2.default)
def log2(lw, x):
    return binary(lw, "MUL", unary(lw, "LOG", _f(lw, x)), 1.0 / math.log(2.0), shape=x.shape)


@lowering(aten.log10.default)
def log10(lw, x):
    return binary(lw, "MUL", unary(lw, "LOG", _f(lw, x)), 1.0 / math.log(10.0), shape=x.shape)


# trunc(Tensor self) -> Tensor: FLOOR for x >= 0, CEIL below
@lowering(aten.trunc.default)
def trunc(lw, x):
    if x.dtype.kind != "f":
        return lw.alias(x)
    zero = lw.const(np.zeros((), x.dtype))
    neg = lw.op("LESS", [lw.tensor(x), lw.tensor(zero)], x.shape, np.bool_, x.perm)
    fl, ce = unary(lw, "FLOOR", x), unary(lw, "CEIL", x)
    return lw.op("SELECT_V2", [lw.tensor(neg), lw.tensor(ce), lw.tensor(fl, ce.perm)], x.shape, x.dtype, ce.perm)


# isnan(Tensor self) -> Tensor: x != x
@lowering(aten.isnan.default)
@supported_if(lambda n: n.args[0].meta["val"].dtype.is_floating_point)
def isnan(lw, x):
    return lw.op("NOT_EQUAL", [lw.tensor(x), lw.tensor(x)], x.shape, np.bool_, x.perm)


# isinf(Tensor self) -> Tensor: |x| == inf
@lowering(aten.isinf.default)
@supported_if(lambda n: n.args[0].meta["val"].dtype.is_floating_point)
def isinf(lw, x):
    ax = lw.op("ABS", [lw.tensor(x)], x.shape, x.dtype, x.perm)
    inf = lw.const(np.array(np.inf, x.dtype))
    return lw.op("EQUAL", [lw.tensor(ax), lw.tensor(inf)], x.shape, np.bool_, x.perm)


# bitwise_{and,or}.Scalar(Tensor self, Scalar other) -> Tensor: booleans only (no integer AND/OR builtin)
@lowering(aten.bitwise_and.Scalar)
@supported_if(lambda n: n.meta["val"].dtype == torch.bool)
def bitwise_and_scalar(lw, x, other):
    return binary(lw, "LOGICAL_AND", x, bool(other))


@lowering(aten.bitwise_or.Scalar)
@supported_if(lambda n: n.meta["val"].dtype == torch.bool)
def bitwise_or_scalar(lw, x, other):
    return binary(lw, "LOGICAL_OR", x, bool(other))


# bitwise_xor.Scalar(Tensor self, Scalar other) -> Tensor
@lowering(aten.bitwise_xor.Scalar)
def bitwise_xor_scalar(lw, x, other):
    if lw.out_dtype == np.bool_:
        return binary(lw, "NOT_EQUAL", x, bool(other), dtype=np.bool_)
    return binary(lw, "BITWISE_XOR", x, other)
