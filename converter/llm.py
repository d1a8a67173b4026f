"""A ``transformers`` causal LM as ``prefill_<L>`` / ``decode`` signatures with its KV cache as explicit state.

The cache protocol (what every signature takes and returns; static shapes, batch B = 1 unless asked):

- inputs: ``tokens`` int32 [B, T] (T = L for ``prefill_<L>``, 1 for ``decode``), ``input_pos`` int32 [T]
  (the cache slot, which is also the RoPE position, of each token; shared by the whole batch), and per layer i
  ``kv_cache_k_<i>`` and ``kv_cache_v_<i>``, each [B, kv_heads, cache_len, head_dim]
  (axes: batch, kv head, cache slot = sequence axis 2, channel). V has the same layout as K (litert-torch's
  export stores V transposed, [1, kv_heads, head_dim, cache_len]): LiteRT-LM runs either (its ExecutorMetadata
  says which axis is the sequence), and on XNNPACK the attention's P.V over a 1024-slot cache took 8.2 ms here
  against 14.0 ms with V transposed (12 layers, 1 thread), so one layout serves both backends.
  These names, ``tokens`` / ``input_pos`` and the ``logits`` output are what LiteRT-LM's engine looks up.
- outputs: ``logits`` float [B, T, vocab] and the updated ``kv_cache_k_<i>`` / ``kv_cache_v_<i>`` (same shapes).
  Batch 1 is what LiteRT-LM runs (the .litertlm bundle); a batch > 1 (rows at the same positions) is for TPU.
- ``input_pos`` is contiguous, ``input_pos[0] + t`` for the real tokens: the T new keys and values are written as
  one block at slots ``input_pos[0] .. input_pos[0] + T - 1`` (converter.llm_ops.cache_write: a
  dynamic-update-slice on axis 2, not a scatter) before attention; query t attends to the slots
  ``<= input_pos[t]`` (and ``> input_pos[t] - sliding_window`` in a sliding-window layer: the cache keeps every
  slot, the mask applies the window; in ``decode`` such a layer attends over only the ``sliding_window`` slots
  ending at its position, gathered from the cache, when the window is shorter than the cache; in a chunked layer,
  ``config.attention_chunk_size``, only its own chunk's, ``slot // chunk == input_pos[t] // chunk``), so stale slots
  past the current position are never read and a short prompt
  can be padded to L: the pad rows' positions may be anything (LiteRT-LM passes 0), their keys land after the
  prompt's and decode overwrites them before it reads them; a model with a convolution state (LFM2's ``conv``
  layers: ``conv_state_<i>`` [B, hidden, L_cache - 1] beside the caches, converter/llm_conv.py) counts its real
  rows as max(input_pos) - input_pos[0] + 1, so its pads must carry a position no later than the last real one's
  (0 does). Keep ``input_pos[0] + T <= cache_len`` (a block that
  would run past the end is moved back to end at the last slot, as dynamic-update-slice clamps).
- the caller owns the state: it passes zeros first, then each call's returned caches to the next call, and keeps
  every position below ``cache_len`` (the graph cannot raise; tpu_export.generate checks it).

Slots (cache protocol version 2, ``prepare_lm(slots=B)``, TPU/XLA targets): two more signatures for continuous
batching, beside the batch-1 ``prefill_<L>`` and ``decode`` above (unchanged):

- ``decode_slots``: ``tokens`` int32 [B, 1], ``input_pos`` int32 [B] (each slot's own position: slot b's token is
  written at slot ``input_pos[b]`` of row b, by a scatter, and row b attends to its slots ``<= input_pos[b]``), the
  caches [B, kv_heads, cache_len, head_dim]; returns ``logits`` [B, 1, vocab] and the caches. Each row is computed
  from its own inputs only: a free slot's row is ignored by the caller, whatever it holds.
- ``decode_slots_<k>`` for k = 4, 8, 16... below B: the same over the first k rows (``tokens`` [k, 1],
  ``input_pos`` [k], the B-row caches, ``logits`` [k, 1, vocab]); the other rows are neither read nor written.
- ``insert_slot``: ``slot`` int32 [1], the B-row caches and ``new_kv_cache_k_<i>`` / ``new_kv_cache_v_<i>`` (a
  request's batch-1 caches, as its ``prefill_<L>`` calls returned them); returns the B-row caches with row ``slot``
  replaced by the request's (a dynamic-update-slice on axis 0).
- ``slots_prefill_<L>`` for each prefill length L: ``tokens`` int32 [k, L], ``input_pos`` int32 [L] (the chunk's
  positions, shared by the k requests), ``rows`` int32 [k] (k = ``slots_prefill_rows(B)``), the B-row caches;
  prefills k requests' chunks at once, each into its row (the rows read, prefilled at batch k, written back), no
  logits. A row listed twice gets the same tokens both times. On a CPU a call's cost is mostly reading the weights
  once, so k requests prefilled in one call cost about as much as two or three prefilled alone.

A request is prefilled alone at batch 1, inserted into a free row, then decoded with the others, each row at its own
length; a row's stale slots past its position are never read, so a row is reused without clearing it.

The model runs through its own ``transformers`` modeling code: the wrapper hands it a Cache whose layers hold the
input tensors and update them functionally, a 4-D additive mask built from ``input_pos``, and ``position_ids``.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from . import llm_conv, llm_state
from .errors import ExportFailedError, UnsupportedModelError
from .llm_errors import capture_failure, unsupported_layer_types
from .llm_families import cache_heads, refuse_unexported_config
from .llm_mla import mla_attention, mla_cache_widths
from .llm_ops import cache_write, grouped_attention
from .pipeline import SignatureRequest, prepare_many

__all__ = ["CACHE_PROTOCOL", "CacheSpec", "KVCacheLM", "lm_requests", "prepare_lm", "slot_sizes",
           "slots_prefill_rows"]

CACHE_PROTOCOL = 2  # lm.json's cache_protocol: 1 the batch-1 signatures alone, 2 adds decode_slots / insert_slot


@dataclasses.dataclass(frozen=True)
class CacheSpec:
    """Shapes of the explicit state: K tensors of [batch, kv_heads, cache_len, head_dim] and V tensors of
    [batch, kv_heads, cache_len, v_head_dim] for each attention layer (``kv_layers``: their indices, None: all
    ``num_layers``; ``v_head_dim`` None: head_dim, the usual K/V cache; an MLA model caches its latent as K and
    its rope key as V, of different widths: converter/llm_mla.py), then the ``states``: (name, shape without the
    batch axis) of every other state tensor, such as a short convolution's window of inputs (``conv_state_<i>``
    [batch, hidden, L_cache - 1], converter/llm_conv.py), passed in and returned like the caches."""

    num_layers: int
    kv_heads: int
    cache_len: int
    head_dim: int
    dtype: torch.dtype = torch.float32
    batch: int = 1
    v_head_dim: int | None = None
    kv_layers: tuple[int, ...] | None = None
    states: tuple[tuple[str, tuple[int, ...]], ...] = ()

    @property
    def v_width(self) -> int:
        return self.head_dim if self.v_head_dim is None else self.v_head_dim

    @property
    def kv_layer_ids(self) -> tuple[int, ...]:
        return tuple(range(self.num_layers)) if self.kv_layers is None else tuple(self.kv_layers)

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """The one shape of every K/V cache tensor; for K and V of different widths, ``shape_of(name)``."""
        if self.v_width != self.head_dim:
            raise ValueError(f"this cache's K ({self.head_dim} wide) and V ({self.v_width} wide) differ in shape: "
                             "use CacheSpec.shape_of(name) or shapes()")
        return (self.batch, self.kv_heads, self.cache_len, self.head_dim)

    def shape_of(self, name: str) -> tuple[int, ...]:
        """The shape of the state tensor ``name`` (a K, a V or one of ``states``, from ``names()``)."""
        extra = dict(self.states)
        if name in extra:
            return (self.batch, *extra[name])
        width = self.v_width if name.startswith("kv_cache_v_") else self.head_dim
        return (self.batch, self.kv_heads, self.cache_len, width)

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {n: self.shape_of(n) for n in self.names()}

    @property
    def bytes_per_token(self) -> int:
        """Bytes one cache slot takes in every attention layer, K and V, per batch row (``states`` do not grow)."""
        return len(self.kv_layer_ids) * self.kv_heads * (self.head_dim + self.v_width) * self.dtype.itemsize

    @property
    def nbytes(self) -> int:
        """Bytes of the whole state: K and V of every attention layer and the ``states``."""
        fixed = sum(math.prod(shape) for _, shape in self.states) * self.dtype.itemsize
        return self.batch * (self.cache_len * self.bytes_per_token + fixed)

    def names(self) -> list[str]:
        """Input/output names: K and V of each attention layer in order (LiteRT-LM's ``kv_cache_k_<i>`` naming,
        ``i`` the layer's index in the model), then the ``states``."""
        return [f"kv_cache_{kind}_{i}" for i in self.kv_layer_ids for kind in ("k", "v")] + \
            [name for name, _ in self.states]

    def zeros(self) -> dict[str, torch.Tensor]:
        return {n: torch.zeros(self.shape_of(n), dtype=self.dtype) for n in self.names()}


class _StateLayer:
    """One layer of the explicit cache: ``update`` writes the new keys/values at ``pos`` out of place (so the
    exported graph returns them) and hands back the whole cache for attention. ``repeats``: the model passes each
    KV head that many times (llm_families.cache_heads); the cache keeps one copy and attention gets them all.
    A transformers attention layer to the Cache (registered as a CacheLayerMixin in ``_explicit_cache``), so the
    Cache's per-layer queries (``get_seq_length``, ``get_mask_sizes``) reach it."""

    is_sliding = False
    is_compileable = True
    supports_early_init = False  # given its tensors, never allocated by transformers

    def __init__(self, keys, values, pos, window_slots=None, repeats: int = 1, slots: bool = False):
        self.keys, self.values, self.pos, self.is_initialized = keys, values, pos, True
        self.window_slots, self.repeats, self.slots = window_slots, int(repeats), slots
        self.length = pos[0]  # the tokens before this call's block (its first position; input_pos is contiguous)

    def lazy_initialization(self, key_states, value_states):  # the layer holds the caller's tensors from the start
        pass

    def update(self, key_states, value_states, *args, **kwargs):
        # equal copies of each KV head, consecutive (llm_families.cache_heads): keep the first, and hand attention
        # the copies back. Where the model passes its KV heads once (Falcon's new decoder from transformers 5.25 on,
        # whose attention repeats them itself), they go through as they are.
        repeated = self.repeats > 1 and key_states.shape[1] != self.keys.shape[1]
        if repeated:
            key_states, value_states = key_states[:, ::self.repeats], value_states[:, ::self.repeats]
        write = _slot_write if self.slots else cache_write
        self.keys = write(self.keys, key_states, self.pos, 2)
        self.values = write(self.values, value_states, self.pos, 2)
        self.length = self.pos[0] + key_states.shape[2]
        keys, values = self.keys, self.values
        if self.slots and key_states.shape[0] < keys.shape[0]:  # decode_slots_<k>: attention over the first k rows
            keys, values = keys[:key_states.shape[0]], values[:key_states.shape[0]]
        if self.window_slots is not None:  # a sliding layer's decode reads only its window (KVCacheLM._window)
            keys, values = keys.index_select(2, self.window_slots), values.index_select(2, self.window_slots)
        if repeated:
            keys, values = _repeat_heads(keys, self.repeats), _repeat_heads(values, self.repeats)
        return keys, values

    def get_seq_length(self):
        """The tokens in the cache, as transformers' layers count them: the positions before this call's block,
        then, once ``update`` wrote it, through its end; a 0-d tensor, as transformers' StaticLayer returns (Llama
        4's attention temperature reads it before the update as the block's first position)."""
        return self.length

    def get_mask_sizes(self, query_length: int):
        """(kv_length, kv_offset) of the keys ``update`` returns: the whole cache from slot 0, or a sliding
        layer's decode window from its first slot."""
        if self.window_slots is not None:
            return self.window_slots.shape[0], self.window_slots[0]
        return self.keys.shape[2], 0

    def get_max_length(self):
        return self.keys.shape[2]


def _slot_write(cache, update, pos, dim: int):
    """``decode_slots``' cache write: row b's one new key (or value) at slot ``pos[b]`` of row b, as one scatter
    (each row at its own position, so no one dynamic-update-slice does); in place when the cache is donated."""
    rows = torch.arange(update.shape[0], device=pos.device)  # the first k rows (decode_slots_<k>) or all B
    out = cache.clone()
    out[rows, :, pos] = update[:, :, 0].to(cache.dtype)  # [k, heads, width] at (b, :, pos[b], :)
    return out


def _repeat_heads(x, repeats: int):
    """[B, H, S, D] -> [B, H * repeats, S, D], each head ``repeats`` times in a row (transformers' repeat_kv)."""
    b, h, s, d = x.shape
    return x[:, :, None].expand(b, h, repeats, s, d).reshape(b, h * repeats, s, d)


def _explicit_cache(layers):
    from transformers.cache_utils import Cache, CacheLayerMixin

    # a virtual subclass (CacheLayerMixin is an ABC): the Cache's queries dispatch to attention layers by isinstance
    CacheLayerMixin.register(_StateLayer)
    llm_state.register()
    return Cache(layers=layers)


class KVCacheLM(torch.nn.Module):
    """Wraps a ``transformers`` causal LM in the cache protocol above. Seen matching transformers' generate:
    Llama, Qwen2, Qwen3, Phi-3, Gemma 3 text (sliding-window and global layers), Gemma 2 (logit softcapping),
    Mixtral and GPT-OSS (attention sinks; top-k of N experts, switched to transformers' static-shape
    ``batched_mm`` experts), Falcon (both decoder architectures, rotary; its KV heads cached once:
    llm_families.cache_heads) and Llama 4 text (chunked and global layers, NoPE layers' attention temperature
    from ``get_seq_length``, top-1 MoE with a shared expert), LFM2 (short convolutions beside attention, each
    conv layer's window of inputs passed as state: converter/llm_conv.py), Qwen3-Next (gated delta rule layers'
    conv windows and recurrent states: converter/llm_linear.py) and GraniteMoeHybrid (Mamba-2 layers' conv windows
    and SSM states: converter/llm_mamba.py); llm_state.KINDS lists these layers.

    Call: ``forward(tokens, input_pos, **caches) -> {"logits": ..., **updated caches}``.
    """

    def __init__(self, model, cache_len: int, dtype: torch.dtype = torch.float32, batch: int = 1,
                 slots: bool = False):
        super().__init__()
        if int(batch) < 1:
            raise ValueError(f"batch must be >= 1, got {batch}")
        self.slots = bool(slots)  # decode_slots: input_pos [batch], one position per row
        cfg = model.config
        heads = cfg.num_attention_heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
        self.model = model.eval()
        self.layer_types = _layer_types(cfg)
        # the layers whose state is not a KV cache (llm_state.KINDS): {index: (kind, ((name, shape), ...))}
        self.stateful = llm_state.state_layers(model, self.layer_types)
        # a mixture of experts: transformers' default grouped_mm dispatch sorts tokens by expert (data-dependent
        # shapes, histc); its batched_mm gathers each token's top-k expert weights instead (static shapes, the
        # same numbers). This switches the given model object.
        if getattr(model, "_can_set_experts_implementation", lambda: False)() and \
                getattr(cfg, "_experts_implementation", None) != "batched_mm":
            model.set_experts_implementation("batched_mm")
        refuse_unexported_config(cfg)
        kv_heads, self.repeats = cache_heads(cfg)
        v_head_dim = None
        mla = mla_cache_widths(model)  # multi-head latent attention: one latent "head" and a shared rope key
        if mla is not None:
            kv_heads, head_dim, v_head_dim = 1, *mla
        kv_layers, states = None, ()
        if self.stateful:  # K/V for the attention layers only, the other layers' own states for these
            kv_layers = tuple(i for i in range(cfg.num_hidden_layers) if i not in self.stateful)
            states = tuple(s for _, layer_states in self.stateful.values() for s in layer_states)
        self.spec = CacheSpec(cfg.num_hidden_layers, kv_heads,
                              int(cache_len), head_dim, dtype, int(batch), v_head_dim, kv_layers, states)
        if self.slots:
            _refuse_slots(model, self)

    def _masks(self, pos, window_slots=None):
        """The additive attention mask from positions: query t sees the slots <= its position (and, in a
        sliding-window layer, > its position - window). Models with ``config.layer_types`` take one mask per
        type (transformers' own convention for mixed layers, e.g. Gemma 3). ``window_slots``: the cache slots a
        sliding layer reads (``_window``); its mask is over those, not the whole cache."""
        slots = torch.arange(self.spec.cache_len, device=pos.device)
        if self.slots:  # one query per row at its own position: masks [B, 1, 1, cache_len]
            pos = pos[:, None]
        causal = slots <= pos[..., None]  # [T, cache_len] ([B, 1, cache_len] for slots)
        dtype = self.model.get_input_embeddings().weight.dtype
        window = self._sliding_window()
        sliding = None
        if window:
            seen = slots if window_slots is None else window_slots
            sliding = (seen <= pos[..., None]) & (seen > pos[..., None] - window)
        if self.layer_types is None:
            # no per-layer types: every layer slides when the config sets a window (Mistral, Phi-3, Mixtral)
            return _additive(causal if sliding is None else sliding, dtype)
        masks = {"full_attention": _additive(causal, dtype)}
        for t in llm_state.layer_types(self.model.config):  # no padding mask: the pads follow the real rows
            masks[t] = None
        if "sliding_attention" in self.layer_types:
            masks["sliding_attention"] = _additive(sliding, dtype)
        if "chunked_attention" in self.layer_types:  # transformers' chunked_overlay: the key in the query's chunk
            chunk = int(self.model.config.attention_chunk_size)
            masks["chunked_attention"] = _additive(causal & (slots >= (pos - pos % chunk)[..., None]), dtype)
        return masks

    def _sliding_window(self) -> int | None:
        window = getattr(self.model.config, "sliding_window", None)
        return int(window) if window else None

    def _window(self, pos, steps: int):
        """The cache slots a sliding-window layer reads in ``decode`` (one token at position p): the window's
        slots (p - window, p], as ``window`` slots starting at p - window + 1 clamped into the cache (a start
        below 0 reads slots the mask hides). None outside decode, or when the window is not shorter than the
        cache. Gathering them costs a copy of the window; attending over the whole cache costs, on XNNPACK, a
        packing of every slot of K and V per layer and step (~1/3 of an int8 decode step, bench/kv_layout.py), so
        a 512-slot window over a 1024-slot cache halves that layer's attention, and a 4096-slot cache's by 8x."""
        window = self._sliding_window()
        if steps != 1 or not window or window >= self.spec.cache_len or self.slots:  # slots: each row its own
            return None
        start = torch.clamp(pos[:1] - (window - 1), 0, self.spec.cache_len - window)
        return start + torch.arange(window, device=pos.device)

    def _slides(self, i: int) -> bool:
        if self.layer_types is None:
            return self._sliding_window() is not None
        return self.layer_types[i] == "sliding_attention"

    def forward(self, tokens, input_pos, **caches):
        pos = input_pos.to(torch.long)
        window = self._window(pos, tokens.shape[1])
        n_real = llm_conv.real_tokens(pos, tokens.shape[1]) if self.stateful else None
        layers = [self._state_layer(i, caches, n_real) if i in self.stateful else
                  _StateLayer(caches[f"kv_cache_k_{i}"], caches[f"kv_cache_v_{i}"], pos,
                              window if self._slides(i) else None, self.repeats, self.slots)
                  for i in range(self.spec.num_layers)]
        # one position row per batch row: shared, or each slot's own
        position_ids = pos[:, None] if self.slots else pos[None].expand(tokens.shape[0], -1)
        with _grouped_query_sdpa(self.model.config), mla_attention(self.model), \
                llm_state.scope(self.model, self.stateful, n_real):
            out = self.model(input_ids=tokens.to(torch.long), attention_mask=self._masks(pos, window),
                             position_ids=position_ids, cache=_explicit_cache(layers), use_cache=True)
        state = {}
        for i, layer in enumerate(layers):
            if i in self.stateful:
                kind, layer_states = self.stateful[i]
                state.update(zip((name for name, _ in layer_states), kind.outputs(layer)))
            else:
                state[f"kv_cache_k_{i}"], state[f"kv_cache_v_{i}"] = layer.keys, layer.values
        return {"logits": out.logits, **{n: state[n] for n in self.spec.names()}}  # in the inputs' order

    def _state_layer(self, i: int, caches, n_real):
        kind, layer_states = self.stateful[i]
        return kind.layer(tuple(caches[name] for name, _ in layer_states), n_real)


_GQA_SDPA = "tpu_export_gqa_sdpa"


# What transformers' attention call may pass that this forward takes into account elsewhere, so ignoring it here
# changes nothing: the rotary positions are already applied to q and k (position_ids), a sliding layer's window is
# in the mask (sliding_window; KVCacheLM._masks), the cache is ours (use_cache), and the router logits are an
# output of the MoE block, not of attention (output_router_logits).
_ATTENTION_KWARGS_IN_THE_MASK_OR_CACHE = frozenset({"position_ids", "sliding_window", "use_cache",
                                                    "output_router_logits", "cache_position", "output_attentions"})
# Names a user recognises for the attention features that change the result and are not exported.
_ATTENTION_FEATURES = {"s_aux": "attention sinks (s_aux, as in GPT-OSS)",
                       "softcap": "attention logit softcapping (softcap, as in Gemma 2)",
                       "position_bias": "an additive position bias (position_bias)"}
# The attention layers whose sinks / softcap llm_ops.grouped_attention computes as their own eager forward does
# (checked against transformers' generate in tests/test_llm_sinks_softcap.py). The argument names alone do not say
# the form: another family may pass s_aux or softcap to an eager forward of its own, so any other layer passing
# them stays refused by name.
_IMPLEMENTED_FEATURES = {"s_aux": frozenset({"GptOssAttention"}), "softcap": frozenset({"Gemma2Attention"})}


def _refuse_unimplemented_attention_arguments(module, kwargs) -> None:
    """Every argument transformers' attention call passes is implemented or refused by name: one ignored would
    convert without an error and generate the wrong text. (``dropout`` is 0: the export runs the model in eval
    mode.)"""
    layer = type(module).__name__
    for name, value in kwargs.items():
        if name in _ATTENTION_KWARGS_IN_THE_MASK_OR_CACHE or value is None or value is False:
            continue
        if layer in _IMPLEMENTED_FEATURES.get(name, ()):
            continue
        what = _ATTENTION_FEATURES.get(name, f"the attention argument {name}={type(value).__name__}")
        raise UnsupportedModelError(f"{layer} passes {what}, which the KV-cache export does not "
                                    "implement for this layer; converting without it would generate the wrong "
                                    "text. Models whose attention takes only q, k, v, a mask and a scale export "
                                    "(Llama, Qwen2/3, Phi-3, Gemma 3, Mixtral, ...), and so do GPT-OSS's attention "
                                    "sinks and Gemma 2's logit softcapping")


def _gqa_sdpa_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None,
                      s_aux=None, softcap=None, **kwargs):
    """transformers' attention-function contract (query [B, Hq, T, D], key/value [B, Hkv, S, D] -> [B, T, Hq, D])
    as one scaled_dot_product_attention over the un-repeated cache (``enable_gqa``). transformers' own sdpa path
    repeats K/V to every query head whenever a mask is given (``repeat_kv``: an expand + copy of the whole cache per
    layer and step); both backends lower enable_gqa with the query heads of a KV head folded into rows instead
    (the LiteRT decode of a GQA Llama wrote 162.6 MB of repeated K/V per step before, 22.5 MB for the peer).
    Attention sinks (``s_aux``) or a logit softcap have no place in an SDPA: those layers run
    llm_ops.grouped_attention (the same folding, the scores written out), without the backends' fused attention
    paths (the edge's decode over the filled cache prefix, the TPU's Pallas attention kernels)."""
    _refuse_unimplemented_attention_arguments(module, {**kwargs, "s_aux": s_aux, "softcap": softcap})
    if scaling is None:  # transformers' eager default
        scaling = query.shape[-1] ** -0.5
    if s_aux is not None or softcap is not None:
        out = grouped_attention(query, key, value, attention_mask, scaling, softcap=softcap, sinks=s_aux)
    else:
        out = torch.nn.functional.scaled_dot_product_attention(
            query, key, value, attn_mask=attention_mask, dropout_p=0.0, scale=scaling,
            enable_gqa=query.shape[1] != key.shape[1])
    return out.transpose(1, 2).contiguous(), None


