"""Scaled dot-product attention: jax's shipped TPU kernels on TPU, plain XLA elsewhere.

Kernels (used as shipped, not rewritten), from ``jax.experimental.pallas.ops.tpu``:
- no mask or ``is_causal``: splash attention (``make_splash_mha_single_device``), vmapped over
  batch. It takes grouped-query heads natively (no K/V repeat) and, with a causal mask,
  skips the kv blocks above the diagonal altogether.
- a mask tensor (additive float or boolean): flash attention with the mask as its additive
  bias ``ab`` (splash takes no additive bias). Flash wants the bias at [B, Hq, Sq, Sk]
  and has no grouped-query support, so the mask is broadcast to that (in q's dtype) and
  K/V heads are repeated: HBM traffic of the mask path is O(seq^2) through the bias.

Sequences are padded up to the 128-lane tile; padded kv positions are excluded through
segment ids (splash) or a large negative bias (flash), padded query rows are sliced off.
Semantics are torch's F.scaled_dot_product_attention: scale defaults to 1/sqrt(D), the
causal mask is top-left aligned (``tril(ones(Sq, Sk))``), a boolean mask marks the keys
that take part, and a query row with no key taking part gives zeros.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from .config import LANES, PallasConfig, block_sizes, matmul_precision
from .dispatch import is_static_shape, kernel_or_xla

__all__ = ["attention", "xla_attention"]

# Finite "minus infinity" for kernel biases: exp() of it is 0, but max()/sub() stay NaN-free.
_MASK_VALUE = -0.7 * float(np.finfo(np.float32).max)
_KERNEL_DTYPES = (jnp.float32, jnp.bfloat16)
AUTO_MIN_KV = 512  # "auto": below this the whole logits row fits a tile and XLA's fusion is as good


def _scale_of(q, scale):
    return 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)


def _row_has_key(mask):
    """[.., Sq, 1]: True where some key takes part (torch gives zeros for the other rows)."""
    if mask.dtype == jnp.bool_:
        return jnp.any(mask, axis=-1, keepdims=True)
    return jnp.any(mask > -jnp.inf, axis=-1, keepdims=True)


def xla_attention(q, k, v, *, mask=None, is_causal=False, scale=None):
    """The plain XLA path: q [B, Hq, Sq, D], k/v [B, Hkv, Sk, D], Hq a multiple of Hkv."""
    b, hq, sq, d = q.shape
    hkv, sk = k.shape[1], k.shape[2]
    group = hq // hkv
    # Group q heads by their kv head instead of repeating K/V: [B, Hkv, G, Sq, D].
    qg = q.reshape(b, hkv, group, sq, d)
    prec = matmul_precision(q.dtype)
    logits = jnp.einsum("bhgqd,bhkd->bhgqk", qg, k, preferred_element_type=jnp.float32, precision=prec)
    logits = logits * _scale_of(q, scale)
    full = (b, hq, sq, sk)
    if is_causal:
        allowed = jnp.arange(sq)[:, None] >= jnp.arange(sk)[None, :]
        logits = jnp.where(allowed, logits, -jnp.inf)
    if mask is not None:
        m = jnp.broadcast_to(mask, full).reshape(b, hkv, group, sq, sk)
        if m.dtype == jnp.bool_:
            logits = jnp.where(m, logits, -jnp.inf)
        else:
            logits = logits + m.astype(jnp.float32)
    row_max = jnp.max(logits, axis=-1, keepdims=True)
    row_max = jnp.where(jnp.isfinite(row_max), row_max, 0.0)  # fully masked rows: exp(-inf) = 0
    p = jnp.exp(logits - row_max)
    denom = jnp.sum(p, axis=-1, keepdims=True)
    out = jnp.einsum("bhgqk,bhkd->bhgqd", p.astype(v.dtype), v, preferred_element_type=jnp.float32, precision=prec)
    out = out / jnp.where(denom == 0.0, 1.0, denom)
    return out.reshape(b, hq, sq, d).astype(q.dtype)


def _pad_seq(x, to, axis=2):
    extra = to - x.shape[axis]
    if extra == 0:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, extra)
    return jnp.pad(x, widths)


def _splash(q, k, v, *, is_causal, scale, blocks, interpret):
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk_lib
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as mask_lib

    b, hq, sq, d = q.shape
    sk = k.shape[2]
    sq_pad = -(-sq // blocks["block_q"]) * blocks["block_q"]
    sk_pad = -(-sk // blocks["block_kv"]) * blocks["block_kv"]
    head_mask = (mask_lib.CausalMask if is_causal else mask_lib.FullMask)((sq_pad, sk_pad))
    kernel = sk_lib.make_splash_mha_single_device(
        mask_lib.MultiHeadMask([head_mask] * hq),
        block_sizes=sk_lib.BlockSizes(**blocks),
        interpret=interpret,
    )
    # Splash has no scale argument: scale q (in its dtype, as torch's fused kernels do).
    qs = _pad_seq(q * jnp.asarray(scale, q.dtype), sq_pad)
    kp, vp = _pad_seq(k, sk_pad), _pad_seq(v, sk_pad)
    if sk_pad == sk:
        out = jax.vmap(kernel)(qs, kp, vp)
    else:
        # Padded keys sit in segment 1, everything else in segment 0: they never take part.
        seg = sk_lib.SegmentIds(
            q=jnp.zeros((sq_pad,), jnp.int32), kv=(jnp.arange(sk_pad) >= sk).astype(jnp.int32)
        )
        out = jax.vmap(lambda q_, k_, v_: kernel(q_, k_, v_, segment_ids=seg))(qs, kp, vp)
    return out[:, :, :sq, :]


def _flash(q, k, v, mask, *, is_causal, scale, blocks, interpret):
    from jax.experimental.pallas import tpu as pltpu
    from jax.experimental.pallas.ops.tpu import flash_attention as fa

    b, hq, sq, d = q.shape
    hkv, sk = k.shape[1], k.shape[2]
    bq, bkv = blocks["block_q"], blocks["block_kv"]
    sq_pad, sk_pad = -(-sq // bq) * bq, -(-sk // bkv) * bkv
    if mask.dtype == jnp.bool_:
        bias = jnp.where(mask, 0.0, _MASK_VALUE).astype(q.dtype)
    else:
        bias = jnp.maximum(mask.astype(q.dtype), jnp.asarray(_MASK_VALUE, q.dtype))
    bias = jnp.broadcast_to(bias, (b, hq, sq, sk))
    # Padded keys get the mask value; padded query rows are sliced off below.
    bias = jnp.pad(bias, ((0, 0), (0, 0), (0, sq_pad - sq), (0, sk_pad - sk)), constant_values=_MASK_VALUE)
    kp = _pad_seq(jnp.repeat(k, hq // hkv, axis=1), sk_pad)
    vp = _pad_seq(jnp.repeat(v, hq // hkv, axis=1), sk_pad)
    qs = _pad_seq(q * jnp.asarray(scale, q.dtype), sq_pad)
    call = lambda: fa.flash_attention(
        qs, kp, vp, bias, causal=is_causal, sm_scale=1.0,
        block_sizes=fa.BlockSizes(block_q=bq, block_k_major=bkv, block_k=bkv, block_b=1),
    )
    if interpret:
        with pltpu.force_tpu_interpret_mode():  # flash_attention takes no interpret flag
            out = call()
    else:
        out = call()
    out = out[:, :, :sq, :]
    return jnp.where(_row_has_key(jnp.broadcast_to(mask, (b, hq, sq, sk))), out, jnp.zeros_like(out))


def _attention_reason(q, k, v, mask, config: PallasConfig) -> str | None:
    if not is_static_shape(q, k, v, mask):
        return "dynamic shapes (Pallas kernels are specialised to static shapes)"
    if q.dtype not in _KERNEL_DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        return f"dtypes q={q.dtype} k={k.dtype} v={v.dtype} (kernels take float32 or bfloat16, all alike)"
    d, sk = q.shape[-1], k.shape[2]
    if k.shape[-1] != d or v.shape[-1] != d:
        return f"head dims q={d} k={k.shape[-1]} v={v.shape[-1]} differ"
    if d > LANES and d % LANES:
        return f"head dim {d} is above {LANES} and not a multiple of it"
    if q.shape[2] == 0 or sk == 0:
        return "empty sequence"
    if config.mode == "auto" and sk < AUTO_MIN_KV:
        return f"auto mode: kv length {sk} < {AUTO_MIN_KV}, XLA's fused softmax is as good"
    if config.mode == "auto" and q.dtype == jnp.float32:
        # jax's kernels leave matmul precision at Mosaic's default; the XLA path asks for
        # HIGHEST, which keeps fp32 parity with torch.
        return "auto mode: float32 attention stays on XLA (fp32 matmul precision); kernels serve bf16"
    return None


def attention(q, k, v, *, mask=None, is_causal=False, scale=None, config: PallasConfig):
    """torch's F.scaled_dot_product_attention (no dropout): q [B, Hq, Sq, D], k/v [B, Hkv, Sk, D].

    Hq must be a multiple of Hkv (grouped-query attention); ``mask`` is additive float or
    boolean, broadcastable to [B, Hq, Sq, Sk]. TPU: splash (no mask / causal) or flash (mask)
    kernels; other platforms: ``xla_attention``.
    """
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"query heads {q.shape[1]} are not a multiple of key/value heads {k.shape[1]}")
    sc = _scale_of(q, scale)
    reason = _attention_reason(q, k, v, mask, config)
    if reason is None:
        b, hq, sq, d = q.shape
        blocks = block_sizes("attention", config.generation, (b, hq, k.shape[1], sq, k.shape[2], d), q.dtype)
    interp = config.interpret

    if mask is None:
        xla = lambda q, k, v: (xla_attention(q, k, v, is_causal=is_causal, scale=sc),)
        kernel = lambda q, k, v: (_splash(q, k, v, is_causal=is_causal, scale=sc, blocks=blocks, interpret=interp),)
        args = (q, k, v)
    else:
        xla = lambda q, k, v, m: (xla_attention(q, k, v, mask=m, is_causal=is_causal, scale=sc),)
        kernel = lambda q, k, v, m: (
            _flash(q, k, v, m, is_causal=is_causal, scale=sc, blocks=blocks, interpret=interp),
        )
        args = (q, k, v, mask)
    (out,) = kernel_or_xla("attention", kernel, xla, args, config, reason)
    return out
