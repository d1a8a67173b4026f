"""The layers whose state is not a KV cache, by family and layer type: what converter.llm's KVCacheLM asks of each.

A kind names, for (config.model_type, a ``config.layer_types`` entry): the state tensors of each such layer
(``states``: model -> {layer index: ((name, shape without the batch axis), ...)}), the cache layer that holds them
in a forward (``layer``: (tensors in that order, n_real) -> a transformers cache layer) and gives them back
(``outputs``: layer -> the updated tensors, same order), and a ``scope`` (model, n_real) -> context manager that
the forward runs under (None: nothing). n_real: the real rows of a padded prefill (llm_conv.real_tokens), None in
decode. A family plugs in with one entry of KINDS.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable

from . import llm_conv, llm_linear, llm_mamba

__all__ = ["KINDS", "StateKind", "families_of_layer_types", "layer_types", "register", "scope", "state_layers"]


@dataclasses.dataclass(frozen=True)
class StateKind:
    states: Callable
    layer: Callable
    outputs: Callable
    scope: Callable | None = None


def _conv_states(model):
    return {i: ((name, shape),) for i, name, shape in llm_conv.conv_states(model)}


_CONV = StateKind(_conv_states, lambda t, n: llm_conv.ConvStateLayer(*t, n), lambda layer: (layer.state,))
_DELTA = StateKind(llm_linear.delta_states, lambda t, n: llm_linear.RecurrentStateLayer(*t, n),
                   lambda layer: layer.outputs(), llm_linear.pads_keep_state)
# Mamba-2's decode updates its SSM state in place: the layer hands it a copy (n_real None: a decode step)
_MAMBA = StateKind(llm_mamba.mamba_states,
                   lambda t, n: llm_linear.RecurrentStateLayer(*t, n, copy_recurrent=n is None),
                   lambda layer: layer.outputs(), llm_mamba.pads_keep_state)
KINDS = {**{(m, "conv"): _CONV for m in llm_conv.CONV_MODEL_TYPES},
         **{(m, "linear_attention"): _DELTA for m in llm_linear.MODEL_TYPES},
         **{(m, "linear_attention"): _MAMBA for m in llm_mamba.MODEL_TYPES}}


def layer_types(cfg) -> tuple[str, ...]:
    """The layer types with an export of their state in this family."""
    kind = getattr(cfg, "model_type", None)
    return tuple(t for m, t in KINDS if m == kind)


def families_of_layer_types() -> dict[str, list[str]]:
    """{layer type: the model types whose layers of that type export}, for a refusal to name."""
    found = {}
    for m, t in KINDS:
        found.setdefault(t, []).append(m)
    return found


def state_layers(model, types) -> dict[int, tuple[StateKind, tuple]]:
    """{layer index: (its kind, ((name, shape), ...))} for every layer of ``model`` whose state is not a KV cache."""
    found = {}
    kind_of = getattr(model.config, "model_type", None)
    for t in dict.fromkeys(types or ()):
        kind = KINDS.get((kind_of, t))
        if kind is not None:
            found.update({i: (kind, states) for i, states in kind.states(model).items()})
    return dict(sorted(found.items()))


@contextlib.contextmanager
def scope(model, layers: dict, n_real):
    """Every kind's scope among ``layers`` (state_layers' result), once each."""
    with contextlib.ExitStack() as stack:
        for kind in dict.fromkeys(k for k, _ in layers.values()):
            if kind.scope is not None:
                stack.enter_context(kind.scope(model, n_real))
        yield


def register():
    from transformers.cache_utils import LinearAttentionCacheLayerMixin

    # virtual subclasses (an ABC): the Cache's conv / recurrent state queries check the layer by isinstance
    LinearAttentionCacheLayerMixin.register(llm_conv.ConvStateLayer)
    LinearAttentionCacheLayerMixin.register(llm_linear.RecurrentStateLayer)
