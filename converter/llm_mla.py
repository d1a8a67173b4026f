"""Multi-head latent attention (MLA: DeepSeek-V2, DeepSeek-V3 and the configs built on it, e.g. Kimi's Moonlight
with no query LoRA) through converter.llm's cache protocol, with the compressed latent cached.

Per layer the cache holds what MLA compresses a token to, written at the step's slots like any K/V:

- ``kv_cache_k_<i>`` [B, 1, cache_len, kv_lora_rank]: the normalised KV latent (``kv_a_layernorm`` of the first
  ``kv_lora_rank`` channels of ``kv_a_proj_with_mqa``);
- ``kv_cache_v_<i>`` [B, 1, cache_len, qk_rope_head_dim]: the key's rotary part (``k_pe``), rotated at its
  position, shared by every head.

Attention runs over those with ``kv_b_proj`` absorbed (the DeepSeek-V2 paper's form): its key half folds into the
query (q_nope [H, nope] x W_uk [H, nope, rank] -> a query in latent space), its value half is applied after the
softmax (the weighted latents x W_uv [H, rank, v]), so no step up-projects the cache (transformers' own forward
runs ``kv_b_proj`` over every cached slot: for DeepSeek-V3's dims 512 x 128 x 256 MACs per slot and layer, 17 G
per layer for a 1024-slot decode step). The H query heads share the one latent "KV head" and are folded into rows,
as the grouped-query attention of converter.llm is. The scores are scaled and masked as transformers' eager forward
does (``module.scaling``, YaRN's mscale included), the softmax in float32.

The attention forward is ours only for the classes in ``MLA_ATTENTIONS`` (installed for the duration of a call by
``mla_attention``; the model's own submodules and transformers' own rotary helpers do the work). Any other
attention with MLA's projections is refused by name, as is an argument or config this forward does not implement.
DeepSeek-V2's rotary embedding is complex (``torch.polar``): for the call its rotary module runs DeepSeek-V3's
real form of the same frequencies (cos/sin of the same angles, same attention scaling), so the graph holds no
complex values, and the pairs are rotated by V3's interleaved helper, which computes V2's complex product per
channel pair and stores the results de-interleaved: q and k are laid out alike, so every q.k is the same (the
cached rope key is V2's de-interleaved).

The mixture of experts is transformers' own (grouped top-k over ``n_group`` / ``topk_group``, the router's
``e_score_correction_bias``, shared experts, ``routed_scaling_factor``, ``norm_topk_prob``), its experts on
``batched_mm`` as converter.llm switches them (static shapes).
"""

from __future__ import annotations

import types

import torch

from .errors import UnsupportedModelError

__all__ = ["MLA_ATTENTIONS", "kv_bytes_per_token", "mla_attention", "mla_cache_widths"]

# attention classes whose forward _mla_forward replaces (checked against transformers' eager forward and generate
# in tests/test_llm_mla.py)
MLA_ATTENTIONS = frozenset({"DeepseekV2Attention", "DeepseekV3Attention"})
_V2_ROTARY = "DeepseekV2RotaryEmbedding"
# what a decoder layer passes to its attention that this forward takes into account elsewhere: the rotary
# positions (position_ids, applied through position_embeddings), the cache (ours), and flags of no effect on it
_KWARGS_ACCOUNTED_FOR = frozenset({"position_ids", "use_cache", "cache_position", "output_attentions",
                                   "output_router_logits"})


def _has_mla_projections(module) -> bool:
    return hasattr(module, "kv_a_proj_with_mqa") and hasattr(module, "kv_b_proj")


def mla_cache_widths(model) -> tuple[int, int] | None:
    """(latent width, rope key width) of the caches when ``model``'s attention is MLA, else None. An attention
    with MLA's projections of a class not in MLA_ATTENTIONS is refused (UnsupportedModelError): its own forward
    would need a cache of its own layout."""
    found = [m for m in model.modules() if _has_mla_projections(m)]
    if not found:
        return None
    odd = sorted({type(m).__name__ for m in found} - MLA_ATTENTIONS)
    if odd:
        raise UnsupportedModelError(f"{', '.join(odd)}: multi-head latent attention of this family has no KV-cache "
                                    f"export; DeepSeek-V2 and DeepSeek-V3 (and configs of theirs) export, caching "
                                    f"the compressed latent")
    for m in found:
        if m.kv_b_proj.bias is not None:
            raise UnsupportedModelError(f"{type(m).__name__} layer {m.layer_idx}: kv_b_proj has a bias, which the "
                                        "absorbed MLA of the KV-cache export does not fold in; DeepSeek-V2/V3's "
                                        "kv_b_proj has none")
    cfg = model.config
    return int(cfg.kv_lora_rank), int(cfg.qk_rope_head_dim)


