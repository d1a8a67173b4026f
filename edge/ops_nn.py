"""Dense layers, softmax, normalizations and attention."""

from __future__ import annotations

import math

import numpy as np
import torch

from . import layout as L
from .ops_elementwise import binary, readers_fold_affine
from .ops_reduce import reduce
from .registry import lowering, supported_if
from .values import Val

__all__ = ["fully_connected", "batch_matmul", "softmax"]

aten = torch.ops.aten


def fully_connected(lw, x: Val, w_oi: Val, b: Val | None) -> Val:
    """x @ w_oi.T + b as FULLY_CONNECTED, in x's layout when its last logical dim is innermost."""
    if x.rank == 1:
        y = fully_connected(lw, lw.reshape(x, [1, x.shape[0]]), w_oi, b)
        return lw.reshape(y, [w_oi.shape[0]])
    x = lw.with_perm(x, L.last_dim_layout(x.perm, x.rank - 1) if x.rank > 2 else L.identity(2))
    out = tuple(x.shape[:-1]) + (w_oi.shape[0],)
    keep = x.rank > 2
    ins = [lw.tensor(x), lw.tensor(w_oi, L.identity(2)), lw.tensor(b) if b is not None else None]
    opts = lw.options("FullyConnected", keepNumDims=keep, fusedActivationFunction=0)
    return lw.op("FULLY_CONNECTED", ins, out, x.dtype, x.perm, opts, version=5 if keep else 1, fusable=True)


def _mm_operand(lw, v: Val):
    """v's tensor for BATCH_MATMUL and whether it is stored transposed (adj)."""
    r = v.rank
    ident = L.identity(r)
    swapped = ident[:-2] + (r - 1, r - 2)
    if not v.is_const and tuple(v.perm) == swapped:
        return lw.tensor(v), True
    return lw.tensor(v, ident), False


def batch_matmul(lw, a: Val, b: Val, shape=None) -> Val:
    shape = lw.out_shape if shape is None else shape
    ta, adj_x = _mm_operand(lw, a)
    tb, adj_y = _mm_operand(lw, b)
    opts = lw.options("BatchMatMul", adjX=adj_x, adjY=adj_y)
    return lw.op("BATCH_MATMUL", [ta, tb], shape, a.dtype, None, opts, version=4 if a.rank > 4 else 1)


def _transposed_const(v: Val) -> Val:
    return Val((v.shape[1], v.shape[0]), v.dtype, (0, 1), const=np.ascontiguousarray(v.const.T))


# linear(Tensor input, Tensor weight, Tensor? bias=None) -> Tensor
@lowering(aten.linear.default)
def linear(lw, x, weight, bias=None):
    if x.pending_affine is not None:
        weight, bias = _fold_affine(x.pending_affine, weight, bias)
    if weight.is_const and (bias is None or bias.is_const):
        return fully_connected(lw, x, weight, bias)
    y = batch_matmul(lw, x, Val(weight.shape[::-1], weight.dtype, (1, 0), tensor=lw.tensor(weight, (0, 1)))
                     if not weight.is_const else _transposed_const(weight))
    return binary(lw, "ADD", y, bias, kind="Add") if bias is not None else y


# addmm(Tensor self, Tensor mat1, Tensor mat2, *, Scalar beta=1, Scalar alpha=1) -> Tensor
@lowering(aten.addmm.default)
def addmm(lw, bias, a, b, beta=1, alpha=1):
    if b.is_const and bias.is_const and beta == 1 and alpha == 1 and bias.rank == 1:
        return fully_connected(lw, a, _transposed_const(b), bias)
    y = mm(lw, a, b)
    if alpha != 1:
        y = binary(lw, "MUL", y, alpha, kind="Mul")
    if beta != 1:
        bias = binary(lw, "MUL", bias, beta, kind="Mul", shape=bias.shape)
    return binary(lw, "ADD", y, bias, kind="Add")


# mm(Tensor self, Tensor mat2) -> Tensor
@lowering(aten.mm.default)
def mm(lw, a, b):
    if b.is_const:
        return fully_connected(lw, a, _transposed_const(b), None)
    return batch_matmul(lw, a, b, shape=(a.shape[0], b.shape[1]))


