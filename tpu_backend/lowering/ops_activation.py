"""Activation functions (several kept whole by the converter so they stay one fused op)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import torch

from tpu_export.converter.registry import arguments

from .helpers import cast
from .registry import lowering, supported_if

aten = torch.ops.aten


# aten::relu(Tensor self) -> Tensor
@lowering(aten.relu.default)
def relu(ctx, x):
    return jnp.maximum(cast(x, ctx.out_dtype), 0)  # lax.max keeps NaN, as torch


# aten::hardtanh(Tensor self, Scalar min_val=-1, Scalar max_val=1) -> Tensor
@lowering(aten.hardtanh.default)
def hardtanh(ctx, x, min_val=-1, max_val=1):
    return jnp.minimum(jnp.maximum(cast(x, ctx.out_dtype), min_val), max_val)


# aten::leaky_relu(Tensor self, Scalar negative_slope=0.01) -> Tensor
@lowering(aten.leaky_relu.default)
def leaky_relu(ctx, x, negative_slope=0.01):
    x = cast(x, ctx.out_dtype)
    return jnp.where(x > 0, x, x * negative_slope)


# aten::elu(Tensor self, Scalar alpha=1, Scalar scale=1, Scalar input_scale=1) -> Tensor
@lowering(aten.elu.default)
def elu(ctx, x, alpha=1, scale=1, input_scale=1):
    x = cast(x, ctx.out_dtype)
    return jnp.where(x > 0, x * scale, jnp.expm1(x * input_scale) * (alpha * scale))


# aten::softplus(Tensor self, Scalar beta=1, Scalar threshold=20) -> Tensor
@lowering(aten.softplus.default)
def softplus(ctx, x, beta=1, threshold=20):
    x = cast(x, ctx.out_dtype)
    bx = x * beta
    return jnp.where(bx > threshold, x, jnp.log1p(jnp.exp(jnp.minimum(bx, threshold))) / beta)


# aten::gelu(Tensor self, *, str approximate='none') -> Tensor
@lowering(aten.gelu.default)
def gelu(ctx, x, approximate="none"):
    x = cast(x, ctx.out_dtype)
    if approximate == "tanh":
        inner = math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)
        return 0.5 * x * (1.0 + jnp.tanh(inner))
    if approximate != "none":
        raise ValueError(f"unknown gelu approximation {approximate!r}")
    return 0.5 * x * (1.0 + jax.scipy.special.erf(x * (1.0 / math.sqrt(2.0))))


# aten::silu(Tensor self) -> Tensor
@lowering(aten.silu.default)
def silu(ctx, x):
    x = cast(x, ctx.out_dtype)
    return x * jax.nn.sigmoid(x)


# aten::mish(Tensor self) -> Tensor
@lowering(aten.mish.default)
def mish(ctx, x):
    x = cast(x, ctx.out_dtype)
    return x * jnp.tanh(jax.nn.softplus(x))


# aten::hardswish(Tensor self) -> Tensor
@lowering(aten.hardswish.default)
def hardswish(ctx, x):
    x = cast(x, ctx.out_dtype)
    return x * jnp.clip(x + 3.0, 0.0, 6.0) / 6.0


# aten::hardsigmoid(Tensor self) -> Tensor
@lowering(aten.hardsigmoid.default)
def hardsigmoid(ctx, x):
    return jnp.clip(cast(x, ctx.out_dtype) + 3.0, 0.0, 6.0) / 6.0


# aten::logit(Tensor self, float? eps=None) -> Tensor
@lowering(aten.logit.default)
def logit(ctx, x, eps=None):
    x = cast(x, ctx.out_dtype)
    if eps is not None:
        x = jnp.clip(x, eps, 1.0 - eps)
    return jnp.log(x / (1.0 - x))


# aten::_prelu_kernel(Tensor self, Tensor weight) -> Tensor
@lowering(aten._prelu_kernel.default)
def prelu(ctx, x, weight):
    x = cast(x, ctx.out_dtype)
    return jnp.where(x > 0, x, x * cast(weight, ctx.out_dtype))


# aten::native_dropout(Tensor input, float p, bool? train) -> (Tensor, Tensor)
# Inference graphs only: with train off dropout is the identity and the mask all ones.
@lowering(aten.native_dropout.default)
@supported_if(lambda n: arguments(n)["train"] is False or arguments(n)["p"] == 0)
def native_dropout(ctx, x, p, train):
    return x, jnp.ones(x.shape, jnp.bool_)
