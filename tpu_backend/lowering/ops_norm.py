"""Normalization: batch norm (inference), layer norm, group norm, RMS norm (+ native_* forms).

Statistics of bf16/f16 inputs are computed in f32 and the result cast back once.
"""

from __future__ import annotations

import jax.numpy as jnp
import torch
from jax import lax

from .helpers import acc_dtype, cast
from .registry import lowering

aten = torch.ops.aten


def _channel_shape(x):
    return (1, -1) + (1,) * (x.ndim - 2) if x.ndim >= 2 else (-1,)


# aten::_native_batch_norm_legit_no_training(Tensor input, Tensor? weight, Tensor? bias,
#     Tensor running_mean, Tensor running_var, float momentum, float eps) -> (Tensor, Tensor, Tensor)
@lowering(aten._native_batch_norm_legit_no_training.default)
def batch_norm_inference(ctx, x, weight, bias, running_mean, running_var, momentum, eps):
    acc = acc_dtype(ctx.out_dtype)
    shape = _channel_shape(x)
    scale = lax.rsqrt(cast(running_var, acc) + eps)
    if weight is not None:
        scale = scale * cast(weight, acc)
    shift = -cast(running_mean, acc) * scale
    if bias is not None:
        shift = shift + cast(bias, acc)
    y = cast(x, acc) * scale.reshape(shape) + shift.reshape(shape)
    empty = jnp.zeros((0,), ctx.out_avals[1].dtype)  # torch returns empty save_mean/save_rstd here
    return cast(y, ctx.out_dtype), empty, empty


def _normalize(x, axes, eps):
    mean = jnp.mean(x, axis=axes, keepdims=True)
    centered = x - mean
    var = jnp.mean(centered * centered, axis=axes, keepdims=True)
    rstd = lax.rsqrt(var + eps)
    return centered * rstd, mean, rstd


def _layer_norm(ctx, x, normalized_shape, weight, bias, eps):
    acc = acc_dtype(ctx.out_dtype)
    axes = tuple(range(x.ndim - len(normalized_shape), x.ndim))
    y, mean, rstd = _normalize(cast(x, acc), axes, eps)
    if weight is not None:
        y = y * cast(weight, acc)
    if bias is not None:
        y = y + cast(bias, acc)
    return cast(y, ctx.out_dtype), mean, rstd


# aten::layer_norm(Tensor input, SymInt[] normalized_shape, Tensor? weight=None, Tensor? bias=None,
#     float eps=1e-05, bool cudnn_enable=True) -> Tensor
@lowering(aten.layer_norm.default)
def layer_norm(ctx, x, normalized_shape, weight=None, bias=None, eps=1e-5, cudnn_enable=True):
    return _layer_norm(ctx, x, normalized_shape, weight, bias, eps)[0]


# aten::native_layer_norm(Tensor input, SymInt[] normalized_shape, Tensor? weight, Tensor? bias,
#     float eps) -> (Tensor, Tensor, Tensor)
@lowering(aten.native_layer_norm.default)
def native_layer_norm(ctx, x, normalized_shape, weight, bias, eps):
    return _layer_norm(ctx, x, normalized_shape, weight, bias, eps)


def _group_norm(ctx, x, num_groups, weight, bias, eps):
    acc = acc_dtype(ctx.out_dtype)
    n = x.shape[0]
    grouped = cast(x, acc).reshape((n, num_groups, -1))
    y, mean, rstd = _normalize(grouped, (2,), eps)
    y = y.reshape(x.shape)
    shape = (1, -1) + (1,) * (x.ndim - 2)
    if weight is not None:
        y = y * cast(weight, acc).reshape(shape)
    if bias is not None:
        y = y + cast(bias, acc).reshape(shape)
    return cast(y, ctx.out_dtype), mean.reshape(n, num_groups), rstd.reshape(n, num_groups)


# aten::group_norm(Tensor input, int num_groups, Tensor? weight=None, Tensor? bias=None,
#     float eps=1e-05, bool cudnn_enabled=True) -> Tensor
@lowering(aten.group_norm.default)
def group_norm(ctx, x, num_groups, weight=None, bias=None, eps=1e-5, cudnn_enabled=True):
    return _group_norm(ctx, x, num_groups, weight, bias, eps)[0]


# aten::native_group_norm(Tensor input, Tensor? weight, Tensor? bias, SymInt N, SymInt C,
#     SymInt HxW, int group, float eps) -> (Tensor, Tensor, Tensor)
@lowering(aten.native_group_norm.default)
def native_group_norm(ctx, x, weight, bias, n, c, hxw, group, eps):
    return _group_norm(ctx, x, group, weight, bias, eps)


# aten::rms_norm(Tensor input, SymInt[] normalized_shape, Tensor? weight=None, float? eps=None) -> Tensor
@lowering(aten.rms_norm.default)
def rms_norm(ctx, x, normalized_shape, weight=None, eps=None):
    if eps is None:  # torch's default: the machine epsilon of the model's input dtype (not bf16's)
        eps = float(torch.finfo(ctx.arg_meta(0).dtype).eps)
    acc = acc_dtype(ctx.out_dtype)
    axes = tuple(range(x.ndim - len(normalized_shape), x.ndim))
    xf = cast(x, acc)
    y = xf * lax.rsqrt(jnp.mean(xf * xf, axis=axes, keepdims=True) + eps)
    if weight is not None:
        y = y * cast(weight, acc)
    return y
