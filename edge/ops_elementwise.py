"""Arithmetic and unary math. LiteRT has no builtin for most inverse-trig, hyperbolic and
log-base ops; each is a short sequence of builtins (ATAN2, LOG, EXP, SQRT, ...), written so the
fp32 result stays within 1e-5 of torch's (see edge/op_notes.py).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from tpu_export.converter.registry import arguments

from .helpers import as_val, binary, unary
from .registry import lowering, supported_if
from .values import Val

__all__ = ["RELU", "RELU_N1_TO_1", "RELU6", "activation", "clamp_between", "readers_fold_affine"]

aten = torch.ops.aten


RELU, RELU_N1_TO_1, RELU6 = 1, 2, 3  # ActivationFunctionType values


def activation(lw, x: Val, act: int, op: str) -> Val:
    """A fused activation when x's producer can take it, else the builtin ``op``."""
    fused = lw.fuse_activation(x, act)
    return fused if fused is not None else unary(lw, op, x)


def _scaled(lw, b, alpha):
    if alpha == 1:
        return b
    if isinstance(b, Val):
        return binary(lw, "MUL", b, alpha, kind="Mul", shape=b.shape)
    return b * alpha


# add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor
# add.Scalar(Tensor self, Scalar other, Scalar alpha=1) -> Tensor
@lowering(aten.add.Tensor, aten.add.Scalar)
def add(lw, a, b, alpha=1):
    return binary(lw, "ADD", a, _scaled(lw, b, alpha), kind="Add")


# sub.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor
# sub.Scalar(Tensor self, Scalar other, Scalar alpha=1) -> Tensor
@lowering(aten.sub.Tensor, aten.sub.Scalar)
def sub(lw, a, b, alpha=1):
    return binary(lw, "SUB", a, _scaled(lw, b, alpha), kind="Sub")


# rsub.Scalar(Tensor self, Scalar other, Scalar alpha=1) -> Tensor   (other - alpha * self)
@lowering(aten.rsub.Scalar, aten.rsub.Tensor)
def rsub(lw, a, b, alpha=1):
    return binary(lw, "SUB", b, _scaled(lw, a, alpha), kind="Sub")


# mul.Tensor(Tensor self, Tensor other) -> Tensor ; mul.Scalar(Tensor self, Scalar other) -> Tensor
@lowering(aten.mul.Tensor, aten.mul.Scalar)
def mul(lw, a, b):
    if lw.out_dtype == np.bool_:
        return binary(lw, "LOGICAL_AND", a, b)
    scaled = _scale_left_to_readers(lw, a, b)
    if scaled is not None:
        return scaled
    return binary(lw, "MUL", a, b, kind="Mul")


def _weight_node(a) -> bool:
    """``a`` is a model weight placeholder read by one op only (a folded copy costs no size)."""
    return isinstance(a, torch.fx.Node) and a.op == "placeholder" and "weight_name" in a.meta and len(a.users) == 1


def readers_fold_affine(node) -> bool:
    """Every reader of ``node`` is a linear layer with weights of its own taking ``node`` as
    its input: a per-last-dim scale g and shift b on node's value then fold into them,
    (x * g + b) @ W.T + c = x @ (W * g).T + (W @ b + c), and need no tensor op (as a
    LayerNorm's or RMSNorm's affine before attention and MLP projections). Not for a value a PT2E model
    quantized (``pt2e_qparams``): its range is the affine's output, and the readers' weights are on an int8 grid
    that a folded scale would leave."""
    return bool(node.users) and "pt2e_qparams" not in node.meta and all(
        u.target is aten.linear.default and u.args[0] is node and node not in u.args[1:] and not u.kwargs
        and _weight_node(u.args[1]) and (len(u.args) < 3 or u.args[2] is None or _weight_node(u.args[2]))
        for u in node.users)


