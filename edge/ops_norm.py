"""Normalizations: layer, RMS, group and batch norm (a norm's affine is left to the linear
layers reading it when they fold it), and the native three-output norms.
"""

from __future__ import annotations

import operator

import numpy as np
import torch

from ..converter import layout as L
from .helpers import binary, plain, reduce, static_out
from .lower import sym_binary
from .ops_elementwise import readers_fold_affine
from .registry import lowering, supported_if
from .values import Val

__all__ = []

aten = torch.ops.aten


def _normalize(lw, x: Val, dims, eps, center: bool) -> Val:
    """(x - mean) * rsqrt(var + eps) over logical ``dims`` (rms: x * rsqrt(mean(x^2) + eps))."""
    if center:
        m = reduce(lw, "MEAN", x, dims, True, dtype=x.dtype)
        d = lw.op("SUB", [lw.tensor(x), lw.tensor(m)], x.shape, x.dtype, x.perm, lw.options("Sub"))
    else:
        d = x
    sq = lw.op("SQUARE", [lw.tensor(d)], x.shape, x.dtype, x.perm, suffix="sq")
    v = reduce(lw, "MEAN", sq, dims, True, dtype=x.dtype)
    ve = lw.op("ADD", [lw.tensor(v), lw.const_tensor(np.array(eps, x.dtype))], v.shape, x.dtype, v.perm,
               lw.options("Add"), suffix="eps")
    r = lw.op("RSQRT", [lw.tensor(ve)], v.shape, x.dtype, v.perm, suffix="rsqrt")
    return lw.op("MUL", [lw.tensor(d), lw.tensor(r)], x.shape, x.dtype, x.perm, lw.options("Mul"), suffix="norm")


def _affine_folds(node, weight, bias, normalized_shape) -> bool:
    """A norm's affine can be left to its readers: over the last dim, constant, and every
    reader a linear layer that folds it into its own weights (see readers_fold_affine)."""
    if len(normalized_shape) != 1 or (weight is None and bias is None):
        return False
    if any(p is not None and (not p.is_const or p.dtype != np.float32) for p in (weight, bias)):
        return False
    return readers_fold_affine(node)


def _affine(lw, y: Val, weight, bias, shape):
    if weight is not None:
        y = binary(lw, "MUL", y, weight, kind="Mul", shape=shape)
    if bias is not None:
        y = binary(lw, "ADD", y, bias, kind="Add", shape=shape)
    return y


def _norm(lw, x, normalized_shape, weight, bias, eps, center: bool):
    dims = list(range(x.rank - len(normalized_shape), x.rank))
    y = _normalize(lw, x, dims, eps, center=center)
    if _affine_folds(lw.node, weight, bias, normalized_shape):
        y.pending_affine = (weight, bias)
        return y
    return _affine(lw, y, weight, bias, x.shape)


# layer_norm(Tensor input, SymInt[] normalized_shape, Tensor? weight=None, Tensor? bias=None,
#            float eps=1e-05, bool cudnn_enable=True) -> Tensor
@lowering(aten.layer_norm.default)
def layer_norm(lw, x, normalized_shape, weight=None, bias=None, eps=1e-5, cudnn_enable=True):
    return _norm(lw, x, normalized_shape, weight, bias, eps, center=True)


# rms_norm(Tensor input, SymInt[] normalized_shape, Tensor? weight=None, float? eps=None) -> Tensor
@lowering(aten.rms_norm.default)
def rms_norm(lw, x, normalized_shape, weight=None, eps=None):
    eps = float(np.finfo(x.dtype).eps) if eps is None else eps
    return _norm(lw, x, normalized_shape, weight, None, eps, center=False)