class _grouped_query_sdpa:  # noqa: N801 - used as a context manager, like torch.no_grad
    """Runs the model's attention through ``_gqa_sdpa_forward`` for the duration of a call (the capture traces
    it): registered under our own name in transformers' AttentionInterface (on first use, never at import) and
    selected on the model's config, then the user's choice is restored."""

    def __init__(self, config):
        self.config, self.saved = config, None

    def __enter__(self):
        from transformers import AttentionInterface

        AttentionInterface.register(_GQA_SDPA, _gqa_sdpa_forward)  # idempotent: our name, our function
        self.saved = self.config._attn_implementation
        self.config._attn_implementation = _GQA_SDPA
        return self

    def __exit__(self, *exc):
        self.config._attn_implementation = self.saved
        return False


_LAYER_TYPES = ("full_attention", "sliding_attention", "chunked_attention")


def _layer_types(cfg) -> list[str] | None:
    types = getattr(cfg, "layer_types", None)
    if types is None:
        return None
    known = _LAYER_TYPES + llm_state.layer_types(cfg)
    odd = sorted(set(types) - set(known))
    if odd:
        raise unsupported_layer_types(cfg, odd, _LAYER_TYPES, llm_state.families_of_layer_types())
    if "sliding_attention" in types and not getattr(cfg, "sliding_window", None):
        raise ValueError(f"{type(cfg).__name__}: sliding_attention layers but no sliding_window in the config")
    if "chunked_attention" in types and not getattr(cfg, "attention_chunk_size", None):
        raise ValueError(f"{type(cfg).__name__}: chunked_attention layers but no attention_chunk_size in the config")
    return list(types)


