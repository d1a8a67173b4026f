"""Kernel hooks of the TPU lowering: SDPA, layer_norm and rms_norm ops, and spelled-out norms.

Importing this module registers the hooks in ``tpu_backend.lowering.KERNEL_HOOKS``; the
lowering consults them when ``use_pallas`` is on (True / "auto" / a PallasConfig) and
imports this module itself then. A hook returns NotImplemented, with the reason logged on
``logging.getLogger("tpu_export.pallas")``, for shapes its kernel cannot take (or, in "auto"
mode, should not take): the table's plain XLA lowering runs instead and the artifact holds no
kernel for that node. A hook that keeps a node emits the kernel-on-TPU / XLA-elsewhere
dispatch (see ``dispatch``), so the same artifact still runs on CPU and GPU.

``norm_pattern_rewrite`` is the pre-pass for norms written out in core ATen (Llama's
``x * rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w``): the last node of each match is
lowered as the fused kernel and the other nodes of the match are skipped.
"""

from __future__ import annotations

import logging

import jax
import torch

from ..lowering.context import jnp_dtype
from ..lowering.helpers import cast
from ..lowering.interpreter import GraphRewrite
from ..lowering.registry import kernel_hook
from .config import LOG, PallasConfig
from .decode_attention import decode_attention, decode_reason, repeat_factor, unrepeat
from .dispatch import is_static_shape
from .norms import _norm_reason, layer_norm, rms_norm
from .patterns import find_norm_patterns
from .prefill_attention import prefill_attention, prefill_reason
from .sdpa import _attention_reason, attention

__all__ = ["norm_pattern_rewrite", "sdpa_hook", "layer_norm_hook", "rms_norm_hook"]

aten = torch.ops.aten


def _decline(ctx, what: str, reason: str):
    # mode=True asked for kernels everywhere: a node kept on XLA is worth a warning; in "auto"
    # mode declining is the rule working, so it is info.
    level = logging.WARNING if ctx.options.pallas.mode is True else logging.INFO
    LOG.log(level, "pallas %s: %s falls back to the XLA lowering: %s", what, ctx.node.name, reason)
    return NotImplemented