def _scale_left_to_readers(lw, a, b):
    """x * g for a constant g over x's last dim, left pending for readers that fold it."""
    if not isinstance(a, Val) or not isinstance(b, Val) or a.is_const == b.is_const:
        return None
    x, g = (a, b) if b.is_const else (b, a)
    shape = lw.out_shape
    d = shape[-1] if shape else None
    if (tuple(x.shape) != tuple(shape) or x.dtype != np.float32 or g.dtype != np.float32 or d is None
            or g.rank > len(shape) or g.const.size != d or (g.rank and g.shape[-1] != d)):
        return None
    if not readers_fold_affine(lw.node):
        return None
    y = Val(x.shape, x.dtype, x.perm, tensor=x.tensor, layouts=x.layouts)
    y.pending_affine = (lw.const(g.const.reshape(d)), None)
    return y


# div.Tensor(Tensor self, Tensor other) -> Tensor ; div.Scalar(Tensor self, Scalar other) -> Tensor
@lowering(aten.div.Tensor, aten.div.Scalar)
def div(lw, a, b):
    # by a constant: MUL by its reciprocal (attention's 1/sqrt(d) scale); XNNPACK's DIV is
    # the slower kernel, and the result differs by at most an ulp (none for powers of 2)
    c = b.const if isinstance(b, Val) and b.is_const else (b if isinstance(b, float) else None)
    if c is not None and lw.out_dtype == np.float32 and np.asarray(c).dtype.kind == "f" and np.all(c != 0):
        return binary(lw, "MUL", a, as_val(lw, 1.0 / np.asarray(c, np.float64), np.float32), kind="Mul")
    return binary(lw, "DIV", a, b, kind="Div")


# div.Tensor_mode(Tensor self, Tensor other, *, str? rounding_mode) -> Tensor
@lowering(aten.div.Tensor_mode, aten.div.Scalar_mode)
@supported_if(lambda n: arguments(n)["rounding_mode"] in (None, "floor")
              or n.meta["val"].dtype.is_floating_point or n.meta["val"].dtype in (torch.int32, torch.int64))
def div_mode(lw, a, b, rounding_mode=None):
    if rounding_mode is None:
        return binary(lw, "DIV", a, b, kind="Div")
    if rounding_mode == "floor":
        return binary(lw, "FLOOR_DIV", a, b)
    if np.dtype(lw.out_dtype).kind in "iu":  # trunc on ints: the magnitudes' floor, signed (JetMoE's row / top_k)
        mag = [unary(lw, "ABS", v) if isinstance(v, Val) else abs(v) for v in (a, b)]
        sign = [unary(lw, "SIGN", v) if isinstance(v, Val) else (v > 0) - (v < 0) for v in (a, b)]
        return binary(lw, "MUL", binary(lw, "FLOOR_DIV", *mag), binary(lw, "MUL", *sign, kind="Mul"), kind="Mul")
    q = binary(lw, "DIV", a, b, kind="Div")  # trunc on floats: floor for q >= 0, ceil below
    zero = lw.const(np.zeros((), q.dtype))
    lt = lw.op("LESS", [lw.tensor(q), lw.tensor(zero)], q.shape, np.bool_, q.perm)
    fl = lw.op("FLOOR", [lw.tensor(q)], q.shape, q.dtype, q.perm)
    ce = lw.op("CEIL", [lw.tensor(q)], q.shape, q.dtype, q.perm)
    return lw.op("SELECT_V2", [lw.tensor(lt), lw.tensor(ce), lw.tensor(fl)], q.shape, q.dtype, q.perm)


# floor_divide(Tensor self, Tensor other) -> Tensor
@lowering(aten.floor_divide.default, aten.floor_divide.Scalar)
def floor_divide(lw, a, b):
    return binary(lw, "FLOOR_DIV", a, b)


# remainder.Tensor(Tensor self, Tensor other) -> Tensor ; remainder.Scalar(Tensor self, Scalar other)
@lowering(aten.remainder.Tensor, aten.remainder.Scalar)
def remainder(lw, a, b):
    return binary(lw, "FLOOR_MOD", a, b)


# maximum(Tensor self, Tensor other) -> Tensor ; minimum(Tensor self, Tensor other) -> Tensor
@lowering(aten.maximum.default)
def maximum(lw, a, b):
    return binary(lw, "MAXIMUM", a, b)


@lowering(aten.minimum.default)
def minimum(lw, a, b):
    return binary(lw, "MINIMUM", a, b)


