"""Elementwise ops and activations. They run in their input's layout: a broadcast operand is
brought to that layout (a constant is permuted at conversion time, never at run time)."""

from __future__ import annotations

import numpy as np
import torch

from converter.registry import arguments

from . import layout as L
from .builder import schema
from .registry import lowering, supported_if
from .values import Val

__all__ = ["binary", "unary", "operand", "ref_perm", "as_val", "activation"]

aten = torch.ops.aten
RELU, RELU_N1_TO_1, RELU6 = 1, 2, 3  # ActivationFunctionType values


def as_val(lw, x, dtype) -> Val:
    return x if isinstance(x, Val) else lw.const(np.asarray(x, dtype=dtype))


def ref_perm(vals, rank) -> tuple:
    """The layout an elementwise op runs in: that of its first full-rank non-constant input."""
    for v in vals:
        if isinstance(v, Val) and not v.is_const and v.rank == rank:
            return tuple(v.perm)
    return L.identity(rank)


def operand(lw, v: Val, rank: int, perm) -> int:
    """v's tensor, broadcast-ready for an op of ``rank`` running in layout ``perm``."""
    if v.rank < rank and v.is_const and v.const.size == 1:
        return lw.tensor(lw.const(v.const.reshape(())))  # a scalar broadcasts in any layout
    if v.rank < rank:
        if L.is_identity(perm):
            return lw.tensor(v, L.identity(v.rank))  # numpy-style right-aligned broadcasting
        full = [1] * (rank - v.rank) + list(v.shape)
        v = lw.const(v.const.reshape(full)) if v.is_const else lw.reshape(v, full)
    return lw.tensor(v, perm)


_SMALL_INTS = (np.dtype(np.int8), np.dtype(np.uint8))


def binary(lw, op, a, b, *, dtype=None, kind=None, shape=None, out_dtype=None):
    """``op`` on a and b broadcast, computed in ``dtype`` (default: the node's output dtype)."""
    out_dtype = np.dtype(out_dtype or lw.out_dtype)
    dtype = np.dtype(dtype or out_dtype)
    if dtype in _SMALL_INTS:
        # LiteRT's int8/uint8 kernels expect quantized tensors: on plain ones they abort or
        # rescale. Compute in int32 and cast back (wrapping, as torch's int8 arithmetic does).
        wide = np.dtype(np.int32) if out_dtype in _SMALL_INTS else out_dtype
        r = binary(lw, op, a, b, dtype=np.int32, shape=shape, out_dtype=wide)
        return lw.cast(r, out_dtype)
    a, b = lw.cast(as_val(lw, a, dtype), dtype), lw.cast(as_val(lw, b, dtype), dtype)
    shape = lw.out_shape if shape is None else shape
    perm = ref_perm([a, b], len(shape))
    ins = [operand(lw, a, len(shape), perm), operand(lw, b, len(shape), perm)]
    opts = lw.options(kind, fusedActivationFunction=0) if kind else None
    return lw.op(op, ins, shape, out_dtype, perm, opts, fusable=kind is not None)


def unary(lw, op, x: Val, opts=None, dtype=None) -> Val:
    x = lw.cast(x, dtype or lw.out_dtype)
    return lw.op(op, [lw.tensor(x)], x.shape, lw.out_dtype, x.perm, opts)


def promote(*xs) -> np.dtype:
    """The dtype torch computes a comparison in (tensor dtypes win over Python scalars)."""
    tens = [x for x in xs if isinstance(x, Val)]
    floats = [x.dtype for x in tens if x.dtype.kind == "f"]
    if floats:
        return max(floats, key=lambda d: d.itemsize)
    if any(isinstance(x, float) for x in xs):
        return np.dtype(np.float32)
    ints = [x.dtype for x in tens if x.dtype.kind in "iu"]
    if ints:
        return max(ints, key=lambda d: d.itemsize)
    return tens[0].dtype if tens else np.dtype(np.int32)


def activation(lw, x: Val, act: int, op: str) -> Val:
    """A fused activation when x's producer can take it, else the builtin ``op``."""
    fused = lw.fuse_activation(x, act)
    return fused if fused is not None else unary(lw, op, x)


