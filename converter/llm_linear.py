"""Qwen3-Next's gated delta rule layers (transformers' Qwen3NextGatedDeltaNet, its ``linear_attention`` layers)
beside the KV cache.

Such a layer holds two states: the window of its depthwise causal convolution over q, k and v,
``conv_state_<i>`` [B, conv_dim, kernel - 1] (conv_dim = 2 * key heads * key dim + value heads * value dim, oldest
column first; transformers keeps ``kernel`` columns and never reads the oldest, as for LFM2: converter/llm_conv.py),
and the delta rule's recurrent state, ``recurrent_state_<i>`` [B, value heads, key dim, value dim] float32 (the
delta rule runs in float32 whatever the model's dtype). Neither grows with the sequence. The model runs through its
own GatedDeltaNet.forward, torch_chunk_gated_delta_rule in prefill and torch_recurrent_gated_delta_rule in decode;
the cache layer (RecurrentStateLayer) hands it the states and takes back what it returns.

Padding: a ``prefill_<L>`` holds n real tokens, then pads (n from ``input_pos``: llm_conv.real_tokens). The conv
window ends at the last real token (llm_conv). The recurrent state after the prefill must be the state after the
n-th token: step t multiplies the state by exp(g_t) and adds a correction scaled by beta_t, so a row with g = 0
and beta = 0 leaves it as it was (its decay is 1, its update 0). ``pads_keep_state`` sets g and beta of the pad
rows to 0 on the way into torch_chunk_gated_delta_rule, for the call's duration: the same values the function
gives its own padding of the sequence to a multiple of the chunk, so it computes the pads as it computes those.
A pad's q, k and v never reach a real row (causal convolution, causal scan).
"""

from __future__ import annotations

import contextlib
import sys

import torch

from .llm_conv import ConvStateLayer

__all__ = ["MODEL_TYPES", "RecurrentStateLayer", "delta_states", "pads_keep_state", "real_rows"]

# model types whose "linear_attention" layers are Qwen3NextGatedDeltaNet (checked against generate in
# tests/test_llm_qwen3_next.py); another family's linear attention stays refused by layer type
MODEL_TYPES = frozenset({"qwen3_next"})
_MIXER = "Qwen3NextGatedDeltaNet"


def delta_states(model) -> dict[int, tuple[tuple[str, tuple[int, ...]], ...]]:
    """{layer index: ((conv state name, shape), (recurrent state name, shape))}, shapes without the batch axis,
    of each gated delta rule layer of ``model``."""
    found = {}
    for i, layer in enumerate(model.model.layers):
        mixer = getattr(layer, "linear_attn", None)
        if type(mixer).__name__ != _MIXER:
            continue
        found[i] = ((f"conv_state_{i}", (int(mixer.conv_dim), int(mixer.conv_kernel_size) - 1)),
                    (f"recurrent_state_{i}", (int(mixer.num_v_heads), int(mixer.head_k_dim), int(mixer.head_v_dim))))
    return found


class RecurrentStateLayer(ConvStateLayer):
    """A layer with a conv window and a recurrent state, to transformers' Cache (a LinearAttentionCacheLayerMixin,
    registered in llm_state): the window as ConvStateLayer keeps it, the recurrent state replaced by what the model
    passes to ``update_recurrent_state``. ``has_previous_state`` is True, so the model reads the given states (the
    Cache returns None for a layer without one, and the model then starts from zeros); ``record_past`` is True, so
    in decode the model's convolution also goes through ``update_conv_state`` rather than its in-place per-token
    kernel ``causal_conv1d_update`` (an exported graph returns its state, it does not write its input).

    ``copy_recurrent``: the model updates the recurrent state in place in decode (Mamba-2's
    selective_state_update, converter/llm_mamba.py), so the layer hands it a copy of the input state, which the
    exported graph then returns (the input itself is never written)."""

    record_past = True

    def __init__(self, conv, recurrent, n_real, copy_recurrent: bool = False):
        super().__init__(conv, n_real)
        self.has_previous_state = {0: True}
        self.recurrent_states = {0: recurrent.clone() if copy_recurrent else recurrent}

    def update_recurrent_state(self, recurrent_states, state_idx: int = 0, **kwargs):
        self.recurrent_states[0] = recurrent_states.to(self.recurrent_states[0].dtype)
        return self.recurrent_states[0]

    def outputs(self) -> tuple:
        return self.state, self.recurrent_states[0]


def real_rows(x, n_real, axis: int = 1):
    """A bool mask over ``x``'s ``axis`` (the sequence), True for the first ``n_real`` rows, shaped to broadcast."""
    shape = [1] * x.dim()
    shape[axis] = x.shape[axis]
    return (torch.arange(x.shape[axis], device=x.device) < n_real).reshape(shape)


@contextlib.contextmanager
def pads_keep_state(model, n_real):
    """For a padded prefill (``n_real`` not None): the gated delta rule sees g = 0 and beta = 0 in the pad rows
    (see the module docstring), through the name GatedDeltaNet.forward calls in its own module."""
    mixers = [m for m in model.modules() if type(m).__name__ == _MIXER]
    if n_real is None or not mixers:
        yield
        return
    module = sys.modules[type(mixers[0]).__module__]
    chunk = module.torch_chunk_gated_delta_rule

    def masked(query, key, value, g, beta, *args, **kwargs):
        real = real_rows(g, n_real)  # g, beta: [B, T, value heads]
        return chunk(query, key, value, torch.where(real, g, 0.0), torch.where(real, beta, 0.0), *args, **kwargs)

    module.torch_chunk_gated_delta_rule = masked
    try:
        yield
    finally:
        module.torch_chunk_gated_delta_rule = chunk