def _additive(visible, dtype):
    mask = torch.where(visible, 0.0, torch.finfo(dtype).min).to(dtype)
    return mask[None, None] if mask.ndim == 2 else mask[:, None]  # [1, 1, T, cache_len] or [B, 1, 1, cache_len]


def _refuse_slots(model, lm) -> None:
    """decode_slots writes and masks each row at its own position; the layers that read one position for the whole
    batch are refused by name rather than exported wrong."""
    from .llm_errors import family_of

    cfg = model.config
    what = None
    if lm.stateful:
        what = "layers with a state beside the KV cache (convolution or recurrent state)"
    elif mla_cache_widths(model) is not None:
        what = "multi-head latent attention"
    elif lm.layer_types is not None and "chunked_attention" in lm.layer_types or \
            getattr(cfg, "attn_temperature_tuning", None):
        what = "chunked attention / attention temperature read from the cache length"
    if what is not None:
        raise UnsupportedModelError(f"{family_of(model)}: slots (continuous batching) are not exported for {what}; "
                                    "convert without slots (the batch-1 prefill and decode signatures serve it one "
                                    "request at a time)")


class _CachesOnly(torch.nn.Module):
    """A prefill signature without logits: the runtime's loop (LiteRT-LM's, and tpu_export.generate's) prefills
    the prompt but its last token and feeds that one through ``decode``, so a prefill's logits are never read; left
    out, the capture drops the final norm and the vocabulary projection of every prefill row (for a 134 M Llama,
    0.79 of prefill_32's 3.5 GMAC). Shares ``lm``'s parameters (one copy of the weights in the Program)."""

    def __init__(self, lm):
        super().__init__()
        self.lm = lm

    def forward(self, tokens, input_pos, **caches):
        return {k: v for k, v in self.lm(tokens, input_pos, **caches).items() if k != "logits"}


