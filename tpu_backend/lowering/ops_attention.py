"""scaled_dot_product_attention, kept whole by the converter (a Pallas flash kernel may take it
over when ``use_pallas``; this is the reference XLA lowering)."""

from __future__ import annotations

import math

import jax.numpy as jnp
import torch

from .helpers import acc_dtype, cast
from .registry import lowering

aten = torch.ops.aten


def _repeat_kv(t, n_rep: int):
    # enable_gqa: each key/value head serves n_rep consecutive query heads (repeat_interleave).
    return t if n_rep == 1 else jnp.repeat(t, n_rep, axis=-3)


# aten::scaled_dot_product_attention(Tensor query, Tensor key, Tensor value, Tensor? attn_mask=None,
#     float dropout_p=0.0, bool is_causal=False, *, float? scale=None, bool enable_gqa=False) -> Tensor
# dropout_p is ignored: inference graphs (eval mode) pass 0.
@lowering(aten.scaled_dot_product_attention.default)
def scaled_dot_product_attention(ctx, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                 enable_gqa=False):
    dt = ctx.out_dtype
    acc = acc_dtype(dt)
    q, k, v = cast(q, dt), cast(k, dt), cast(v, dt)
    if enable_gqa and q.ndim >= 3:
        k = _repeat_kv(k, q.shape[-3] // k.shape[-3])
        v = _repeat_kv(v, q.shape[-3] // v.shape[-3])
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    prec = ctx.precision()
    scores = jnp.einsum("...qd,...kd->...qk", q, k, precision=prec, preferred_element_type=acc) * scale
    L, S = scores.shape[-2], scores.shape[-1]
    keep = None
    if is_causal:
        keep = jnp.tril(jnp.ones((L, S), jnp.bool_))  # top-left aligned, as torch
    if attn_mask is not None:
        if attn_mask.dtype == jnp.bool_:
            keep = attn_mask if keep is None else jnp.logical_and(keep, attn_mask)
        else:
            scores = scores + cast(attn_mask, acc)
    if keep is not None:
        scores = jnp.where(keep, scores, -jnp.inf)
    row_max = jnp.max(scores, axis=-1, keepdims=True)
    # A fully masked row gives zeros (torch's math backend uses a "safe" softmax since 2.5).
    row_max = jnp.where(jnp.isfinite(row_max), row_max, 0.0)
    e = jnp.exp(scores - row_max)
    denom = jnp.sum(e, axis=-1, keepdims=True)
    probs = jnp.where(denom > 0, e / jnp.where(denom > 0, denom, 1.0), 0.0)
    out = jnp.einsum("...qk,...kd->...qd", cast(probs, dt), v, precision=prec, preferred_element_type=acc)
    return cast(out, dt)
