"""scaled_dot_product_attention as batched matmuls and a softmax (grouped-query heads folded into rows).
"""

from __future__ import annotations

import math
import operator

import numpy as np
import torch

from .helpers import binary
from .lower import sym_binary
from .ops_nn import batch_matmul
from .ops_reduce import softmax
from .registry import lowering
from .values import Val

__all__ = []

aten = torch.ops.aten


# scaled_dot_product_attention(Tensor query, Tensor key, Tensor value, Tensor? attn_mask=None,
#     float dropout_p=0.0, bool is_causal=False, *, float? scale=None, bool enable_gqa=False) -> Tensor
@lowering(aten.scaled_dot_product_attention.default)
def sdpa(lw, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    e = q.shape[-1]
    L_, S = q.shape[-2], k.shape[-2]
    qd = lw.dims(q)  # sizes for reshapes: ints, or SymVals read at run time for dynamic dims
    scale = 1.0 / math.sqrt(e) if scale is None else scale
    qs = binary(lw, "MUL", q, float(scale), kind="Mul", shape=q.shape)
    hq, hk = (q.shape[-3], k.shape[-3]) if q.rank >= 3 else (1, 1)
    rep = hq // hk if hk and hq and hq != hk else 1
    if rep > 1:  # grouped-query attention: fold the q heads of one kv head into its rows
        qs = lw.reshape(qs, qd[:-3] + [hk, sym_binary(operator.mul, rep, qd[-2]), e])
    scores_shape = tuple(qs.shape[:-1]) + (S,)
    s = batch_matmul(lw, qs, Val(k.shape[:-2] + (k.shape[-1], S), k.dtype, _swap_last(k.perm), tensor=k.tensor,
                                 const=None if not k.is_const else np.swapaxes(k.const, -1, -2)), shape=scores_shape)
    if rep > 1:
        s = lw.reshape(s, qd[:-1] + [lw.dim(k, k.rank - 2)])
    if is_causal:
        mask = _causal_mask(lw, q, k) if L_ is None or S is None else \
            lw.const(np.where(np.tril(np.ones((L_, S), bool)), 0.0, -np.inf).astype(q.dtype))
        s = binary(lw, "ADD", s, mask, kind="Add", shape=s.shape)
    if attn_mask is not None:
        if attn_mask.dtype == np.bool_:
            attn_mask = _bool_mask(lw, attn_mask, q.dtype)
        s = binary(lw, "ADD", s, attn_mask, kind="Add", shape=s.shape)
    p = softmax(lw, "SOFTMAX", s, s.rank - 1)
    if rep > 1:
        p = lw.reshape(p, qd[:-3] + [hk, sym_binary(operator.mul, rep, qd[-2]), lw.dim(k, k.rank - 2)])
    o = batch_matmul(lw, p, v, shape=tuple(p.shape[:-1]) + (v.shape[-1],))
    if rep > 1:
        o = lw.reshape(o, qd[:-1] + [v.shape[-1]])
    return o


def _causal_mask(lw, q: Val, k: Val) -> Val:
    """[L, S] float mask, 0 where key j <= query i, -inf above: the lengths are read at run time."""
    n_q, n_k = lw.dim(q, q.rank - 2), lw.dim(k, k.rank - 2)
    rows = lw.op("RANGE", [lw.sym_scalar(0), lw.sym_scalar(n_q), lw.sym_scalar(1)], (q.shape[-2],), np.int32,
                 suffix="rows")
    cols = lw.op("RANGE", [lw.sym_scalar(0), lw.sym_scalar(n_k), lw.sym_scalar(1)], (k.shape[-2],), np.int32,
                 suffix="cols")
    rows = lw.reshape(rows, [n_q, 1])
    shape = (q.shape[-2], k.shape[-2])
    keep = lw.op("LESS_EQUAL", [lw.tensor(cols), lw.tensor(rows)], shape, np.bool_, suffix="causal")
    zero, ninf = lw.const(np.array(0.0, q.dtype)), lw.const(np.array(-np.inf, q.dtype))
    return lw.op("SELECT_V2", [lw.tensor(keep), lw.tensor(zero), lw.tensor(ninf)], shape, q.dtype, suffix="mask")


def _swap_last(perm):
    r = len(perm)
    swap = {r - 1: r - 2, r - 2: r - 1}
    return tuple(swap.get(p, p) for p in perm)


def _bool_mask(lw, m: Val, dtype):
    if m.is_const:
        return lw.const(np.where(m.const, 0.0, -np.inf).astype(dtype))
    zero, ninf = lw.const(np.array(0.0, dtype)), lw.const(np.array(-np.inf, dtype))
    return lw.op("SELECT_V2", [lw.tensor(m), lw.tensor(zero), lw.tensor(ninf)], m.shape, dtype, m.perm)