class _InsertSlot(torch.nn.Module):
    """``insert_slot``: the B-row caches with row ``slot`` replaced by a request's batch-1 caches (``new_<name>``),
    a dynamic-update-slice on axis 0 per cache (in place when the B-row caches are donated)."""

    def __init__(self, names):
        super().__init__()
        self.names = list(names)

    def forward(self, slot, **caches):
        return {n: cache_write(caches[n], caches[f"new_{n}"], slot, 0) for n in self.names}


class _SlotsPrefill(torch.nn.Module):
    """``slots_prefill_<L>``: the chunks of ``k`` requests prefilled at batch k (``lm``, without logits) into their
    rows ``rows`` of the B-row caches: the rows read (index_select), prefilled, written back one row each (a
    dynamic-update-slice on axis 0, in place when the B-row caches are donated)."""

    def __init__(self, lm, names):
        super().__init__()
        self.lm, self.names = lm, list(names)

    def forward(self, tokens, input_pos, rows, **caches):
        out = self.lm(tokens, input_pos, **{n: caches[n].index_select(0, rows) for n in self.names})
        written = {}
        for n in self.names:
            c = caches[n]
            for i in range(tokens.shape[0]):
                c = cache_write(c, out[n][i:i + 1], rows[i:i + 1], 0)
            written[n] = c
        return written


