"""ONNX activations, Clip and Softmax/LogSoftmax."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from .common import axis_of
from .registry import TABLE as T

__all__: list[str] = []

# ai.onnx::Relu(X) / Sigmoid(X) / Tanh(X) / Softsign(X) / HardSwish(X) / Mish(X) -> Y
T.op("Relu", since=13)(lambda ctx, x: F.relu(x))
T.op("Sigmoid", since=13)(lambda ctx, x: torch.sigmoid(x))
T.op("Tanh", since=13)(lambda ctx, x: torch.tanh(x))
T.op("Softsign", since=1)(lambda ctx, x: F.softsign(x))
T.op("HardSwish", since=14)(lambda ctx, x: F.hardswish(x))
T.op("Mish", since=18)(lambda ctx, x: F.mish(x))


# ai.onnx::LeakyRelu(X) -> Y  attrs: alpha
@T.op("LeakyRelu", since=6, attrs={"alpha": 0.01})
def leaky_relu(ctx, x, alpha):
    return F.leaky_relu(x, alpha)


# ai.onnx::HardSigmoid(X) -> Y  attrs: alpha, beta  (max(0, min(1, alpha*x + beta)))
@T.op("HardSigmoid", since=6, attrs={"alpha": 0.2, "beta": 0.5})
def hard_sigmoid(ctx, x, alpha, beta):
    if abs(alpha - 1 / 6) < 1e-7 and beta == 0.5:
        return F.hardsigmoid(x)
    return torch.clamp(x * alpha + beta, 0.0, 1.0)


# ai.onnx::Elu(X) -> Y  attrs: alpha
@T.op("Elu", since=6, attrs={"alpha": 1.0})
def elu(ctx, x, alpha):
    if alpha == 1.0:
        return F.elu(x)
    return torch.where(x > 0, x, alpha * (torch.exp(x) - 1))  # LiteRT's ELU has alpha 1 only


# ai.onnx::Selu(X) -> Y  attrs: alpha, gamma
@T.op("Selu", since=6, attrs={"alpha": 1.67326319217681884765625, "gamma": 1.05070102214813232421875})
def selu(ctx, x, alpha, gamma):
    return gamma * torch.where(x > 0, x, alpha * (torch.exp(x) - 1))


# ai.onnx::Celu(X) -> Y  attrs: alpha
@T.op("Celu", since=12, attrs={"alpha": 1.0})
def celu(ctx, x, alpha):
    return F.celu(x, alpha)


# ai.onnx::ThresholdedRelu(X) -> Y  attrs: alpha
@T.op("ThresholdedRelu", since=10, attrs={"alpha": 1.0})
def thresholded_relu(ctx, x, alpha):
    return torch.where(x > alpha, x, torch.zeros_like(x))


# ai.onnx::Softplus(X) -> Y
@T.op("Softplus", since=1)
def softplus(ctx, x):
    return F.softplus(x)


# ai.onnx::Gelu(X) -> Y  attrs: approximate ("none" | "tanh")  (opset 20)
@T.op("Gelu", since=20, attrs={"approximate": "none"})
def gelu(ctx, x, approximate):
    if approximate not in ("none", "tanh"):
        ctx.fail(f"approximate={approximate!r}; ONNX defines 'none' and 'tanh'")
    return F.gelu(x, approximate=approximate)


# ai.onnx::PRelu(X, slope) -> Y  (slope broadcasts to X)
@T.op("PRelu", since=9)
def prelu(ctx, x, slope):
    return torch.where(x >= 0, x, x * slope)


# ai.onnx::Clip(input, min?, max?) -> output  (bounds as inputs since opset 11)
@T.op("Clip", since=13, maybe_static=(1, 2))
def clip(ctx, x, lo=None, hi=None):
    def scalar(v):
        return v.reshape(()).item() if isinstance(v, np.ndarray) else v

    lo, hi = scalar(lo), scalar(hi)
    if isinstance(lo, (int, float)) and isinstance(hi, (int, float)) and lo == 0 and hi == 6 and x.is_floating_point():
        return F.relu6(x)
    if lo is None and hi is None:
        return x
    if isinstance(lo, torch.Tensor) or isinstance(hi, torch.Tensor):
        out = x if lo is None else torch.maximum(x, lo.to(x.dtype))
        return out if hi is None else torch.minimum(out, hi.to(x.dtype))
    return torch.clamp(x, lo, hi)


def _softmax(name, fn):
    # ai.onnx::<name>(input) -> output  attrs: axis (-1 since opset 13)
    @T.op(name, since=13, attrs={"axis": -1})
    def op(ctx, x, axis):
        return fn(x, axis_of(ctx, axis, x.dim()))

    return op


_softmax("Softmax", lambda x, a: torch.softmax(x, a))
_softmax("LogSoftmax", lambda x, a: torch.log_softmax(x, a))


# ai.onnx::Hardmax(input) -> output  attrs: axis
@T.op("Hardmax", since=13, attrs={"axis": -1})
def hardmax(ctx, x, axis):
    a = axis_of(ctx, axis, x.dim())
    return F.one_hot(torch.argmax(x, a), x.shape[a]).movedim(-1, a).to(x.dtype)


