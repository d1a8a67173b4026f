"""Activations: fused into their producer (CONV_2D, FULLY_CONNECTED, ADD, ...) when it can take
them, else one builtin or a short sequence.
"""

from __future__ import annotations

import numpy as np
import torch

from tpu_export.converter.registry import arguments

from .builder import schema
from .helpers import binary, unary
from .ops_elementwise import RELU, RELU6, activation, clamp_between
from .registry import lowering, supported_if
from .values import Val

__all__ = []

aten = torch.ops.aten


# relu(Tensor self) -> Tensor
@lowering(aten.relu.default)
def relu(lw, x):
    return activation(lw, x, RELU, "RELU")


# hardtanh(Tensor self, Scalar min_val=-1, Scalar max_val=1) -> Tensor
@lowering(aten.hardtanh.default)
def hardtanh(lw, x, min_val=-1.0, max_val=1.0):
    return clamp_between(lw, x, min_val, max_val)


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
