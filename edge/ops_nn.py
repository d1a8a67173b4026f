"""Dense layers: FULLY_CONNECTED for linear layers with constant weights (a norm's pending affine
folded into them), BATCH_MATMUL otherwise.
"""

from __future__ import annotations

import numpy as np
import torch

from ..converter import layout as L
from .helpers import binary
from .registry import lowering
from .values import Val

__all__ = ["fully_connected", "batch_matmul"]

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


def _fold_affine(affine, weight: Val, bias: Val | None):
    """W * g and W @ b + c for a linear reading a norm whose affine (g, b) was left pending."""
    g, b = affine
    w = weight.const
    if b is not None:
        c = (0.0 if bias is None else bias.const.astype(np.float64)) + w.astype(np.float64) @ b.const.astype(np.float64)
        bias = Val(tuple(c.shape), weight.dtype, (0,), const=c.astype(weight.dtype))
    if g is not None:
        if w.dtype == np.float32 and g.const.dtype == np.float32:
            # The product of two float32 is exact in float64, so rounding it once gives the float32
            # product: the same bytes without float64 copies of every weight (a 0.5B LLM spent ~8 s here).
            w = w * g.const
        else:
            w = w.astype(np.float64) * g.const.astype(np.float64)
    return Val(weight.shape, weight.dtype, weight.perm, const=np.asarray(w).astype(weight.dtype, copy=False)), bias