# group_norm(Tensor input, int num_groups, Tensor? weight=None, Tensor? bias=None, float eps=1e-05,
#            bool cudnn_enabled=True) -> Tensor: normalized over (channels of a group, spatial)
@lowering(aten.group_norm.default)
@supported_if(lambda n: isinstance(n.args[0].meta["val"].shape[1], int))
def group_norm(lw, x, num_groups, weight=None, bias=None, eps=1e-5, cudnn_enabled=True):
    c = x.shape[1]
    xd = lw.dims(x)  # run-time sizes where dynamic (batch, length, height, width)
    spatial = 1
    for d in xd[2:]:
        spatial = sym_binary(operator.mul, spatial, d)
    xc = lw.with_perm(x, L.channel_last(x.rank))  # [N, *S, C] physically
    gdims = [xd[0], spatial, num_groups, c // num_groups]
    gshape = tuple(d if isinstance(d, int) else None for d in gdims)
    g = lw.op("RESHAPE", [lw.tensor(xc), lw.shape_tensor(gdims)], gshape, x.dtype, suffix="groups")
    y = _normalize(lw, g, [1, 3], eps, center=True)
    phys = xc.phys_shape()
    t = lw.op("RESHAPE", [lw.tensor(y), lw.shape_tensor([xd[p] for p in xc.perm])], phys, x.dtype, suffix="ungroup")
    y = Val(x.shape, x.dtype, xc.perm, tensor=t.tensor)
    wshape = lambda v: lw.const(v.const.reshape([c] + [1] * (x.rank - 2))) if v is not None and v.is_const else v  # noqa: E731
    return _affine(lw, y, wshape(weight), wshape(bias), x.shape)


# _native_batch_norm_legit_no_training(Tensor input, Tensor? weight, Tensor? bias, Tensor running_mean,
#     Tensor running_var, float momentum, float eps) -> (Tensor, Tensor, Tensor)
# A BatchNorm the converter could not fold into a conv: one MUL and one ADD per channel.
@lowering(aten._native_batch_norm_legit_no_training.default)
@supported_if(lambda n: all(isinstance(a, torch.fx.Node) and a.op == "placeholder" for a in n.args[3:5]))
def batch_norm(lw, x, weight, bias, mean, var, momentum, eps):
    scale = 1.0 / np.sqrt(var.const.astype(np.float64) + eps)
    if weight is not None:
        scale = scale * weight.const
    shift = -mean.const * scale + (bias.const if bias is not None else 0.0)
    shp = [x.shape[1]] + [1] * (x.rank - 2)
    y = binary(lw, "MUL", x, lw.const(scale.astype(x.dtype).reshape(shp)), kind="Mul", shape=x.shape)
    y = binary(lw, "ADD", y, lw.const(shift.astype(x.dtype).reshape(shp)), kind="Add", shape=x.shape)
    return y, None, None


def _mean_rstd(lw, x: Val, dims, eps):
    """(x - mean) * rstd, mean and rstd (both keepdim) over ``dims``."""
    m = reduce(lw, "MEAN", x, dims, True, dtype=x.dtype, shape=tuple(1 if i in dims else s for i, s in
                                                                      enumerate(x.shape)))
    d = lw.op("SUB", [lw.tensor(x), lw.tensor(m, x.perm)], x.shape, x.dtype, x.perm, lw.options("Sub"), suffix="d")
    sq = lw.op("SQUARE", [lw.tensor(d)], x.shape, x.dtype, x.perm, suffix="sq")
    v = reduce(lw, "MEAN", sq, dims, True, dtype=x.dtype, shape=m.shape)
    ve = lw.op("ADD", [lw.tensor(v), lw.const_tensor(np.array(eps, x.dtype))], v.shape, x.dtype, v.perm,
               lw.options("Add"), suffix="eps")
    r = lw.op("RSQRT", [lw.tensor(ve)], v.shape, x.dtype, v.perm, suffix="rstd")
    y = lw.op("MUL", [lw.tensor(d), lw.tensor(r, d.perm)], x.shape, x.dtype, x.perm, lw.options("Mul"), suffix="y")
    return y, m, r


def _affine_reshaped(lw, y, weight, bias, wshape):
    for op, p in (("MUL", weight), ("ADD", bias)):
        if p is not None:
            p = lw.const(p.const.reshape(wshape)) if p.is_const else lw.reshape(plain(lw, p), wshape)
            y = binary(lw, op, y, p, shape=y.shape, dtype=y.dtype)
    return y


# native_layer_norm(Tensor input, SymInt[] normalized_shape, Tensor? weight, Tensor? bias, float eps)
#     -> (Tensor out, Tensor mean, Tensor rstd)
@lowering(aten.native_layer_norm.default)
@supported_if(static_out)
def native_layer_norm(lw, x, normalized_shape, weight, bias, eps):
    dims = list(range(x.rank - len(normalized_shape), x.rank))
    y, m, r = _mean_rstd(lw, x, dims, eps)
    return _affine_reshaped(lw, y, weight, bias, list(normalized_shape)), m, r


# native_group_norm(Tensor input, Tensor? weight, Tensor? bias, SymInt N, SymInt C, SymInt HxW, int group,
#     float eps) -> (Tensor out, Tensor mean, Tensor rstd): statistics over [N, group, C/group * HxW]
@lowering(aten.native_group_norm.default)
@supported_if(static_out)
def native_group_norm(lw, x, weight, bias, n, c, hxw, group, eps):
    g = lw.reshape(plain(lw, x), [n, group, (c // group) * hxw])
    y, m, r = _mean_rstd(lw, g, [2], eps)
    y = lw.reshape(y, list(x.shape))
    y = _affine_reshaped(lw, y, weight, bias, [c] + [1] * (x.rank - 2))
    return y, lw.reshape(m, [n, group]), lw.reshape(r, [n, group])