# bmm(Tensor self, Tensor mat2) -> Tensor
@lowering(aten.bmm.default)
def bmm(lw, a, b):
    return batch_matmul(lw, a, b)


# matmul(Tensor self, Tensor other) -> Tensor
@lowering(aten.matmul.default)
def matmul(lw, a, b):
    if b.rank == 2 and b.is_const and a.rank >= 1:
        return fully_connected(lw, a, _transposed_const(b), None)
    shape = lw.out_shape
    if a.rank == 1:
        a2 = lw.reshape(a, [1, a.shape[0]])
        return lw.reshape(batch_matmul(lw, a2, b, shape=shape[:-1] + (1, b.shape[-1])), shape)
    if b.rank == 1:
        b2 = lw.reshape(b, [b.shape[0], 1])
        return lw.reshape(batch_matmul(lw, a, b2, shape=tuple(shape) + (1,)), shape)
    return batch_matmul(lw, a, b)


def softmax(lw, op, x: Val, dim: int) -> Val:
    dim %= x.rank
    x = lw.with_perm(x, L.last_dim_layout(x.perm, dim))
    opts = lw.options("Softmax", beta=1.0) if op == "SOFTMAX" else lw.options("LogSoftmax")
    return lw.op(op, [lw.tensor(x)], x.shape, x.dtype, x.perm, opts)


# _softmax(Tensor self, int dim, bool half_to_float) -> Tensor
@lowering(aten._softmax.default)
def _softmax(lw, x, dim, half_to_float=False):
    return softmax(lw, "SOFTMAX", lw.cast(x, lw.out_dtype), dim)


# _log_softmax(Tensor self, int dim, bool half_to_float) -> Tensor
@lowering(aten._log_softmax.default)
def _log_softmax(lw, x, dim, half_to_float=False):
    return softmax(lw, "LOG_SOFTMAX", lw.cast(x, lw.out_dtype), dim)


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


def _fold_affine(affine, weight: Val, bias: Val | None):
    """W * g and W @ b + c for a linear reading a norm whose affine (g, b) was left pending."""
    g, b = affine
    w = weight.const.astype(np.float64)
    if b is not None:
        c = (0.0 if bias is None else bias.const.astype(np.float64)) + w @ b.const.astype(np.float64)
        bias = Val(tuple(c.shape), weight.dtype, (0,), const=c.astype(weight.dtype))
    if g is not None:
        w = w * g.const.astype(np.float64)
    return Val(weight.shape, weight.dtype, weight.perm, const=w.astype(weight.dtype)), bias


def _affine(lw, y: Val, weight, bias, shape):
    if weight is not None:
        y = binary(lw, "MUL", y, weight, kind="Mul", shape=shape)
    if bias is not None:
        y = binary(lw, "ADD", y, bias, kind="Add", shape=shape)
    return y


# layer_norm(Tensor input, SymInt[] normalized_shape, Tensor? weight=None, Tensor? bias=None,
#            float eps=1e-05, bool cudnn_enable=True) -> Tensor
@lowering(aten.layer_norm.default)
def layer_norm(lw, x, normalized_shape, weight=None, bias=None, eps=1e-5, cudnn_enable=True):
    dims = list(range(x.rank - len(normalized_shape), x.rank))
    y = _normalize(lw, x, dims, eps, center=True)
    if _affine_folds(lw.node, weight, bias, normalized_shape):
        y.pending_affine = (weight, bias)
        return y
    return _affine(lw, y, weight, bias, x.shape)


# rms_norm(Tensor input, SymInt[] normalized_shape, Tensor? weight=None, float? eps=None) -> Tensor
@lowering(aten.rms_norm.default)
def rms_norm(lw, x, normalized_shape, weight=None, eps=None):
    dims = list(range(x.rank - len(normalized_shape), x.rank))
    eps = float(np.finfo(x.dtype).eps) if eps is None else eps
    y = _normalize(lw, x, dims, eps, center=False)
    if _affine_folds(lw.node, weight, None, normalized_shape):
        y.pending_affine = (weight, None)
        return y
    return _affine(lw, y, weight, None, x.shape)