SLOT_SIGNATURES = ("decode_slots", "insert_slot")  # and decode_slots_<k> (slot_sizes), slots_prefill_<L>


def lm_requests(lm: KVCacheLM, prefill_lengths, *, prefill_logits: bool = True,
                slots: int | None = None) -> list[SignatureRequest]:
    """One SignatureRequest per ``prefill_<L>`` and one for ``decode``, all on the same module (shared weights).
    ``prefill_logits=False``: the prefill signatures return only the updated caches (see ``_CachesOnly``).
    ``slots``: B, adds ``decode_slots`` and ``insert_slot`` over B rows (the protocol above; ``lm`` at batch 1)."""
    lengths = sorted({int(n) for n in prefill_lengths})
    if not lengths or lengths[0] < 1 or lengths[-1] > lm.spec.cache_len:
        raise ValueError(f"prefill lengths {list(prefill_lengths)} must be >= 1 and <= the cache length "
                         f"{lm.spec.cache_len}")
    prefill = lm if prefill_logits else _CachesOnly(lm).eval()
    reqs = []
    for name, t in [(f"prefill_{n}", n) for n in lengths] + [("decode", 1)]:
        args = (torch.zeros(lm.spec.batch, t, dtype=torch.int32), torch.arange(t, dtype=torch.int32))
        reqs.append(SignatureRequest(name, lm if name == "decode" else prefill, args, lm.spec.zeros()))
    if slots is not None:
        reqs += _slot_requests(lm, int(slots), lengths)
    return reqs


