"""GPT-OSS's attention sinks and Gemma 2's attention and final logit softcapping through the KV-cache export
(converter.llm, llm_ops.grouped_attention): tiny random-init models whose sliding windows (8 slots) are shorter
than the prompt, their prefill logits against transformers' eager forward, and 32 greedy tokens on the .tflite
(our loop and the LiteRT-LM engine) and on the TPU artifact (PJRT CPU) against transformers' generate."""

from __future__ import annotations

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")

from tests.llm_exported_checks import CACHE, EOS, NEW, PROMPT, check_engine, check_greedy, check_prefill_logits  # noqa: E402
from tests.llm_models import VOCAB, tiny_tokenizer  # noqa: E402
from tpu_export import litert_torch, tpu_backend  # noqa: E402
from tpu_export.converter.llm import KVCacheLM, prepare_lm  # noqa: E402
from tpu_export.converter.numerics import rel_err  # noqa: E402

pytestmark = [pytest.mark.slow]

# initializer_range 0.2 (not 0.02) gives attention scores of a few units, so that a softcap of 2 and the sinks
# change the logits (test_the_feature_changes_the_logits) and a match says they are computed, not ignored
_BASE = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, max_position_embeddings=256, pad_token_id=0, bos_token_id=1,
             eos_token_id=EOS, initializer_range=0.2, sliding_window=8, attn_implementation="eager",
             layer_types=["sliding_attention", "full_attention"] * 2)
FAMILIES = {
    # YaRN RoPE as GPT-OSS ships it, scaled for a 256-position model; top-2 of 4 experts
    "gpt_oss": ("GptOss", {"num_local_experts": 4, "num_experts_per_tok": 2,
                           "rope_parameters": {"rope_type": "yarn", "factor": 16.0, "beta_fast": 32.0,
                                               "beta_slow": 1.0, "truncate": False, "rope_theta": 150000.0,
                                               "original_max_position_embeddings": 16}}),
    "gemma2": ("Gemma2", {"attn_logit_softcapping": 2.0, "final_logit_softcapping": 3.0}),
}


def _model(family):
    prefix, extra = FAMILIES[family]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = getattr(transformers, f"{prefix}ForCausalLM")(getattr(transformers, f"{prefix}Config")(
            **{**_BASE, **extra})).eval()
        if family == "gpt_oss":  # initialised at std 0.02 they hardly take any weight; these do
            with torch.no_grad():
                for layer in model.model.layers:
                    layer.self_attn.sinks.copy_(2.0 * torch.randn(layer.self_attn.sinks.shape))
    return model


def _without_the_feature(model, family):
    """The same weights with the sinks / softcaps taken out (a sink of -1e4 takes no weight in the softmax)."""
    other = copy.deepcopy(model)
    with torch.no_grad():
        if family == "gpt_oss":
            for layer in other.model.layers:
                layer.self_attn.sinks.fill_(-1e4)
        else:
            other.config.final_logit_softcapping = None
            for layer in other.model.layers:
                layer.self_attn.attn_logit_softcapping = None
    return other


def _ids():
    ids = tiny_tokenizer()(PROMPT).input_ids
    assert len(ids) == 14
    return torch.tensor([ids])


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def exported(request):
    family = request.param
    model = _model(family)
    ids = _ids()
    with torch.no_grad():  # before the export wrapper, which switches the experts to batched_mm
        want = model.generate(ids, do_sample=False, max_new_tokens=NEW)[0, ids.shape[1]:].tolist()
        eager = model(ids).logits
    assert len(want) == NEW and EOS not in want  # all 32 tokens compared
    prog, spec = prepare_lm(model, prefill_lengths=(8, 16), cache_len=CACHE)
    from tpu_export.edge import convert_program

    lite = convert_program(prog)
    rts = {"litert": litert_torch.Model(lite), "tpu": tpu_backend.export_program(prog, platforms=("cpu",))}
    return {"family": family, "model": model, "ids": ids, "want": want, "eager": eager, "prog": prog,
            "spec": spec, "lite": lite, "rts": rts}


def test_the_feature_changes_the_logits(exported):
    with torch.no_grad():
        without = _without_the_feature(exported["model"], exported["family"])(exported["ids"]).logits
    assert rel_err(without, exported["eager"]) > 1e-2


def test_converter_prefill_and_decode_logits_match_eager(exported):
    """The wrapper's own forward (what the capture traces), prefill then one decode step from its caches."""
    model, ids = exported["model"], exported["ids"]
    lm = KVCacheLM(model, CACHE).eval()
    n = ids.shape[1]
    with torch.no_grad():
        out = lm(ids.to(torch.int32), torch.arange(n, dtype=torch.int32), **lm.spec.zeros())
        assert rel_err(out["logits"], exported["eager"]) <= 1e-4
        nxt = torch.tensor([[5]])
        want = model(torch.cat([ids, nxt], 1)).logits[:, -1:]
        step = lm(nxt.to(torch.int32), torch.tensor([n], dtype=torch.int32),
                  **{k: v for k, v in out.items() if k != "logits"})
    assert rel_err(step["logits"], want) <= 1e-4


@pytest.mark.parametrize("backend", ["litert", "tpu"])
def test_prefill_logits_match_eager(exported, backend):
    """A 14-token prompt padded into prefill_16: the logits of its rows (the final softcap included)."""
    check_prefill_logits(exported, backend)


@pytest.mark.parametrize("backend", ["litert", "tpu"])
def test_greedy_tokens_match_transformers_generate(exported, backend):
    check_greedy(exported, backend)


@pytest.mark.engine
def test_engine_generates_like_transformers(exported, tmp_path):
    check_engine(exported, tmp_path)