# group_norm(Tensor input, int num_groups, Tensor? weight=None, Tensor? bias=None, float eps=1e-05,
#            bool cudnn_enabled=True) -> Tensor: normalized over (channels of a group, spatial)
@lowering(aten.group_norm.default)
@supported_if(lambda n: all(isinstance(d, int) for d in n.args[0].meta["val"].shape[1:]))
def group_norm(lw, x, num_groups, weight=None, bias=None, eps=1e-5, cudnn_enabled=True):
    n, c = x.shape[0], x.shape[1]
    spatial = int(np.prod(x.shape[2:])) if x.rank > 2 else 1
    xc = lw.with_perm(x, L.channel_last(x.rank))  # [N, *S, C] physically
    g = Val((n, spatial, num_groups, c // num_groups), x.dtype, L.identity(4), tensor=lw.tensor(xc))
    g = lw.op("RESHAPE", [g.tensor, lw.const_tensor([-1 if n is None else n, spatial, num_groups, c // num_groups],
                                                      np.int32)], g.shape, x.dtype, suffix="groups")
    y = _normalize(lw, g, [1, 3], eps, center=True)
    phys = xc.phys_shape()
    t = lw.op("RESHAPE", [lw.tensor(y), lw.const_tensor([-1 if d is None else d for d in phys], np.int32)],
              phys, x.dtype, suffix="ungroup")
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


# scaled_dot_product_attention(Tensor query, Tensor key, Tensor value, Tensor? attn_mask=None,
#     float dropout_p=0.0, bool is_causal=False, *, float? scale=None, bool enable_gqa=False) -> Tensor
@lowering(aten.scaled_dot_product_attention.default)
@supported_if(lambda n: all(isinstance(d, int) for d in n.args[0].meta["val"].shape[-2:]))
def sdpa(lw, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    e = q.shape[-1]
    L_, S = q.shape[-2], k.shape[-2]
    scale = 1.0 / math.sqrt(e) if scale is None else scale
    qs = binary(lw, "MUL", q, float(scale), kind="Mul", shape=q.shape)
    hq, hk = (q.shape[-3], k.shape[-3]) if q.rank >= 3 else (1, 1)
    rep = hq // hk if hk and hq and hq != hk else 1
    if rep > 1:  # grouped-query attention: fold the q heads of one kv head into its rows
        qs = lw.reshape(qs, list(q.shape[:-3]) + [hk, rep * L_, e])
    scores_shape = tuple(qs.shape[:-1]) + (S,)
    s = batch_matmul(lw, qs, Val(k.shape[:-2] + (k.shape[-1], S), k.dtype, _swap_last(k.perm), tensor=k.tensor,
                                 const=None if not k.is_const else np.swapaxes(k.const, -1, -2)), shape=scores_shape)
    if rep > 1:
        s = lw.reshape(s, list(q.shape[:-1]) + [S])
    if is_causal:
        mask = np.where(np.tril(np.ones((L_, S), bool)), 0.0, -np.inf).astype(q.dtype)
        s = binary(lw, "ADD", s, lw.const(mask), kind="Add", shape=s.shape)
    if attn_mask is not None:
        if attn_mask.dtype == np.bool_:
            attn_mask = _bool_mask(lw, attn_mask, q.dtype)
        s = binary(lw, "ADD", s, attn_mask, kind="Add", shape=s.shape)
    p = softmax(lw, "SOFTMAX", s, s.rank - 1)
    if rep > 1:
        p = lw.reshape(p, list(q.shape[:-3]) + [hk, rep * L_, S])
    o = batch_matmul(lw, p, v, shape=tuple(p.shape[:-1]) + (v.shape[-1],))
    if rep > 1:
        o = lw.reshape(o, list(q.shape[:-1]) + [v.shape[-1]])
    return o


def _swap_last(perm):
    r = len(perm)
    swap = {r - 1: r - 2, r - 2: r - 1}
    return tuple(swap.get(p, p) for p in perm)


def _bool_mask(lw, m: Val, dtype):
    if m.is_const:
        return lw.const(np.where(m.const, 0.0, -np.inf).astype(dtype))
    zero, ninf = lw.const(np.array(0.0, dtype)), lw.const(np.array(-np.inf, dtype))
    return lw.op("SELECT_V2", [lw.tensor(m), lw.tensor(zero), lw.tensor(ninf)], m.shape, dtype, m.perm)