# pow.Tensor_Scalar(Tensor self, Scalar exponent) -> Tensor
@lowering(aten.pow.Tensor_Scalar)
def pow_scalar(lw, x, e):
    if e == 1:
        return lw.alias(x)
    if e == 2:
        return unary(lw, "SQUARE", x)
    if e == 0.5:
        return unary(lw, "SQRT", x)
    if e == -0.5:
        return unary(lw, "RSQRT", x)
    if e == -1:
        return binary(lw, "DIV", 1.0, x, kind="Div")
    if e == 3:
        sq = unary(lw, "SQUARE", x)
        return binary(lw, "MUL", sq, x, kind="Mul")
    return binary(lw, "POW", x, e)


# pow.Tensor_Tensor(Tensor self, Tensor exponent) -> Tensor ; pow.Scalar(Scalar self, Tensor exponent)
@lowering(aten.pow.Tensor_Tensor, aten.pow.Scalar)
def pow_tensor(lw, x, e):
    return binary(lw, "POW", x, e)


_UNARY = {
    aten.exp.default: "EXP", aten.log.default: "LOG", aten.sqrt.default: "SQRT", aten.rsqrt.default: "RSQRT",
    aten.abs.default: "ABS", aten.neg.default: "NEG", aten.sin.default: "SIN", aten.cos.default: "COS",
    aten.floor.default: "FLOOR", aten.ceil.default: "CEIL", aten.round.default: "ROUND", aten.sign.default: "SIGN",
    aten.sigmoid.default: "LOGISTIC", aten.tanh.default: "TANH",
}


def _register_unary(target, op):
    # exp/log/sqrt/...(Tensor self) -> Tensor: one builtin each
    @lowering(target)
    def lower_unary(lw, x):
        return unary(lw, op, x)

    lower_unary.__name__ = f"lower_{op.lower()}"
    return lower_unary


for _t, _op in _UNARY.items():
    _register_unary(_t, _op)


# bitwise_not(Tensor self) -> Tensor   (booleans only)
@lowering(aten.bitwise_not.default)
@supported_if(lambda n: n.meta["val"].dtype == torch.bool)
def bitwise_not(lw, x):
    return unary(lw, "LOGICAL_NOT", x)


# reciprocal(Tensor self) -> Tensor
@lowering(aten.reciprocal.default)
def reciprocal(lw, x):
    return binary(lw, "DIV", 1.0, x, kind="Div")


# log1p(Tensor self) -> Tensor ; expm1(Tensor self) -> Tensor
@lowering(aten.log1p.default)
def log1p(lw, x):
    return unary(lw, "LOG", binary(lw, "ADD", x, 1.0, kind="Add"))


@lowering(aten.expm1.default)
def expm1(lw, x):
    return binary(lw, "SUB", unary(lw, "EXP", x), 1.0, kind="Sub")


# clamp(Tensor self, Scalar? min=None, Scalar? max=None) -> Tensor
@lowering(aten.clamp.default)
def clamp(lw, x, min=None, max=None):  # noqa: A002 - ATen's argument names
    return clamp_between(lw, x, min, max)


def clamp_between(lw, x, lo, hi):
    if x.dtype.kind == "f":
        if (lo, hi) == (0, 6):
            return activation(lw, x, RELU6, "RELU6")
        if (lo, hi) == (-1, 1):
            return activation(lw, x, RELU_N1_TO_1, "RELU_N1_TO_1")
        if lo == 0 and hi is None:
            return activation(lw, x, RELU, "RELU")
        if (lo, hi) == (0, 1):
            return unary(lw, "RELU_0_TO_1", x)
    y = x
    if lo is not None:
        y = binary(lw, "MAXIMUM", y, lo, shape=x.shape)
    if hi is not None:
        y = binary(lw, "MINIMUM", y, hi, shape=x.shape)
    return y


# clamp.Tensor(Tensor self, Tensor? min=None, Tensor? max=None) -> Tensor
@lowering(aten.clamp.Tensor)
def clamp_tensor(lw, x, min=None, max=None):  # noqa: A002
    y = x
    if min is not None:
        y = binary(lw, "MAXIMUM", y, min)
    if max is not None:
        y = binary(lw, "MINIMUM", y, max)
    return y


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