def _slot_requests(lm: KVCacheLM, slots: int, lengths=()) -> list[SignatureRequest]:
    if not isinstance(lm, KVCacheLM) or lm.spec.batch != 1:
        raise ValueError("slots need a KVCacheLM of batch 1 (its prefill and decode signatures serve one request)")
    if slots < 1:
        raise ValueError(f"slots must be >= 1, got {slots}")
    rows = KVCacheLM(lm.model, lm.spec.cache_len, lm.spec.dtype, batch=slots, slots=True).eval()  # same weights
    reqs = [SignatureRequest(f"decode_slots_{k}" if k < slots else "decode_slots", rows,
                             (torch.zeros(k, 1, dtype=torch.int32), torch.zeros(k, dtype=torch.int32)),
                             rows.spec.zeros()) for k in slot_sizes(slots)]
    insert = SignatureRequest("insert_slot", _InsertSlot(rows.spec.names()).eval(),
                              (torch.zeros(1, dtype=torch.int32),),
                              {**rows.spec.zeros(), **{f"new_{n}": t for n, t in lm.spec.zeros().items()}})
    k = slots_prefill_rows(slots)
    many = _SlotsPrefill(KVCacheLM(lm.model, lm.spec.cache_len, lm.spec.dtype, batch=k), rows.spec.names()).eval()
    prefill = [SignatureRequest(f"slots_prefill_{n}", many, (torch.zeros(k, n, dtype=torch.int32),
                                                             torch.arange(n, dtype=torch.int32),
                                                             torch.arange(k, dtype=torch.int32)), rows.spec.zeros())
               for n in lengths]
    return [*reqs, insert, *prefill]


