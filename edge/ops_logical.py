"""Comparisons, logical and boolean-bitwise ops, NaN/Inf tests and where.
"""

from __future__ import annotations

import numpy as np
import torch

from .helpers import as_val, binary, operand, promote, ref_perm, unary
from .registry import lowering, supported_if

__all__ = ["where"]

aten = torch.ops.aten


_COMPARE = {
    (aten.eq.Tensor, aten.eq.Scalar): "EQUAL", (aten.ne.Tensor, aten.ne.Scalar): "NOT_EQUAL",
    (aten.lt.Tensor, aten.lt.Scalar): "LESS", (aten.le.Tensor, aten.le.Scalar): "LESS_EQUAL",
    (aten.gt.Tensor, aten.gt.Scalar): "GREATER", (aten.ge.Tensor, aten.ge.Scalar): "GREATER_EQUAL",
}


def _register_compare(targets, op):
    # eq/ne/lt/le/gt/ge.Tensor(Tensor self, Tensor other) -> Tensor ; .Scalar(Tensor self, Scalar other)
    @lowering(*targets)
    def lower_compare(lw, a, b):
        return binary(lw, op, a, b, dtype=promote(a, b))

    lower_compare.__name__ = f"lower_{op.lower()}"


for _ts, _op in _COMPARE.items():
    _register_compare(_ts, _op)


def _bool(lw, x):
    return x if x.dtype == np.bool_ else binary(lw, "NOT_EQUAL", x, 0, dtype=x.dtype, shape=x.shape)


# logical_not(Tensor self) -> Tensor
@lowering(aten.logical_not.default)
def logical_not(lw, x):
    return unary(lw, "LOGICAL_NOT", _bool(lw, x))


# logical_and / logical_or (Tensor self, Tensor other) -> Tensor
@lowering(aten.logical_and.default, aten.bitwise_and.Tensor)
@supported_if(lambda n: n.target == aten.logical_and.default or n.meta["val"].dtype == torch.bool)
def logical_and(lw, a, b):
    return binary(lw, "LOGICAL_AND", _bool(lw, a), _bool(lw, b))


@lowering(aten.logical_or.default, aten.bitwise_or.Tensor)
@supported_if(lambda n: n.target == aten.logical_or.default or n.meta["val"].dtype == torch.bool)
def logical_or(lw, a, b):
    return binary(lw, "LOGICAL_OR", _bool(lw, a), _bool(lw, b))


# where.self(Tensor condition, Tensor self, Tensor other) -> Tensor
@lowering(aten.where.self)
def where(lw, cond, a, b):
    dtype = lw.out_dtype
    shape = lw.out_shape
    vals = [cond, lw.cast(as_val(lw, a, dtype), dtype), lw.cast(as_val(lw, b, dtype), dtype)]
    perm = ref_perm(vals, len(shape))
    ins = [operand(lw, v, len(shape), perm) for v in vals]
    return lw.op("SELECT_V2", ins, shape, dtype, perm)


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
