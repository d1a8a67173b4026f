"""A causal LM whose attention needs what the KV-cache export does not implement is refused at conversion,
naming the feature: attention sinks (GPT-OSS) and logit softcapping (Gemma 2) used to convert silently (sinks)
or with an internal message, and a model in training mode would have exported its attention dropout away."""

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
    ("GptOssConfig", "GptOssForCausalLM", {"num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": 8,
                                           "layer_types": ["sliding_attention", "full_attention"]},
     r"GptOssAttention passes attention sinks \(s_aux, as in GPT-OSS\)"),
    ("Gemma2Config", "Gemma2ForCausalLM", {"sliding_window": 8, "attn_logit_softcapping": 50.0},
     r"Gemma2Attention passes attention logit softcapping \(softcap, as in Gemma 2\)"),
])
def test_an_attention_feature_we_do_not_export_is_refused_by_name(config_class, model_class, extra, feature):
    model = _model(config_class, model_class, **extra)
    with pytest.raises(UnsupportedModelError, match=feature + r", which the KV-cache export does not implement"):
        prepare_lm(model, prefill_lengths=(8,), cache_len=32)