def slots_prefill_rows(slots: int) -> int:
    """The requests one ``slots_prefill_<L>`` call prefills: 8 (``slots`` when fewer). On a CPU a prefill call
    costs a fixed part (reading every weight) plus a part per token; 8 requests at once share the fixed part
    without making one call so long that the rows decoding meanwhile wait long."""
    return min(8, int(slots))


def slot_sizes(slots: int) -> list[int]:
    """The row counts a slotted export decodes: 4, 8, 16... below ``slots`` (``decode_slots_<k>``: the first k
    rows; on a CPU a step costs about k rows' matmuls) and ``slots`` itself (``decode_slots``)."""
    sizes, k = [], 4
    while k < slots:
        sizes.append(k)
        k *= 2
    return [*sizes, slots]


def prepare_lm(model, *, prefill_lengths=(32,), cache_len: int = 256, batch: int = 1, prefill_logits: bool = True,
               slots: int | None = None):
    """Capture ``model`` (a transformers causal LM) once per signature into one Program sharing its weights;
    ``batch`` rows per call (tokens [batch, T], caches [batch, ...]; 1 for the edge); ``prefill_logits=False``
    leaves the logits out of the prefill signatures (what the generation loops need; see ``_CachesOnly``);
    ``slots``: B, adds ``decode_slots`` and ``insert_slot`` for continuous batching (``batch`` must be 1).

    Returns ``(program, cache_spec)``.
    """
    lm = KVCacheLM(model, cache_len, batch=batch).eval()
    with torch.no_grad():
        try:
            return prepare_many(lm_requests(lm, prefill_lengths, prefill_logits=prefill_logits, slots=slots)), lm.spec
        except ExportFailedError as e:  # raised in the family's modeling code: named in its words
            raise capture_failure(e, model) from e
