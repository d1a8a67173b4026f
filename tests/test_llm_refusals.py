"""A causal LM whose attention needs what the KV-cache export does not implement is refused at conversion,
naming the feature. GPT-OSS's attention sinks and Gemma 2's logit softcapping export
(tests/test_llm_sinks_softcap.py); another family passing the same argument names to an eager forward of its own
(Granite SWA's sinks, VaultGemma's softcap) stays refused until its form is checked: the names alone do not say
the math."""

import pytest
import torch

transformers = pytest.importorskip("transformers")

from tpu_export.converter.errors import UnsupportedModelError  # noqa: E402
from tpu_export.converter.llm import prepare_lm  # noqa: E402

SMALL = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=8, max_position_embeddings=64)


def _model(config_class, model_class, **extra):
    torch.manual_seed(0)
    return getattr(transformers, model_class)(getattr(transformers, config_class)(**SMALL, **extra)).eval()


@pytest.mark.parametrize("config_class, model_class, extra, feature", [
    ("GraniteSWAConfig", "GraniteSWAForCausalLM", {"sliding_window": 8, "bos_token_id": 1, "eos_token_id": 2},
     r"GraniteSWAAttention passes attention sinks \(s_aux, as in GPT-OSS\)"),
    ("VaultGemmaConfig", "VaultGemmaForCausalLM", {"sliding_window": 8, "attn_logit_softcapping": 50.0},
     r"VaultGemmaAttention passes attention logit softcapping \(softcap, as in Gemma 2\)"),
])
def test_an_attention_feature_we_do_not_export_is_refused_by_name(config_class, model_class, extra, feature):
    model = _model(config_class, model_class, **extra)
    with pytest.raises(UnsupportedModelError, match=feature + r", which the KV-cache export does not implement "
                                                              r"for this layer"):
        prepare_lm(model, prefill_lengths=(8,), cache_len=32)


@pytest.mark.parametrize("config_class, model_class, extra", [
    ("GptOssConfig", "GptOssForCausalLM", {"num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": 8,
                                           "layer_types": ["sliding_attention", "full_attention"]}),
    ("Gemma2Config", "Gemma2ForCausalLM", {"sliding_window": 8, "attn_logit_softcapping": 50.0}),
])
def test_sinks_and_softcapping_of_the_checked_families_convert(config_class, model_class, extra):
    _, spec = prepare_lm(_model(config_class, model_class, **extra), prefill_lengths=(8,), cache_len=32)
    assert spec.shape == (1, 2, 32, 8)


def test_gpt_neo_local_layers_are_refused_by_name():
    # GPT-Neo's own attention (no attention interface to hook) cuts its local window from the key count, which over
    # a fixed-length cache counts from the cache's end: it would convert and generate the wrong text
    cfg = transformers.GPTNeoConfig(vocab_size=64, hidden_size=32, num_layers=2, num_heads=4, window_size=8,
                                    attention_types=[[["global", "local"], 1]], max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.GPTNeoForCausalLM(cfg).eval()
    with pytest.raises(UnsupportedModelError, match=r"^gpt_neo with 'local' attention layers .* GPT-Neo with only "
                                                    r"'global' layers exports$"):
        prepare_lm(model, prefill_lengths=(8,), cache_len=32)
    cfg.attention_layers = ["global", "global"]
    _, spec = prepare_lm(transformers.GPTNeoForCausalLM(cfg).eval(), prefill_lengths=(8,), cache_len=32)
    assert spec.kv_heads == 4


def test_a_cache_update_narrower_than_the_cache_is_refused_at_capture():
    # eager's copy would broadcast one KV head into all of them; the backends' update writes only its own extent
    from tpu_export.converter.llm_ops import cache_write

    with pytest.raises(ValueError, match=r"cache_write: an update of shape \(1, 1, 2, 8\) into a cache of "
                                         r"\(1, 4, 16, 8\) differs outside dim 2"):
        cache_write(torch.zeros(1, 4, 16, 8), torch.ones(1, 1, 2, 8), torch.tensor([0]), 2)
