"""Flash-decoding attention for an LLM's decode step: one query token against the whole KV cache.

q [B, Hq, 1, D], k/v [B, Hkv, S, D] (the cache, S = cache length, Hq a multiple of Hkv: grouped-query
heads are served from the un-repeated cache) and an additive float mask [B or 1, 1, 1, S] (the cache
protocol's: 0 for the slots <= the token's position, a large negative value for the others).

Why a kernel of our own rather than jax's flash/splash: those tile the query axis (128 rows), so one
query row is padded to a full tile, K/V are repeated per query head, and every cache block is read
whatever the position. Here the grid is (batch, kv head, cache block); the G query heads of a kv head
form one [G, D] tile (padded to 8 sublanes), and the first and last cache block that the mask leaves
visible are prefetched as scalars: the K/V block index map clamps to them, so blocks outside are never
fetched from HBM (the pipeline skips a copy whose block index repeats) and their compute is skipped.
The bytes read per step therefore follow the current length, not the cache size. jax's ragged paged
attention would need the cache in its paged layout; this keeps the protocol's [B, Hkv, S, D].

Online softmax in float32, the mask added to the logits as the XLA path does, so both give the same
numbers: ``decode_attention(..., interpret=True)`` against ``sdpa.xla_attention`` on CPU.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from .config import LANES, PallasConfig
from .dispatch import is_static_shape, kernel_or_xla

__all__ = ["decode_attention", "decode_reason", "cache_kernel_or_xla", "kv_block", "visible_blocks", "repeat_factor",
           "unrepeat"]

_KERNEL_DTYPES = (jnp.float32, jnp.bfloat16)
_BLOCKS = (1024, 512, 256, LANES)
_SUBLANES = 8
# A slot whose additive mask is below this is masked (transformers uses finfo(dtype).min).
_MASKED_BELOW = -1e30


def kv_block(s: int) -> int | None:
    """The cache block: the largest of 1024/512/256/128 that divides S, or S itself when S <= 1024."""
    for b in _BLOCKS:
        if s % b == 0:
            return b
    return s if s <= _BLOCKS[0] else None


def decode_reason(q, k, v, mask, config: PallasConfig) -> str | None:
    """Why the decode kernel cannot (or, in "auto" mode, should not) take these operands; None if it can."""
    if not is_static_shape(q, k, v, mask):
        return "dynamic shapes (Pallas kernels are specialised to static shapes)"
    if q.ndim != 4 or q.shape[2] != 1:
        return f"query {tuple(q.shape)} is not one token [B, H, 1, D]"
    if q.dtype not in _KERNEL_DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        return f"dtypes q={q.dtype} k={k.dtype} v={v.dtype} (the kernel takes float32 or bfloat16, all alike)"
    b, hq, _, d = q.shape
    if k.shape[0] != b or k.shape != v.shape or k.shape[-1] != d or hq % k.shape[1]:
        return f"q {tuple(q.shape)} / k {tuple(k.shape)} / v {tuple(v.shape)} are not [B, Hq, 1, D] / [B, Hkv, S, D]"
    if mask is None or mask.dtype == jnp.bool_:
        return "no additive float mask (the decode kernel reads the visible cache range from it)"
    if mask.ndim != 4 or mask.shape[0] not in (1, b) or mask.shape[1:3] != (1, 1) or mask.shape[3] != k.shape[2]:
        return f"mask {tuple(mask.shape)} is not [B or 1, 1, 1, S] for S={k.shape[2]}"
    if kv_block(k.shape[2]) is None:
        return f"cache length {k.shape[2]} > 1024 is not a multiple of {LANES}"
    if config.mode == "auto" and q.dtype == jnp.float32:
        return "auto mode: float32 attention stays on XLA (fp32 matmul precision); kernels serve bf16"
    return None


def visible_blocks(mask2, block: int):
    """(first, last) int32 [Bm] cache block holding a visible slot of each mask row ([Bm, S]); a row with
    none visible gets the whole range (its softmax is then over every slot, as the XLA path's)."""
    bm, s = mask2.shape
    vis = jnp.any((mask2 > _MASKED_BELOW).reshape(bm, s // block, block), axis=-1)
    n = s // block
    idx = jnp.arange(n, dtype=jnp.int32)
    first = jnp.min(jnp.where(vis, idx, n), axis=-1)
    last = jnp.max(jnp.where(vis, idx, -1), axis=-1)
    none = last < 0
    return jnp.where(none, 0, first).astype(jnp.int32), jnp.where(none, n - 1, last).astype(jnp.int32)


def _kernel(first_ref, last_ref, q_ref, k_ref, v_ref, m_ref, o_ref, mx, den, acc, *, mask_batch, transposed):
    from jax.experimental import pallas as pl

    b, j = pl.program_id(0), pl.program_id(2)
    mb = b if mask_batch else 0

    @pl.when(j == 0)
    def _init():
        mx[...] = jnp.full(mx.shape, -jnp.inf, jnp.float32)
        den[...] = jnp.zeros(den.shape, jnp.float32)
        acc[...] = jnp.zeros(acc.shape, jnp.float32)

    @pl.when(jnp.logical_and(j >= first_ref[mb], j <= last_ref[mb]))
    def _step():
        q = q_ref[...]  # [G8, D], already scaled
        k = k_ref[...]  # [bk, D], or [D, bk] when transposed
        s = jax.lax.dot_general(q, k, (((1,), (0 if transposed else 1,)), ((), ())),
                                preferred_element_type=jnp.float32)
        s = s + m_ref[...].astype(jnp.float32)  # [1, bk] over the G8 rows
        m_prev = mx[...]  # [G8, LANES], every lane alike
        m_new = jnp.maximum(m_prev, jnp.max(s, axis=-1, keepdims=True))
        alpha = jnp.exp(m_prev - m_new)
        p = jnp.exp(s - m_new[:, :1])
        den[...] = alpha * den[...] + jnp.sum(p, axis=-1, keepdims=True)
        pv = jax.lax.dot_general(p.astype(v_ref.dtype), v_ref[...], (((1,), (1 if transposed else 0,)), ((), ())),
                                 preferred_element_type=jnp.float32)
        acc[...] = alpha[:, :1] * acc[...] + pv
        mx[...] = m_new

    @pl.when(j == pl.num_programs(2) - 1)
    def _done():
        d = den[...][:, :1]
        o_ref[...] = (acc[...] / jnp.where(d == 0.0, 1.0, d)).astype(o_ref.dtype)


def _pallas_decode(q, k, v, mask, *, scale, interpret):
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    b, hq, _, d = q.shape
    hkv, s = k.shape[1], k.shape[2]
    g = hq // hkv
    g8 = -(-g // _SUBLANES) * _SUBLANES
    bk = kv_block(s)
    # The G query heads of each kv head as one [G8, D] tile (zero rows pad it to the sublane count).
    qg = (q[:, :, 0, :] * jnp.asarray(scale, q.dtype)).reshape(b, hkv, g, d)
    if g8 != g:
        qg = jnp.pad(qg, ((0, 0), (0, 0), (0, g8 - g), (0, 0)))
    mask2 = mask.reshape(mask.shape[0], s)
    first, last = visible_blocks(mask2, bk)
    mask3 = mask2[:, None, :]  # [Bm, 1, S]: a [1, bk] block per step
    mask_batch = mask.shape[0] != 1

    # A head dim below the 128 lanes: TPU stores such a cache with the slot axis minor ({2,3,1,0}: a row-major
    # [B, Hkv, D, S]) rather than pad D to 128, so the kernel reads K/V transposed, which is then a bitcast of the
    # caller's buffer. Read row-major, XLA would copy each cache to a padded layout and back, every step.
    transposed = d % LANES != 0
    if transposed:
        k, v = jnp.swapaxes(k, 2, 3), jnp.swapaxes(v, 2, 3)
    kv_block_shape = (None, None, d, bk) if transposed else (None, None, bk, d)

    def kv_map(bi, hi, j, first_ref, last_ref):
        mb = bi if mask_batch else 0
        jj = jnp.minimum(jnp.maximum(j, first_ref[mb]), last_ref[mb])
        return (bi, hi, 0, jj) if transposed else (bi, hi, jj, 0)

    def mask_map(bi, hi, j, first_ref, last_ref):
        mb = bi if mask_batch else 0
        return (bi if mask_batch else 0), 0, jnp.minimum(jnp.maximum(j, first_ref[mb]), last_ref[mb])

    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=2,
        grid=(b, hkv, s // bk),
        in_specs=[
            pl.BlockSpec((None, None, g8, d), lambda bi, hi, j, *_: (bi, hi, 0, 0)),
            pl.BlockSpec(kv_block_shape, kv_map),
            pl.BlockSpec(kv_block_shape, kv_map),
            pl.BlockSpec((None, 1, bk), mask_map),
        ],
        out_specs=pl.BlockSpec((None, None, g8, d), lambda bi, hi, j, *_: (bi, hi, 0, 0)),
        scratch_shapes=[pltpu.VMEM((g8, LANES), jnp.float32), pltpu.VMEM((g8, LANES), jnp.float32),
                        pltpu.VMEM((g8, d), jnp.float32)],
    )
    out = pl.pallas_call(
        functools.partial(_kernel, mask_batch=mask_batch, transposed=transposed),
        grid_spec=grid_spec,
        out_shape=jax.ShapeDtypeStruct((b, hkv, g8, d), q.dtype),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary")),
        interpret=interpret,
        name="tpu_export_decode_attention",
        # XLA cannot see into the kernel: tell its cost model what a full cache costs (the bytes per step
        # are at most this; the clamped index maps read only the visible range)
        cost_estimate=pl.CostEstimate(
            flops=4 * b * hkv * g8 * s * d, transcendentals=b * hkv * g8 * s,
            bytes_accessed=int(k.size * k.dtype.itemsize + v.size * v.dtype.itemsize + 2 * qg.size * qg.dtype.itemsize
                               + mask3.size * mask3.dtype.itemsize)),
    )(first, last, qg, k, v, mask3)
    return out[:, :, :g, :].reshape(b, hq, 1, d)


def decode_attention(q, k, v, mask, *, scale=None, config: PallasConfig):
    """torch's scaled_dot_product_attention for one query token against the cache (see the module doc):
    the flash-decoding kernel on TPU, ``sdpa.xla_attention`` elsewhere (or when ``decode_reason`` says no)."""
    return cache_kernel_or_xla("decode_attention", _pallas_decode, q, k, v, mask, scale=scale, config=config,
                               reason=decode_reason(q, k, v, mask, config))


def cache_kernel_or_xla(name: str, pallas_fn, q, k, v, mask, *, scale, config: PallasConfig, reason):
    """Attention of q against the cache with an additive mask: ``pallas_fn`` (this module's decode kernel or
    prefill_attention's) where ``kernel_or_xla`` takes the kernel (TPU, ``reason`` None), ``sdpa.xla_attention``
    elsewhere; ``scale`` None is 1 / sqrt(head_dim), torch's default."""
    from .sdpa import xla_attention

    sc = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)

    def xla(q, k, v, m):
        return (xla_attention(q, k, v, mask=m, scale=sc),)

    def kernel(q, k, v, m):
        return (pallas_fn(q, k, v, m, scale=sc, interpret=config.interpret),)

    (out,) = kernel_or_xla(name, kernel, xla, (q, k, v, mask), config, reason)
    return out


def repeat_factor(node) -> int:
    """G when the fx ``node`` is transformers' ``repeat_kv`` of a [B, Hkv, S, D] tensor, spelled in core ATen as
    view(clone(expand(unsqueeze(x, 2), [B, Hkv, G, S, D])), [B, Hkv * G, S, D]); 1 otherwise. The kernel then
    reads x itself (``unrepeat``) instead of a G-fold copy of the cache."""
    import torch

    aten = torch.ops.aten
    n = node
    if getattr(n, "target", None) not in (aten.view.default, aten.reshape.default, aten._unsafe_view.default):
        return 1
    n = n.args[0]
    if getattr(n, "target", None) is aten.clone.default:
        n = n.args[0]
    if getattr(n, "target", None) is not aten.expand.default:
        return 1
    shape = n.args[1]
    n = n.args[0]
    if getattr(n, "target", None) is not aten.unsqueeze.default or n.args[1] != 2 or len(shape) != 5:
        return 1
    val = n.args[0].meta.get("val") if hasattr(n.args[0], "meta") else None
    if val is None or val.ndim != 4 or not isinstance(shape[2], int):
        return 1
    return int(shape[2])


def unrepeat(x, g: int):
    """[B, Hkv * G, S, D] holding each kv head G times in a row -> [B, Hkv, S, D] (XLA folds the
    slice of the broadcast back to the original tensor: no copy)."""
    if g == 1:
        return x
    b, h, s, d = x.shape
    return x.reshape(b, h // g, g, s, d)[:, :, 0]
