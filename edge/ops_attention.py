"""scaled_dot_product_attention as batched matmuls and a softmax (grouped-query heads folded into rows).
"""

from __future__ import annotations

import math
import operator

import numpy as np
import torch

from ..converter import layout as L
from .attention_prefix import prefix_attention
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
    if is_causal:
        causal = _causal_mask(lw, q, k) if L_ is None or S is None else \
            lw.const(np.where(np.tril(np.ones((L_, S), bool)), 0.0, -np.inf).astype(q.dtype))
    masks = [causal] if is_causal else []
    if attn_mask is not None:
        masks.append(_bool_mask(lw, attn_mask, q.dtype) if attn_mask.dtype == np.bool_ else attn_mask)
    folded = rep > 1 and all(_foldable(m) for m in masks)
    if rep > 1:  # grouped-query attention: fold the q heads of one kv head into its rows
        qs = lw.reshape(qs, qd[:-3] + [hk, sym_binary(operator.mul, rep, qd[-2]), e])
    scores_shape = tuple(qs.shape[:-1]) + (S,)
    if L_ == 1 and len(masks) == 1 and (folded or rep == 1):  # a decode step: read only the filled prefix
        mask = _grouped_mask(lw, masks[0], rep) if folded else masks[0]
        o = _decode_prefix(lw, qs, k, v, mask)
        if o is None:
            o = _decode_window(lw, qs, k, v, mask)
        if o is not None:
            return lw.reshape(o, qd[:-1] + [v.shape[-1]]) if rep > 1 else o
    s = batch_matmul(lw, qs, Val(k.shape[:-2] + (k.shape[-1], S), k.dtype, _swap_last(k.perm), tensor=k.tensor,
                                 const=None if not k.is_const else np.swapaxes(k.const, -1, -2)), shape=scores_shape)
    if folded:
        # every mask reads the same in the folded rows [kv heads, rep * L, S]: the scores stay folded through
        # the mask and the softmax (two RESHAPEs per layer fewer; a decode step's [1, 1, 1, S] mask broadcasts)
        masks = [_grouped_mask(lw, m, rep) for m in masks]
    elif rep > 1:
        s = lw.reshape(s, qd[:-1] + [lw.dim(k, k.rank - 2)])
    for m in masks:
        s = binary(lw, "ADD", s, m, kind="Add", shape=s.shape)
    p = softmax(lw, "SOFTMAX", s, s.rank - 1)
    if rep > 1 and not folded:
        p = lw.reshape(p, qd[:-3] + [hk, sym_binary(operator.mul, rep, qd[-2]), lw.dim(k, k.rank - 2)])
    o = batch_matmul(lw, p, v, shape=tuple(p.shape[:-1]) + (v.shape[-1],))
    if rep > 1:
        o = lw.reshape(o, qd[:-1] + [v.shape[-1]])
    return o


def _decode_prefix(lw, qs: Val, k: Val, v: Val, mask: Val) -> Val | None:
    """edge.attention_prefix's attention when k and v are this signature's cache writes at the same position."""
    at = lw.memo.get(("cache_written_at", k.tensor))
    if at is None or lw.memo.get(("cache_written_at", v.tensor)) is not at:
        return None
    return prefix_attention(lw, qs, k, v, mask, at)


def _decode_window(lw, qs: Val, k: Val, v: Val, mask: Val) -> Val | None:
    """A sliding layer's decode over its window gathered from this signature's cache writes (ops_index's
    index_select): edge.attention_prefix's chain over the cache's first slots while the window is those, the
    window's GATHERs moved into the chain's last else (dropped from this graph: nothing else reads them)."""
    wk, wv = lw.memo.get(("cache_window", k.tensor)), lw.memo.get(("cache_window", v.tensor))
    if wk is None or wv is None or k.users != 1 or v.users != 1 or wk[1].tensor != wv[1].tensor:
        return None
    (ck, slots, gk), (cv, _, gv) = wk, wv
    at = lw.memo.get(("cache_written_at", ck.tensor))
    if at is None or lw.memo.get(("cache_written_at", cv.tensor)) is not at:
        return None
    ops = lw.sg.operators
    if not any(o is gk for o in ops) or not any(o is gv for o in ops):
        return None
    o = prefix_attention(lw, qs, ck, cv, mask, at, window=slots)
    if o is not None:
        ops[:] = [op for op in ops if op is not gk and op is not gv]
    return o


def _foldable(m: Val) -> bool:
    """A mask that reads the same for every query head of a group (no head dim) with a static row count."""
    if m.rank >= 3 and m.shape[-3] != 1:
        return False
    return m.rank < 2 or m.shape[-2] == 1 or (m.shape[-2] is not None and m.shape[-1] is not None)


def _grouped_mask(lw, m: Val, rep: int) -> Val:
    """A ``_foldable`` additive mask (broadcast against scores [..., Hq, L, S]) for the folded scores
    [..., Hkv, rep * L, S] (row r * L + t is query head r of the group at position t): as it is when it has one
    row (decode), else its rows tiled ``rep`` times, once per signature for all the layers reading it."""
    if m.rank < 2 or m.shape[-2] == 1:
        return m
    axis = m.rank - 2
    if m.is_const:
        return lw.const(np.concatenate([m.const] * rep, axis=axis))
    key = ("sdpa_grouped_mask", m.tensor, tuple(m.perm), rep)
    if key not in lw.memo:
        t = lw.tensor(m, L.identity(m.rank))
        shape = m.shape[:axis] + (m.shape[axis] * rep,) + m.shape[axis + 1:]
        lw.memo[key] = lw.op("CONCATENATION", [t] * rep, shape, m.dtype,
                             opts=lw.options("Concatenation", axis=axis, fusedActivationFunction=0), suffix="gqa_mask")
    return lw.memo[key]


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
    key = ("sdpa_bool_mask", m.tensor, tuple(m.perm), np.dtype(dtype).name)  # once for all the layers reading m
    if key not in lw.memo:
        zero, ninf = lw.const(np.array(0.0, dtype)), lw.const(np.array(-np.inf, dtype))
        lw.memo[key] = lw.op("SELECT_V2", [lw.tensor(m), lw.tensor(zero), lw.tensor(ninf)], m.shape, dtype, m.perm)
    return lw.memo[key]
