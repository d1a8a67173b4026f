"""The KV-cache write of converter.llm as one op both backends lower to a contiguous in-place update, and the
attention for models whose scores are softcapped or joined by sinks (``grouped_attention``, at the end).

``tpu_export::cache_write(cache, update, pos, dim)`` returns ``cache`` with ``update`` written along ``dim`` at
the slots ``pos[0] .. pos[0] + update.shape[dim] - 1`` (the protocol's positions are contiguous, so the first one
says where the whole block goes). The start is clamped to ``[0, cache.shape[dim] - update.shape[dim]]``, the
semantics of LiteRT's DYNAMIC_UPDATE_SLICE and of XLA's dynamic_update_slice, so eager torch, the .tflite and the
TPU artifact give the same numbers even for an out-of-range start.

Why an op rather than ``index_copy``: an index_copy lowers to a scatter over the whole cache (SCATTER_ND + SELECT
on LiteRT), which reads and writes every slot each step; a dynamic-update-slice writes only the new slots and runs
in place when the runtime aliases the cache input and output (LiteRT-LM on CPU does). It also keeps padded prefills
right when the padding rows carry position 0 (LiteRT-LM fills unused ``input_pos`` entries with 0): the pad rows
land after the real ones, where decode overwrites them before reading, instead of on slot 0.
"""

from __future__ import annotations

import torch

__all__ = ["cache_write", "grouped_attention"]


@torch.library.custom_op("tpu_export::cache_write", mutates_args=())
def cache_write(cache: torch.Tensor, update: torch.Tensor, pos: torch.Tensor, dim: int) -> torch.Tensor:
    _check_update(cache, update, dim)
    n, size = update.shape[dim], cache.shape[dim]
    start = min(max(int(pos.reshape(-1)[0]), 0), size - n)
    out = cache.clone()
    out.narrow(dim, start, n).copy_(update.to(cache.dtype))
    return out


@cache_write.register_fake
def _(cache, update, pos, dim):
    _check_update(cache, update, dim)  # the capture runs this one, not the eager body
    return torch.empty_like(cache)


def _check_update(cache, update, dim: int) -> None:
    """An update must match the cache outside ``dim``: eager's copy would broadcast a narrower one (one KV head into
    all of them) where the backends' dynamic-update-slice writes only its own extent, a silent difference."""
    if update.ndim != cache.ndim or any(u != c for i, (u, c) in enumerate(zip(update.shape, cache.shape))
                                        if i != dim):
        raise ValueError(f"cache_write: an update of shape {tuple(update.shape)} into a cache of "
                         f"{tuple(cache.shape)} differs outside dim {dim}")


def grouped_attention(query, key, value, mask, scale, *, softcap=None, sinks=None):
    """Attention with the two score transforms scaled_dot_product_attention has no place for, written as
    transformers' eager forwards compute them (GPT-OSS's and Gemma 2's ``eager_attention_forward``):

    - ``softcap`` (Gemma 2): scores = tanh(scores / softcap) * softcap, before the mask is added;
    - ``sinks`` [Hq] (GPT-OSS's ``s_aux``): one learned logit per query head joins every row's scores in the
      softmax and its probability is dropped, so a row's weights sum to less than 1.

    query [B, Hq, T, D], key / value [B, Hkv, S, D], mask additive [1 or B, 1, T, S]; returns [B, Hq, T, D]. The
    Hq / Hkv query heads of a KV head are folded into rows (as enable_gqa lowers) rather than repeating the cache
    to every query head (transformers' repeat_kv copies it per layer and step). The softmax runs in float32 (what
    Gemma 2's eager forward does; GPT-OSS's runs in the scores' dtype, the same in a float32 export)."""
    b, hq, t, d = query.shape
    hkv, s = key.shape[1], key.shape[2]
    scores = torch.matmul(query.reshape(b, hkv, (hq // hkv) * t, d), key.transpose(2, 3)) * scale
    scores = scores.reshape(b, hq, t, s)
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if mask is not None:
        scores = scores + mask
    if sinks is not None:
        sink = sinks.to(scores.dtype).reshape(1, hq, 1, 1).expand(b, hq, t, 1)
        probs = torch.softmax(torch.cat([scores, sink], dim=-1).float(), dim=-1)[..., :-1]
    else:
        probs = torch.softmax(scores.float(), dim=-1)
    probs = probs.to(value.dtype).reshape(b, hkv, (hq // hkv) * t, s)
    return torch.matmul(probs, value).reshape(b, hq, t, d)
