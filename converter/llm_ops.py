"""The KV-cache write of converter.llm as one op both backends lower to a contiguous in-place update.

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

__all__ = ["cache_write"]


@torch.library.custom_op("tpu_export::cache_write", mutates_args=())
def cache_write(cache: torch.Tensor, update: torch.Tensor, pos: torch.Tensor, dim: int) -> torch.Tensor:
    n, size = update.shape[dim], cache.shape[dim]
    start = min(max(int(pos.reshape(-1)[0]), 0), size - n)
    out = cache.clone()
    out.narrow(dim, start, n).copy_(update.to(cache.dtype))
    return out


@cache_write.register_fake
def _(cache, update, pos, dim):
    return torch.empty_like(cache)
