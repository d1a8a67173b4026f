"""Every keyword transformers passes to the attention function of each family the KV-cache export supports is
either computed or refused by name, never dropped: the export's attention (converter.llm._gqa_sdpa_forward) is fed
each family's real calls, with every keyword they use today, recorded from the family's own modeling code running
under the export's cache (one decode step after a 13-token prefill), and its output is compared with the family's
own ``eager_attention_forward`` on the same call; a keyword none of them uses is refused naming it."""

from __future__ import annotations

import sys

import pytest
import torch

transformers = pytest.importorskip("transformers")

from tests.test_llm_families import FAMILIES, family_model, prompt_ids  # noqa: E402
from tpu_export.converter import llm  # noqa: E402
from tpu_export.converter.errors import UnsupportedModelError  # noqa: E402
from tpu_export.converter.numerics import rel_err  # noqa: E402

pytestmark = [pytest.mark.slow]  # builds every family's tiny model (~70 s on this 2-core host)

# the keywords the families pass today (a new one fails the test until it is looked at)
COMPUTED = {"dropout", "scaling", "is_causal", "s_aux", "softcap"}
KNOWN = COMPUTED | set(llm._ATTENTION_KWARGS_IN_THE_MASK_OR_CACHE)
# families whose attention is their own code, not transformers' attention interface (nothing to record here):
# the export replaces it (MLA: converter/llm_mla.py, which refuses what it does not implement by name) or checks
# their config by name (converter/llm_families.py)
OWN_ATTENTION = {"falcon", "deepseek_v3", "deepseek_v2"}


def _recorded_calls(family):
    calls, real = [], llm._gqa_sdpa_forward

    def record(module, query, key, value, attention_mask, **kwargs):
        calls.append((module, query, key, value, attention_mask, dict(kwargs)))
        return real(module, query, key, value, attention_mask, **kwargs)

    lm = llm.KVCacheLM(family_model(family), 32).eval()
    ids = prompt_ids()
    llm._gqa_sdpa_forward = record  # read from the module's globals on each call (_grouped_query_sdpa)
    try:
        with torch.no_grad():
            out = lm(torch.tensor([ids[:-1]], dtype=torch.int32), torch.arange(len(ids) - 1, dtype=torch.int32),
                     **lm.spec.zeros())
            calls.clear()
            lm(torch.tensor([ids[-1:]], dtype=torch.int32), torch.tensor([len(ids) - 1], dtype=torch.int32),
               **{n: out[n] for n in lm.spec.names()})
    finally:
        llm._gqa_sdpa_forward = real
    return calls


CHECKED = [f for f in FAMILIES if f.model_type not in OWN_ATTENTION]


@pytest.mark.parametrize("family", CHECKED, ids=[f.id for f in CHECKED])
def test_the_export_attention_computes_each_call_as_the_family_eager_forward(family):
    calls = _recorded_calls(family)
    assert calls, f"{family.name}: no attention call reached the export's attention function"
    for module, q, k, v, mask, kwargs in calls:
        assert set(kwargs) <= KNOWN, f"{family.name}: {type(module).__name__} passes {sorted(set(kwargs) - KNOWN)}"
        ours, _ = llm._gqa_sdpa_forward(module, q, k, v, mask, **kwargs)
        eager = sys.modules[type(module).__module__].eager_attention_forward
        want, _ = eager(module, q, k, v, mask, **kwargs)  # repeats the KV heads itself, as in the family's model
        assert rel_err(ours, want) <= 1e-5, (family.name, type(module).__name__, sorted(kwargs))


@pytest.mark.parametrize("name, value, feature", [
    ("position_bias", torch.zeros(1), r"an additive position bias \(position_bias\)"),
    ("alibi_slopes", torch.zeros(4), r"the attention argument alibi_slopes=Tensor"),
    ("s_aux", torch.zeros(4), r"attention sinks \(s_aux, as in GPT-OSS\)"),  # on a layer not checked for them
    ("softcap", 30.0, r"attention logit softcapping \(softcap, as in Gemma 2\)"),
])
def test_a_keyword_the_export_does_not_compute_is_refused_by_name(name, value, feature):
    llama = next(f for f in FAMILIES if f.id == "llama")
    module = family_model(llama).model.layers[0].self_attn
    q, kv = torch.randn(1, 4, 1, 16), torch.randn(1, 2, 8, 16)
    with pytest.raises(UnsupportedModelError, match=rf"^LlamaAttention passes {feature}, which the KV-cache export "
                                                    r"does not implement for this layer"):
        llm._gqa_sdpa_forward(module, q, kv, kv, None, **{name: value})