# aten::scaled_dot_product_attention(Tensor query, Tensor key, Tensor value, Tensor? attn_mask=None,
#     float dropout_p=0.0, bool is_causal=False, *, float? scale=None, bool enable_gqa=False) -> Tensor
@kernel_hook(aten.scaled_dot_product_attention.default)
def sdpa_hook(ctx, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    cfg = ctx.options.pallas
    if dropout_p:
        return _decline(ctx, "attention", f"dropout_p={dropout_p} (kernels are inference-only)")
    if not (q.ndim == k.ndim == v.ndim and q.ndim in (3, 4)):
        return _decline(ctx, "attention", f"ranks q={q.ndim} k={k.ndim} v={v.ndim} (kernels take 3-D or 4-D)")
    if attn_mask is not None and attn_mask.ndim > 4:
        return _decline(ctx, "attention", f"mask of rank {attn_mask.ndim}")
    dt = ctx.out_dtype
    q, k, v = cast(q, dt), cast(k, dt), cast(v, dt)
    squeeze = q.ndim == 3  # [H, S, D]: torch treats the leading dim as batch-like; the kernel wants [B, H, S, D]
    if squeeze:
        q, k, v = q[None], k[None], v[None]
    if not is_static_shape(q, k, v, attn_mask):
        return _decline(ctx, "attention", "dynamic shapes (Pallas kernels are specialised to static shapes)")
    if attn_mask is not None and not is_causal and q.ndim == 4:
        out = _cache_hook(ctx, q, k, v, attn_mask, scale)
        if out is not NotImplemented:
            return out[0] if squeeze else out
    if q.shape[0] != k.shape[0] or k.shape[:2] != v.shape[:2] or q.shape[1] % k.shape[1]:
        return _decline(ctx, "attention", f"q {tuple(q.shape)} / k {tuple(k.shape)} / v {tuple(v.shape)} "
                        "need equal batch and query heads a multiple of key/value heads")
    if q.shape[1] != k.shape[1] and not enable_gqa:
        return _decline(ctx, "attention", "head counts differ without enable_gqa")
    mask = attn_mask
    if mask is not None:
        mask = mask if mask.dtype == jax.numpy.bool_ else cast(mask, dt)
        mask = mask.reshape((1,) * (4 - mask.ndim) + tuple(mask.shape))
    reason = _attention_reason(q, k, v, mask, cfg)
    if reason is not None:
        return _decline(ctx, "attention", reason)
    out = attention(q, k, v, mask=mask, is_causal=bool(is_causal), scale=scale, config=cfg)
    return out[0] if squeeze else out


def _cache_hook(ctx, q, k, v, mask, scale):
    """Queries against a KV cache with an additive mask shared by the heads (an LLM's decode step, T = 1, and its
    prefill): the flash-decoding / masked prefill kernels, reading the cache un-repeated when the graph repeats it
    per query head (transformers' repeat_kv). NotImplemented leaves the node to the attention path below."""
    cfg = ctx.options.pallas
    g = repeat_factor(ctx.node.args[1])
    if g != repeat_factor(ctx.node.args[2]):
        g = 1
    k, v = unrepeat(k, g), unrepeat(v, g)
    mask = mask.reshape((1,) * (4 - mask.ndim) + tuple(mask.shape))
    if mask.dtype != jax.numpy.bool_:
        mask = cast(mask, ctx.out_dtype)
    decode = q.shape[2] == 1
    reason = (decode_reason if decode else prefill_reason)(q, k, v, mask, cfg)
    if reason is not None:
        LOG.info("pallas %s_attention: %s left to the attention path: %s", "decode" if decode else "prefill",
                 ctx.node.name, reason)
        return NotImplemented
    return (decode_attention if decode else prefill_attention)(q, k, v, mask, scale=scale, config=cfg)


def _norm_hook(ctx, kind, x, normalized_shape, weight, bias, eps):
    cfg = ctx.options.pallas
    nd = len(normalized_shape)
    x = cast(x, ctx.out_dtype)
    reason = _norm_reason(x, nd, cfg)
    if reason is not None:
        return _decline(ctx, f"{kind}_norm", reason)
    if kind == "rms":
        return rms_norm(x, weight, eps, config=cfg, normalized_ndim=nd)
    return layer_norm(x, weight, bias, eps, config=cfg, normalized_ndim=nd)


# aten::layer_norm(Tensor input, SymInt[] normalized_shape, Tensor? weight=None, Tensor? bias=None,
#     float eps=1e-05, bool cudnn_enable=True) -> Tensor
@kernel_hook(aten.layer_norm.default)
def layer_norm_hook(ctx, x, normalized_shape, weight=None, bias=None, eps=1e-5, cudnn_enable=True):
    return _norm_hook(ctx, "layer", x, normalized_shape, weight, bias, eps)


# aten::rms_norm(Tensor input, SymInt[] normalized_shape, Tensor? weight=None, float? eps=None) -> Tensor
@kernel_hook(aten.rms_norm.default)
def rms_norm_hook(ctx, x, normalized_shape, weight=None, eps=None):
    if eps is None:  # torch's default: the machine epsilon of the model's input dtype (not bf16's)
        eps = float(torch.finfo(ctx.arg_meta(0).dtype).eps)
    return _norm_hook(ctx, "rms", x, normalized_shape, weight, None, eps)


class _Abstract:
    """Shape/dtype of a node's value as the lowering will see it, for the kernels' shape rules."""

    def __init__(self, val, options):
        self.shape = tuple(d if isinstance(d, int) else str(d) for d in val.shape)  # a SymInt is not static
        self.dtype = jnp_dtype(val.dtype, options)
        self.ndim = len(self.shape)


def _fused_norm(kind: str, eps: float, config: PallasConfig):
    def lower(ctx, x, weight, bias):
        x = cast(x, ctx.out_dtype)  # the pattern's value is in its end node's dtype, as is the kernel's output
        if kind == "rms_norm":
            return rms_norm(x, weight, eps, config=config, normalized_ndim=1)
        return layer_norm(x, weight, bias, eps, config=config, normalized_ndim=1)

    return lower


def norm_pattern_rewrite(sig, options) -> GraphRewrite:
    """Spelled-out RMSNorm / LayerNorm in ``sig`` -> the fused norm kernel (see module doc).

    A match whose shapes the kernel rule refuses stays as it is (its nodes lower one by one)."""
    cfg = options.pallas
    rewrite = GraphRewrite()
    for m in find_norm_patterns(sig.graph):
        x_val, end_val = m.x.meta.get("val"), m.end.meta.get("val")
        if not isinstance(x_val, torch.Tensor) or not isinstance(end_val, torch.Tensor):
            continue
        if tuple(x_val.shape) != tuple(end_val.shape):
            LOG.info("pallas %s: pattern ending at %s broadcasts its input; left to XLA", m.kind, m.end.name)
            continue
        reason = _norm_reason(_Abstract(end_val, options), 1, cfg)
        if reason is not None:
            level = logging.WARNING if cfg.mode is True else logging.INFO
            LOG.log(level, "pallas %s: pattern ending at %s left to XLA: %s", m.kind, m.end.name, reason)
            continue
        rewrite.lowerings[m.end] = (_fused_norm(m.kind, m.eps, cfg), [m.x, m.weight, m.bias])
        rewrite.skip.update(n for n in m.nodes if n is not m.end)
    return rewrite
