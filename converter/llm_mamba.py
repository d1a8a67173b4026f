"""GraniteMoeHybrid's Mamba-2 mixers (transformers' GraniteMoeHybridMambaLayer, its ``linear_attention`` layers in
``config.layer_types``, ``mamba`` in the checkpoints' ``layers_block_type``) beside the KV cache.

Such a layer holds two states: the window of its depthwise causal convolution over x, B and C,
``conv_state_<i>`` [B, conv_dim, d_conv - 1] (conv_dim = mamba_expand * hidden + 2 * n_groups * d_state, oldest
column first; transformers keeps ``d_conv`` columns and never reads the oldest, as for LFM2: converter/llm_conv.py),
and the SSM state, ``recurrent_state_<i>`` [B, mamba_n_heads, mamba_d_head, mamba_d_state]. Neither grows with the
sequence. The model runs through its own GraniteMoeHybridMambaLayer.forward: mamba2_chunk_scan in prefill, handed
the state and returning the new one, and mamba2_selective_state_update in decode, which updates the state it is
given in place; the cache layer hands that one a copy of the input state and returns the copy
(llm_linear.RecurrentStateLayer's ``copy_recurrent``), so the exported graph never writes its input.

Padding: a ``prefill_<L>`` holds n real tokens, then pads (n from ``input_pos``: llm_conv.real_tokens). The conv
window ends at the last real token (llm_conv). The SSM state after the prefill must be the state after the n-th
token: step t multiplies the state by exp(dt_t * A) and adds dt_t * B_t x_t, so a row whose discretized dt is 0
leaves it as it was. ``pads_keep_state`` discretizes dt on the way into mamba2_chunk_scan as the function itself
does first (dt + dt_bias, softplus, clamp to dt_limit) and sets the pad rows' to 0, for the call's duration (dt_bias
and dt_limit could not do it: a pad's dt after them is at least the limit's lower end); dt 0 is what the function's
own padding to a multiple of the chunk amounts to. A pad's x, B and C never reach a real row.
"""

from __future__ import annotations

import contextlib
import sys

import torch

from .llm_linear import real_rows

__all__ = ["MODEL_TYPES", "mamba_states", "pads_keep_state"]

# model types whose "linear_attention" layers are these Mamba-2 mixers, each its modeling module's copy of the same
# code (checked against generate in tests/test_llm_granite_hybrid.py and a families row each); another family's
# Mamba mixers stay refused by layer type
_MIXERS = {"granitemoehybrid": "GraniteMoeHybridMambaLayer", "bamba": "BambaMixer"}
MODEL_TYPES = frozenset(_MIXERS)


def mamba_states(model) -> dict[int, tuple[tuple[str, tuple[int, ...]], ...]]:
    """{layer index: ((conv state name, shape), (SSM state name, shape))}, shapes without the batch axis, of each
    Mamba-2 layer of ``model``."""
    found, cls = {}, _MIXERS.get(getattr(model.config, "model_type", None))
    for i, layer in enumerate(model.model.layers):
        mixer = getattr(layer, "mamba", None)
        if type(mixer).__name__ != cls:
            continue
        found[i] = ((f"conv_state_{i}", (int(mixer.conv_dim), int(mixer.conv_kernel_size) - 1)),
                    (f"recurrent_state_{i}", (int(mixer.num_heads), int(mixer.head_dim), int(mixer.ssm_state_size))))
    return found


@contextlib.contextmanager
def pads_keep_state(model, n_real):
    """For a padded prefill (``n_real`` not None): the chunked scan sees dt = 0 in the pad rows (see the module
    docstring), through the name the mixer's forward calls in its own module."""
    cls = _MIXERS.get(getattr(model.config, "model_type", None))
    mixers = [m for m in model.modules() if type(m).__name__ == cls]
    if n_real is None or not mixers:
        yield
        return
    module = sys.modules[type(mixers[0]).__module__]
    scan = module.mamba2_chunk_scan

    def masked(hidden_states, dt, *args, dt_bias=None, dt_softplus=False, dt_limit=(0.0, float("inf")), **kwargs):
        if dt_bias is not None:
            dt = dt + dt_bias.to(dt.dtype)
        if dt_softplus:
            dt = torch.nn.functional.softplus(dt)
        dt = torch.where(real_rows(dt, n_real), torch.clamp(dt, min=dt_limit[0], max=dt_limit[1]), 0.0)  # [B, T, H]
        return scan(hidden_states, dt, *args, dt_bias=None, dt_softplus=False, **kwargs)

    module.mamba2_chunk_scan = masked
    try:
        yield
    finally:
        module.mamba2_chunk_scan = scan