# ---------------------------------------------------------------- arithmetic

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
    LayerNorm's or RMSNorm's affine before attention and MLP projections)."""
    return bool(node.users) and all(
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
              or n.meta["val"].dtype.is_floating_point)
def div_mode(lw, a, b, rounding_mode=None):
    if rounding_mode is None:
        return binary(lw, "DIV", a, b, kind="Div")
    if rounding_mode == "floor":
        return binary(lw, "FLOOR_DIV", a, b)
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


# ---------------------------------------------------------------- unary math

_UNARY = {
    aten.exp.default: "EXP", aten.log.default: "LOG", aten.sqrt.default: "SQRT", aten.rsqrt.default: "RSQRT",
    aten.abs.default: "ABS", aten.neg.default: "NEG", aten.sin.default: "SIN", aten.cos.default: "COS",
    aten.floor.default: "FLOOR", aten.ceil.default: "CEIL", aten.round.default: "ROUND", aten.sign.default: "SIGN",
    aten.sigmoid.default: "LOGISTIC", aten.tanh.default: "TANH", aten.logical_not.default: "LOGICAL_NOT",
}


def _register_unary(target, op):
    # exp/log/sqrt/...(Tensor self) -> Tensor: one builtin each
    @lowering(target)
    def lower_unary(lw, x):
        if op == "LOGICAL_NOT" and x.dtype != np.bool_:
            x = binary(lw, "NOT_EQUAL", x, 0, dtype=x.dtype)
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


# ---------------------------------------------------------------- activations

# relu(Tensor self) -> Tensor
@lowering(aten.relu.default)
def relu(lw, x):
    return activation(lw, x, RELU, "RELU")


# hardtanh(Tensor self, Scalar min_val=-1, Scalar max_val=1) -> Tensor
@lowering(aten.hardtanh.default)
def hardtanh(lw, x, min_val=-1.0, max_val=1.0):
    return _clamp(lw, x, min_val, max_val)


# clamp(Tensor self, Scalar? min=None, Scalar? max=None) -> Tensor
@lowering(aten.clamp.default)
def clamp(lw, x, min=None, max=None):  # noqa: A002 - ATen's argument names
    return _clamp(lw, x, min, max)


def _clamp(lw, x, lo, hi):
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


# leaky_relu(Tensor self, Scalar negative_slope=0.01) -> Tensor
@lowering(aten.leaky_relu.default)
def leaky_relu(lw, x, negative_slope=0.01):
    return unary(lw, "LEAKY_RELU", x, lw.options("LeakyRelu", alpha=float(negative_slope)))


# elu(Tensor self, Scalar alpha=1, Scalar scale=1, Scalar input_scale=1) -> Tensor
@lowering(aten.elu.default)
@supported_if(lambda n: all(arguments(n)[k] == 1 for k in ("alpha", "scale", "input_scale")))
def elu(lw, x, alpha=1.0, scale=1.0, input_scale=1.0):
    return unary(lw, "ELU", x)


# gelu(Tensor self, *, str approximate='none') -> Tensor
@lowering(aten.gelu.default)
def gelu(lw, x, approximate="none"):
    return unary(lw, "GELU", x, lw.options("Gelu", approximate=approximate == "tanh"))


# silu(Tensor self) -> Tensor: x * sigmoid(x)
@lowering(aten.silu.default)
def silu(lw, x):
    s = lw.op("LOGISTIC", [lw.tensor(x)], x.shape, x.dtype, x.perm, suffix="sigmoid")
    return lw.op("MUL", [lw.tensor(x), lw.tensor(s)], x.shape, x.dtype, x.perm,
                 lw.options("Mul", fusedActivationFunction=0), fusable=True)


# hardswish(Tensor self) -> Tensor
@lowering(aten.hardswish.default)
def hardswish(lw, x):
    return unary(lw, "HARD_SWISH", x)


# hardsigmoid(Tensor self) -> Tensor: relu6(x + 3) / 6, the RELU6 fused into the ADD, or (as
# in MobileNetV3's squeeze-excite) the +3 folded into the producing conv's bias and the RELU6
# fused into that conv
@lowering(aten.hardsigmoid.default)
def hardsigmoid(lw, x):
    t = _shift_into_bias(lw, x, 3.0, RELU6)
    if t is not None:
        return binary(lw, "MUL", t, 1.0 / 6.0, kind="Mul")
    t = lw.op("ADD", [lw.tensor(x), lw.tensor(lw.const(np.array(3.0, x.dtype)))], x.shape, x.dtype, x.perm,
              lw.options("Add", fusedActivationFunction=RELU6), suffix="plus3")
    return binary(lw, "MUL", t, 1.0 / 6.0, kind="Mul")


def _shift_into_bias(lw, x: Val, shift: float, act: int) -> Val | None:
    """act(x + shift) when x's only reader is this op and its producer is a conv or dense
    layer with a constant bias and no activation yet: the shift goes into a copy of the bias,
    the activation into the op. None when it cannot."""
    o = x.producer
    if o is None or x.users != 1 or x.is_const or x.layouts or x.dtype != np.float32:
        return None
    codes = schema().BuiltinOperator
    if lw.model.builtin_code(o.opcodeIndex) not in (codes.CONV_2D, codes.DEPTHWISE_CONV_2D, codes.FULLY_CONNECTED):
        return None
    if getattr(o.builtinOptions, "fusedActivationFunction", None) != 0 or len(o.inputs) < 3 or o.inputs[2] < 0:
        return None
    bt = lw.sg.tensors[o.inputs[2]]
    data = lw.model.buffers[bt.buffer].data
    if not data or bt.type != 0:  # float32 constant
        return None
    bias = np.frombuffer(data, np.float32).reshape(bt.shape) + np.float32(shift)
    o.inputs[2] = lw.const_tensor(bias, name=lw.name("bias"))
    o.builtinOptions.fusedActivationFunction = act
    return Val(x.shape, x.dtype, x.perm, tensor=x.tensor)


# prelu / _prelu_kernel(Tensor self, Tensor weight) -> Tensor
@lowering(aten._prelu_kernel.default)
def prelu(lw, x, w):
    return binary(lw, "PRELU", x, w)


# softplus(Tensor self, Scalar beta=1, Scalar threshold=20) -> Tensor
@lowering(aten.softplus.default)
def softplus(lw, x, beta=1.0, threshold=20.0):
    bx = binary(lw, "MUL", x, float(beta), kind="Mul") if beta != 1 else x
    sp = unary(lw, "LOG", binary(lw, "ADD", unary(lw, "EXP", bx), 1.0, kind="Add"))
    if beta != 1:
        sp = binary(lw, "DIV", sp, float(beta), kind="Div")
    big = binary(lw, "GREATER", bx, float(threshold), dtype=x.dtype)
    return lw.op("SELECT_V2", [lw.tensor(big), lw.tensor(x), lw.tensor(sp)], x.shape, x.dtype, x.perm)


# ---------------------------------------------------------------- comparisons and selection

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


# masked_fill.Scalar(Tensor self, Tensor mask, Scalar value) -> Tensor
@lowering(aten.masked_fill.Scalar)
def masked_fill(lw, x, mask, value):
    return where(lw, mask, value, x)


# ---------------------------------------------------------------- copies and casts

# clone(Tensor self, *, MemoryFormat? memory_format=None) -> Tensor ; alias/detach/lift_fresh_copy
@lowering(aten.clone.default, aten.alias.default, aten.detach.default, aten.lift_fresh_copy.default)
def clone(lw, x, *_):
    return lw.alias(x)


# _to_copy(Tensor self, *, ScalarType? dtype=None, ...) -> Tensor
@lowering(aten._to_copy.default)
def to_copy(lw, x, *_):
    dtype = lw.out_dtype
    if dtype == x.dtype:
        return lw.alias(x)
    if dtype == np.bool_:
        return binary(lw, "NOT_EQUAL", x, 0, dtype=x.dtype, shape=x.shape)
    return lw.cast(x, dtype)