def kv_bytes_per_token(config, dtype=torch.float32) -> dict:
    """Cache bytes one token takes, all layers, for an MLA config: ``mla`` (the latent and the rope key, what this
    export caches) against ``plain_kv`` (K [heads, qk_nope + qk_rope] and V [heads, v_head_dim] per layer, what a
    cache of up-projected keys and values holds), and their ratio."""
    size = torch.empty((), dtype=dtype).element_size()
    layers, heads = int(config.num_hidden_layers), int(config.num_attention_heads)
    mla = layers * (int(config.kv_lora_rank) + int(config.qk_rope_head_dim)) * size
    plain = layers * heads * (int(config.qk_nope_head_dim) + int(config.qk_rope_head_dim)
                              + int(config.v_head_dim)) * size
    return {"mla": mla, "plain_kv": plain, "ratio": round(plain / mla, 2)}


def _refuse(module, what: str):
    raise UnsupportedModelError(f"{type(module).__name__} layer {module.layer_idx}: {what}, which the KV-cache "
                                "export's MLA attention does not implement; converting without it would generate "
                                "the wrong text")


def _rotate(module, q_rot, k_rot, position_embeddings):
    """transformers' own rotary helpers of the module's family, on (cos, sin) of the model's rotary module."""
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as v3

    if not isinstance(position_embeddings, tuple):
        _refuse(module, f"position embeddings of type {type(position_embeddings).__name__} (cos, sin expected)")
    cos, sin = position_embeddings
    # DeepSeek-V2 rotates interleaved channel pairs (its complex product); V3 does when rope_interleave is set
    if type(module).__name__ == "DeepseekV2Attention" or module.config.rope_interleave:
        return v3.apply_rotary_pos_emb_interleave(q_rot, k_rot, cos, sin)
    return v3.apply_rotary_pos_emb(q_rot, k_rot, cos, sin)


def _mla_forward(self, hidden_states, position_embeddings=None, attention_mask=None, cache=None, **kwargs):
    """MLA over the explicit latent cache (module docstring): the decoder layer's call contract of
    DeepseekV2/V3Attention, returning (output, None)."""
    for name, value in kwargs.items():
        if name not in _KWARGS_ACCOUNTED_FOR and value is not None and value is not False:
            _refuse(self, f"the attention argument {name}={type(value).__name__}")
    if self.training and self.attention_dropout:
        _refuse(self, "attention dropout in training mode")
    b, t = hidden_states.shape[:-1]
    heads, nope, rope = self.num_heads, self.qk_nope_head_dim, self.qk_rope_head_dim
    rank, vdim = self.kv_lora_rank, self.v_head_dim
    if self.q_lora_rank is None:
        q = self.q_proj(hidden_states)
    else:
        q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(hidden_states)))
    q = q.view(b, t, heads, nope + rope).transpose(1, 2)
    q_nope, q_rot = torch.split(q, [nope, rope], dim=-1)

    latent, k_rot = torch.split(self.kv_a_proj_with_mqa(hidden_states), [rank, rope], dim=-1)
    latent = self.kv_a_layernorm(latent).view(b, 1, t, rank)
    k_rot = k_rot.view(b, 1, t, rope)
    q_rot, k_rot = _rotate(self, q_rot, k_rot, position_embeddings)
    if cache is not None:  # the latent and the rope key written at this step's slots; the whole cache back
        latent, k_rot = cache.update(latent, k_rot, self.layer_idx)
    slots = latent.shape[2]

    w = self.kv_b_proj.weight.view(heads, nope + vdim, rank)
    w_k, w_v = w[:, :nope], w[:, nope:]  # [H, nope, rank], [H, v, rank]
    q_latent = torch.matmul(q_nope, w_k)  # [B, H, T, rank]: the query in the latent's space
    # the H heads of the one latent KV head folded into rows: one [H*T, S] matmul per cache tensor
    scores = (torch.matmul(q_latent.reshape(b, 1, heads * t, rank), latent.transpose(2, 3))
              + torch.matmul(q_rot.reshape(b, 1, heads * t, rope), k_rot.transpose(2, 3)))
    scores = scores.reshape(b, heads, t, slots) * self.scaling
    if attention_mask is not None:
        scores = scores + attention_mask
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    out = torch.matmul(probs.reshape(b, 1, heads * t, slots), latent).reshape(b, heads, t, rank)
    out = torch.matmul(out, w_v.transpose(1, 2))  # [B, H, T, v]
    return self.o_proj(out.transpose(1, 2).reshape(b, t, heads * vdim)), None


class mla_attention:  # noqa: N801 - used as a context manager, like torch.no_grad
    """For the duration of a call (the capture traces it), every attention of MLA_ATTENTIONS in ``model`` runs
    ``_mla_forward`` and DeepSeek-V2's rotary module DeepSeek-V3's real form (module docstring); the modules'
    own forwards are back afterwards. Nothing happens for a model without them."""

    def __init__(self, model):
        self.model, self.patched = model, []

    def __enter__(self):
        from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3RotaryEmbedding

        for m in self.model.modules():
            name = type(m).__name__
            if name in MLA_ATTENTIONS:
                self._patch(m, _mla_forward)
            elif name == _V2_ROTARY:
                self._patch(m, DeepseekV3RotaryEmbedding.forward)
        return self

    def _patch(self, module, forward):
        module.forward = types.MethodType(forward, module)
        self.patched.append(module)

    def __exit__(self, *exc):
        for m in self.patched:
            del m.forward  # the instance attribute: the class's own forward again
        self.patched = []
        return False
