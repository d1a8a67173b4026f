"""A short causal convolution's state beside the KV cache (LFM2's ``conv`` layers, transformers' Lfm2ShortConv).

Each such layer convolves, channel by channel, its gated input ``B * x`` over the last ``L_cache`` tokens; its
state is the window of the ``L_cache - 1`` inputs before the next token, ``conv_state_<i>`` [B, hidden,
L_cache - 1] (layer i, oldest first). transformers' own cache for LFM2 keeps ``L_cache`` inputs (its decode
kernel concatenates the state and the token and reads the last ``L_cache``); the oldest one is never read, so the
export keeps one fewer and its window equals the last ``L_cache - 1`` columns of transformers' ``conv_states``.

Padding: a ``prefill_<L>`` holds n real tokens, then pads. The state after it must be the window ending at the
last *real* token, not after the pads; the graph takes the window of ``concat(state, inputs)`` that ends at
column n. n comes from ``input_pos``, contiguous for the real tokens: n = max(input_pos) - input_pos[0] + 1, so
a pad row must carry a position no later than the last real token's (LiteRT-LM's engine passes 0, and so does
targets/lm_runtime.prompt_step); the pads' inputs never reach a real row (the convolution is causal).
"""

from __future__ import annotations

import torch

__all__ = ["CONV_MODEL_TYPES", "ConvStateLayer", "conv_states", "real_tokens"]

# model types whose "conv" layers are transformers' Lfm2ShortConv (checked against generate in
# tests/test_llm_lfm2.py); another family's "conv" layers stay refused by layer type
CONV_MODEL_TYPES = frozenset({"lfm2"})


def conv_states(model) -> list[tuple[int, str, tuple[int, int]]]:
    """(layer index, state name, (channels, L_cache - 1)) of each short-convolution layer of ``model``."""
    found = []
    for i, layer in enumerate(model.model.layers):
        conv = getattr(layer, "conv", None)
        if conv is None or type(conv).__name__ != "Lfm2ShortConv":
            continue
        channels, _, width = conv.conv.weight.shape  # depthwise: [hidden, 1, L_cache]
        found.append((i, f"conv_state_{i}", (int(channels), int(width) - 1)))
    return found


def real_tokens(pos, steps: int):
    """The number of real tokens in a block of ``steps`` at positions ``pos`` (see the module docstring), in
    [1, steps]; 1 in decode."""
    if steps == 1:
        return None
    return torch.clamp(pos.max() - pos[0] + 1, 1, steps)


class ConvStateLayer:
    """One short-convolution layer to transformers' Cache (registered as a LinearAttentionCacheLayerMixin in
    ``register``): ``update_conv_state`` hands the model the state followed by the new inputs, the left context
    its causal convolution reads, and keeps the window ending at the last real token as the new ``state``.
    ``has_previous_state`` stays False, so Lfm2ShortConv takes that path in decode too, instead of its in-place
    per-token kernel (an exported graph returns its state, it does not write its input)."""

    supports_early_init = False
    record_past = False

    def __init__(self, state, n_real):
        self.state, self.n_real = state, n_real
        self.has_previous_state = {0: False}
        self.conv_states = {0: state}

    def update_conv_state(self, conv_states, state_idx: int = 0, **kwargs):
        width, steps = self.state.shape[-1], conv_states.shape[-1]
        full = torch.cat([self.state.to(conv_states.dtype), conv_states], dim=-1)  # [B, C, width + steps]
        if self.n_real is None:  # every row real: the last ``width`` columns
            new = full[..., steps:]
        else:
            new = full.index_select(-1, self.n_real + torch.arange(width, device=full.device))
        self.state = new.to(self.state.dtype)
        return full


def register():
    from transformers.cache_utils import LinearAttentionCacheLayerMixin

    # a virtual subclass (an ABC): the Cache's conv-state queries check the layer by isinstance
    LinearAttentionCacheLayerMixin.register(ConvStateLayer)
