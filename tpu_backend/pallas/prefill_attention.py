"""Masked flash attention of a prompt against the KV cache (an LLM's prefill): T queries, S cache slots.

q [B, Hq, T, D], k/v [B, Hkv, S, D] (grouped-query heads served from the un-repeated cache) and an additive float
mask [B or 1, 1, T, S] shared by the heads (the cache protocol's: query t sees the slots <= its position).

Why not jax's flash kernel on this path (sdpa.py): it takes a mask only as a bias of [B, Hq, T, S] in q's dtype,
which the caller must materialise (4.3 GB per layer for batch 8 x 32 heads x 2048 x 4096 in bf16, written and read
each layer), repeats K/V per query head, and computes every block. Here the mask is read per [bq, bk] block once
per kv head, the G query heads of a kv head share each K/V block (a static loop over them in the kernel), and the
first and last kv block each query block sees are prefetched as scalars: the K/V index maps clamp to them, so blocks
above the causal diagonal are neither fetched nor computed (about half the attention work of a prefill from slot 0,
three quarters when the cache is twice the prompt). Online softmax in float32, the mask added to the logits as the
XLA path does: ``prefill_attention(..., interpret=True)`` matches ``sdpa.xla_attention`` on CPU.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from .config import LANES, PallasConfig
from .decode_attention import _MASKED_BELOW, cache_kernel_or_xla, kv_block
from .dispatch import is_static_shape

__all__ = ["prefill_attention", "prefill_reason", "q_block"]

_KERNEL_DTYPES = (jnp.float32, jnp.bfloat16)


def q_block(t: int) -> int | None:
    """The query block: 256 or 128 when it divides T, T itself when T <= 256 and a multiple of 8."""
    for b in (256, 128):
        if t % b == 0:
            return b
    return t if t <= 256 and t % 8 == 0 else None


def prefill_reason(q, k, v, mask, config: PallasConfig) -> str | None:
    """Why the kernel cannot (or, in "auto" mode, should not) take these operands; None if it can."""
    if not is_static_shape(q, k, v, mask):
        return "dynamic shapes (Pallas kernels are specialised to static shapes)"
    if q.ndim != 4 or k.ndim != 4 or q.dtype not in _KERNEL_DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        return f"q {q.dtype}{tuple(q.shape)} / k {k.dtype} / v {v.dtype}: the kernel takes 4-D float32 or bfloat16"
    b, hq, t, d = q.shape
    if k.shape[0] != b or k.shape != v.shape or k.shape[-1] != d or hq % k.shape[1]:
        return f"q {tuple(q.shape)} / k {tuple(k.shape)} / v {tuple(v.shape)} are not [B, Hq, T, D] / [B, Hkv, S, D]"
    if mask is None or mask.dtype == jnp.bool_:
        return "no additive float mask (the kernel reads the visible block range from it)"
    s = k.shape[2]
    if mask.ndim != 4 or mask.shape[0] not in (1, b) or mask.shape[1] != 1 or mask.shape[2:] != (t, s):
        return f"mask {tuple(mask.shape)} is not [B or 1, 1, T, S] = [.., 1, {t}, {s}]"
    if kv_block(s) is None or q_block(t) is None:
        return f"T={t} / S={s}: no block size divides them (T a multiple of 128 or <= 256, S of 128 or <= 1024)"
    if config.mode == "auto" and q.dtype == jnp.float32:
        return "auto mode: float32 attention stays on XLA (fp32 matmul precision); kernels serve bf16"
    return None


def _visible(mask3, bq: int, bk: int):
    """(first, last) int32 [Bm * nq]: the first and last kv block holding a visible slot for any row of each
    query block (all of them for a block with none visible, as the XLA path's softmax over every slot)."""
    bm, t, s = mask3.shape
    nq, nk = t // bq, s // bk
    vis = jnp.any((mask3 > _MASKED_BELOW).reshape(bm, nq, bq, nk, bk), axis=(2, 4))
    idx = jnp.arange(nk, dtype=jnp.int32)
    first = jnp.min(jnp.where(vis, idx, nk), axis=-1)
    last = jnp.max(jnp.where(vis, idx, -1), axis=-1)
    none = last < 0
    first, last = jnp.where(none, 0, first), jnp.where(none, nk - 1, last)
    return first.reshape(-1).astype(jnp.int32), last.reshape(-1).astype(jnp.int32)


def _kernel(first_ref, last_ref, q_ref, k_ref, v_ref, m_ref, o_ref, mx, den, acc, *, g, nq, mask_batch,
            transposed):
    from jax.experimental import pallas as pl

    b, i, j = pl.program_id(0), pl.program_id(2), pl.program_id(3)
    row = (b if mask_batch else 0) * nq + i

    @pl.when(j == 0)
    def _init():
        mx[...] = jnp.full(mx.shape, -jnp.inf, jnp.float32)
        den[...] = jnp.zeros(den.shape, jnp.float32)
        acc[...] = jnp.zeros(acc.shape, jnp.float32)

    @pl.when(jnp.logical_and(j >= first_ref[row], j <= last_ref[row]))
    def _step():
        k, v = k_ref[...], v_ref[...]  # [bk, D] each, or [D, bk] when transposed
        bias = m_ref[...].astype(jnp.float32)  # [bq, bk]
        for h in range(g):  # the query heads of this kv head share the K/V and mask blocks
            s = jax.lax.dot_general(q_ref[h], k, (((1,), (0 if transposed else 1,)), ((), ())),
                                    preferred_element_type=jnp.float32) + bias
            m_prev = mx[h]  # [bq, LANES], every lane alike
            m_new = jnp.maximum(m_prev, jnp.max(s, axis=-1, keepdims=True))
            alpha = jnp.exp(m_prev - m_new)
            p = jnp.exp(s - m_new[:, :1])
            den[h] = alpha * den[h] + jnp.sum(p, axis=-1, keepdims=True)
            pv = jax.lax.dot_general(p.astype(v.dtype), v, (((1,), (1 if transposed else 0,)), ((), ())),
                                     preferred_element_type=jnp.float32)
            acc[h] = alpha[:, :1] * acc[h] + pv
            mx[h] = m_new

    @pl.when(j == pl.num_programs(3) - 1)
    def _done():
        for h in range(g):
            d = den[h][:, :1]
            o_ref[h] = (acc[h] / jnp.where(d == 0.0, 1.0, d)).astype(o_ref.dtype)


def _pallas_prefill(q, k, v, mask, *, scale, interpret):
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    b, hq, t, d = q.shape
    hkv, s = k.shape[1], k.shape[2]
    g = hq // hkv
    bq, bk = q_block(t), kv_block(s)
    nq, nk = t // bq, s // bk
    qg = (q * jnp.asarray(scale, q.dtype)).reshape(b, hkv, g, t, d)
    mask3 = mask.reshape(mask.shape[0], t, s)
    first, last = _visible(mask3, bq, bk)
    mask_batch = mask.shape[0] != 1
    transposed = d % LANES != 0  # TPU keeps a head-dim-64 cache slot-minor: read it so (decode_attention.py)
    if transposed:
        k, v = jnp.swapaxes(k, 2, 3), jnp.swapaxes(v, 2, 3)

    def clamp(bi, i, j, first_ref, last_ref):
        row = (bi if mask_batch else 0) * nq + i
        return jnp.minimum(jnp.maximum(j, first_ref[row]), last_ref[row])

    def kv_map(bi, hi, i, j, first_ref, last_ref):
        jj = clamp(bi, i, j, first_ref, last_ref)
        return (bi, hi, 0, jj) if transposed else (bi, hi, jj, 0)

    def mask_map(bi, hi, i, j, first_ref, last_ref):
        return (bi if mask_batch else 0), i, clamp(bi, i, j, first_ref, last_ref)

    kv_spec = pl.BlockSpec((None, None, d, bk) if transposed else (None, None, bk, d), kv_map)
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=2,
        grid=(b, hkv, nq, nk),
        in_specs=[
            pl.BlockSpec((None, None, g, bq, d), lambda bi, hi, i, j, *_: (bi, hi, 0, i, 0)),
            kv_spec, kv_spec,
            pl.BlockSpec((None, bq, bk), mask_map),
        ],
        out_specs=pl.BlockSpec((None, None, g, bq, d), lambda bi, hi, i, j, *_: (bi, hi, 0, i, 0)),
        scratch_shapes=[pltpu.VMEM((g, bq, LANES), jnp.float32), pltpu.VMEM((g, bq, LANES), jnp.float32),
                        pltpu.VMEM((g, bq, d), jnp.float32)],
    )
    out = pl.pallas_call(
        functools.partial(_kernel, g=g, nq=nq, mask_batch=mask_batch, transposed=transposed),
        grid_spec=grid_spec,
        out_shape=jax.ShapeDtypeStruct((b, hkv, g, t, d), q.dtype),
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "parallel", "arbitrary")),
        interpret=interpret,
        name="tpu_export_prefill_attention",
        # an upper bound (every block computed): XLA cannot know how many blocks the mask lets the kernel skip
        cost_estimate=pl.CostEstimate(
            flops=4 * b * hq * t * s * d, transcendentals=b * hq * t * s,
            bytes_accessed=int(2 * q.size * q.dtype.itemsize + nq * (k.size + v.size) * k.dtype.itemsize
                               + b * hkv * t * s * mask3.dtype.itemsize)),  # the mask once per (batch, kv head)
    )(first, last, qg, k, v, mask3)
    return out.reshape(b, hq, t, d)


def prefill_attention(q, k, v, mask, *, scale=None, config: PallasConfig):
    """torch's scaled_dot_product_attention of T queries against the cache with an additive mask shared by the heads
    (see the module doc): the kernel on TPU, ``sdpa.xla_attention`` elsewhere (or when ``prefill_reason`` says no)."""
    return cache_kernel_or_xla("prefill_attention", _pallas_prefill, q, k, v, mask, scale=scale, config=config,
                               reason=prefill_reason(q, k, v, mask, config))
