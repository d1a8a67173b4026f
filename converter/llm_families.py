"""What converter.llm's KV-cache export needs to know of a family whose attention does not read its KV heads from
``config.num_key_value_heads``, and the config features it refuses by name.

Falcon hands its cache (``cache.update``) as many K/V heads as its attention has rows for, which is not its KV head
count:

- the new decoder architecture (Falcon-40B/180B: ``new_decoder_architecture=True``) broadcasts each of its
  ``num_kv_heads`` heads to the query heads of its group before the cache call, so the cache would hold
  ``num_attention_heads / num_kv_heads`` equal copies of every head (16 for Falcon-40B: 128 query heads, 8 KV
  heads). The explicit cache keeps one copy (the state every signature takes and returns) and hands attention the
  repeated heads, as transformers' ``repeat_kv`` does for a GQA eager forward;
- the original architecture (Falcon-7B) is multi-query (one KV head) or, with ``multi_query=False``, has a KV head
  per query head.
"""

from __future__ import annotations

from .errors import UnsupportedModelError

__all__ = ["cache_heads", "refuse_unexported_config"]


def cache_heads(cfg) -> tuple[int, int]:
    """``(kv_heads, repeats)``: the KV heads the explicit cache holds per layer, and how many equal copies of each
    the model's attention passes to ``cache.update`` (consecutive heads, as a broadcast over the group lays them)."""
    heads = cfg.num_attention_heads
    if getattr(cfg, "model_type", None) == "falcon":
        if cfg.new_decoder_architecture:
            return cfg.num_kv_heads, heads // cfg.num_kv_heads
        return (1 if cfg.multi_query else heads), 1
    if getattr(cfg, "model_type", None) == "gpt_bigcode":  # SantaCoder / StarCoder: multi-query, no KV head count
        return (1 if cfg.multi_query else heads), 1
    return getattr(cfg, "num_key_value_heads", None) or heads, 1


def refuse_unexported_config(cfg) -> None:
    """Raise UnsupportedModelError for a config feature the export does not compute."""
    if getattr(cfg, "model_type", None) == "gpt_neo" and "local" in (getattr(cfg, "attention_layers", None) or ()):
        # GPT-Neo's attention is its own (not transformers' attention interface) and its local layers slice a
        # causal-window buffer by the key count, which over a fixed-length cache counts from the cache's end
        raise UnsupportedModelError("gpt_neo with 'local' attention layers (a window its own attention cuts from "
                                    "the key count, not the positions) has no KV-cache export; GPT-Neo with only "
                                    "'global' layers exports")
    if getattr(cfg, "model_type", None) == "falcon" and getattr(cfg, "alibi", False):
        # its alibi bias is built from a 2-D padding mask over the cache (build_alibi_tensor); the export's mask
        # is the 4-D one from the positions
        raise UnsupportedModelError("falcon with alibi=True (ALiBi position bias, as in Falcon-RW) has no KV-cache "
                                    "export; Falcon with rotary positions (alibi=False: Falcon-7B/40B/180B, both "
                                    "decoder architectures) exports")
