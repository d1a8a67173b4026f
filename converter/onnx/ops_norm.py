"""ONNX normalizations: BatchNormalization, LayerNormalization, GroupNormalization, InstanceNormalization,
LpNormalization."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .common import axis_of
from .registry import TABLE as T

__all__: list[str] = []


# ai.onnx::BatchNormalization(X, scale, B, input_mean, input_var) -> Y  attrs: epsilon, momentum, training_mode
@T.op("BatchNormalization", since=15, attrs={"epsilon": 1e-5, "momentum": 0.9, "training_mode": 0})
def batch_norm(ctx, x, scale, b, mean, var, *, epsilon, momentum, training_mode):
    if training_mode or ctx.n_out > 1:
        ctx.fail("training_mode / running-stat outputs: only inference BatchNormalization is imported")
    return F.batch_norm(x, mean, var, scale, b, False, 0.0, epsilon)


def _layer_norm(ctx, x, scale, bias, axis, epsilon):
    a = axis_of(ctx, axis, x.dim())
    shape = list(x.shape[a:])
    if list(scale.shape) != shape:
        scale = scale.expand(shape)
    if bias is not None and list(bias.shape) != shape:
        bias = bias.expand(shape)
    return F.layer_norm(x, shape, scale, bias, epsilon)


def _stats(x, axis, epsilon):
    dims = list(range(axis, x.dim()))
    mean = x.mean(dims, keepdim=True)
    var = ((x - mean) ** 2).mean(dims, keepdim=True)
    return mean, torch.rsqrt(var + epsilon)


# ai.onnx::LayerNormalization(X, Scale, B?) -> Y, Mean?, InvStdDev?  attrs: axis, epsilon, stash_type
@T.op("LayerNormalization", since=17, attrs={"axis": -1, "epsilon": 1e-5, "stash_type": 1})
def layer_norm(ctx, x, scale, b=None, *, axis, epsilon, stash_type):
    y = _layer_norm(ctx, x, scale, b, axis, epsilon)
    if ctx.n_out == 1:
        return y
    mean, inv = _stats(x, axis_of(ctx, axis, x.dim()), epsilon)
    return y, mean, inv


# ai.onnx::GroupNormalization(X, scale, bias) -> Y  attrs: epsilon, num_groups, stash_type
#   (opset 18: scale/bias per group; opset 21: per channel)
@T.op("GroupNormalization", since=18, attrs={"epsilon": 1e-5, "num_groups": 0, "stash_type": 1})
def group_norm(ctx, x, scale, bias, *, epsilon, num_groups, stash_type):
    c = x.shape[1]
    if num_groups <= 0 or c % num_groups:
        ctx.fail(f"num_groups={num_groups} does not divide the {c} channels")
    if ctx.opset < 21 and scale.shape[0] == num_groups and num_groups != c:
        scale = scale.repeat_interleave(c // num_groups)
        bias = bias.repeat_interleave(c // num_groups)
    return F.group_norm(x, num_groups, scale, bias, epsilon)


# ai.onnx::InstanceNormalization(input, scale, B) -> output  attrs: epsilon
@T.op("InstanceNormalization", since=6, attrs={"epsilon": 1e-5})
def instance_norm(ctx, x, scale, b, *, epsilon):
    # spelled out: F.instance_norm exports as a batch norm in training mode, which the edge backend refuses
    dims = list(range(2, x.dim()))
    mean = x.mean(dims, keepdim=True)
    var = ((x - mean) ** 2).mean(dims, keepdim=True)
    shape = [1, -1] + [1] * len(dims)
    return (x - mean) * torch.rsqrt(var + epsilon) * scale.reshape(shape) + b.reshape(shape)


# ai.onnx::LpNormalization(input) -> output  attrs: axis, p
@T.op("LpNormalization", since=1, attrs={"axis": -1, "p": 2})
def lp_norm(ctx, x, axis, p):
    if p not in (1, 2):
        ctx.fail(f"p={p}; ONNX defines 1 and 2")
    return x / torch.linalg.vector_norm(x, p, dim=axis_of(ctx, axis, x.dim()), keepdim=True)
