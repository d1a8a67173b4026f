"""Falcon (both decoder architectures) and Llama 4 text (all layers global, and with chunked local attention)
through the KV-cache export (converter.llm), run by transformers' own modeling code: tiny random-init models,
their prefill logits against transformers' eager forward, and 32 greedy tokens on the .tflite (our loop and the
LiteRT-LM engine) and on the TPU artifact (PJRT CPU) against transformers' generate.

Falcon's new decoder architecture hands the cache each KV head once per query head of its group; the cache keeps
one copy (llm_families.cache_heads). Llama 4's chunked layers see the slots of their own 8-slot chunk, so the
14-token prompt and the 32 new tokens cross five chunks; its NoPE layers scale the query by position (attention
temperature tuning, here from floor_scale 4 so the scale moves within 46 positions), its RoPE layers L2-normalise
q and k, and every second layer is a top-1-of-4 MoE with a shared expert."""

from __future__ import annotations

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")

from tests.llm_exported_checks import CACHE, EOS, NEW, PROMPT, check_engine, check_greedy, check_prefill_logits  # noqa: E402
from tests.llm_models import SPECIAL, VOCAB, tiny_tokenizer  # noqa: E402
from tpu_export import litert_torch, tpu_backend  # noqa: E402
from tpu_export.converter.llm import KVCacheLM, prepare_lm  # noqa: E402
from tpu_export.converter.numerics import rel_err  # noqa: E402

pytestmark = [pytest.mark.slow]

CHUNK = 8
# initializer_range 0.2 (not 0.02): attention scores of a few units, so the chunking and the temperature change
# the logits (test_the_feature_changes_the_logits) and a match says they are computed
_TOKENS = dict(vocab_size=VOCAB, pad_token_id=0, bos_token_id=1, eos_token_id=EOS, initializer_range=0.2,
               max_position_embeddings=256, attn_implementation="eager")
_FALCON = dict(_TOKENS, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, ffn_hidden_size=128,
               alibi=False, tie_word_embeddings=False)
_LLAMA4 = dict(_TOKENS, hidden_size=64, intermediate_size=64, intermediate_size_mlp=128, num_hidden_layers=4,
               num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=4, num_experts_per_tok=1,
               interleave_moe_layer_step=2, floor_scale=4, attn_scale=0.5, tie_word_embeddings=False)
FAMILIES = {
    # Falcon-40B's layout: 2 KV heads for 4 query heads, parallel attention + MLP with their own LayerNorms
    "falcon_new": ("Falcon", {**_FALCON, "new_decoder_architecture": True, "num_kv_heads": 2}),
    # Falcon-7B's: multi-query (one KV head), parallel attention + MLP sharing one LayerNorm, tied embeddings
    "falcon_7b": ("Falcon", {**_FALCON, "new_decoder_architecture": False, "multi_query": True,
                             "parallel_attn": True, "tie_word_embeddings": True}),
    # every layer global (no_rope_layers: layer 3 is NoPE, with temperature tuning)
    "llama4_full": ("Llama4", {**_LLAMA4, "attention_chunk_size": None}),
    # the RoPE layers 0-2 chunked, the NoPE layer 3 global (Llama4TextConfig's own layer_types)
    "llama4_chunked": ("Llama4", {**_LLAMA4, "attention_chunk_size": CHUNK}),
}
CACHE_HEADS = {"falcon_new": 2, "falcon_7b": 1, "llama4_full": 2, "llama4_chunked": 2}
# config changes that take the family's feature out (same weights): the match against eager then says it is in
WITHOUT = {"llama4_full": {"attn_temperature_tuning": False},
           "llama4_chunked": {"layer_types": ["full_attention"] * 4}}


def _model(family, **changes):
    prefix, cfg = FAMILIES[family]
    config_class = "Llama4TextConfig" if prefix == "Llama4" else f"{prefix}Config"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return getattr(transformers, f"{prefix}ForCausalLM")(getattr(transformers, config_class)(
            **{**cfg, **changes})).eval()


def _ids():
    ids = tiny_tokenizer()(PROMPT).input_ids
    assert len(ids) == 14
    return torch.tensor([ids])


def _save(model, path):
    """A Hugging Face model directory of ``model`` with the tiny tokenizer (what convert_lm reads)."""
    ids = {k: i for k, (_, i) in SPECIAL.items()}
    model.generation_config = transformers.GenerationConfig(bos_token_id=ids["bos"], eos_token_id=ids["eos"],
                                                            pad_token_id=ids["pad"])
    model.save_pretrained(path, safe_serialization=True)
    tiny_tokenizer().save_pretrained(path)
    return path


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def exported(request):
    family = request.param
    model = _model(family)
    ids = _ids()
    with torch.no_grad():
        want = model.generate(ids, do_sample=False, max_new_tokens=NEW)[0, ids.shape[1]:].tolist()
        eager = model(ids).logits
    assert len(want) == NEW and EOS not in want  # all 32 tokens compared
    prog, spec = prepare_lm(model, prefill_lengths=(8, 16), cache_len=CACHE)
    from tpu_export.edge import convert_program

    lite = convert_program(prog)
    rts = {"litert": litert_torch.Model(lite), "tpu": tpu_backend.export_program(prog, platforms=("cpu",))}
    return {"family": family, "model": model, "ids": ids, "want": want, "eager": eager, "prog": prog,
            "spec": spec, "lite": lite, "rts": rts}


def test_the_cache_holds_the_kv_heads_once(exported):
    spec = exported["spec"]
    assert spec.shape == (1, CACHE_HEADS[exported["family"]], CACHE, 16)


def test_the_feature_changes_the_logits(exported):
    family = exported["family"]
    if family not in WITHOUT:
        pytest.skip("Falcon's rows exercise the cache heads (test_the_cache_holds_the_kv_heads_once)")
    with torch.no_grad():
        without = _model(family, **WITHOUT[family])(exported["ids"]).logits
    assert rel_err(without, exported["eager"]) > 1e-2


def test_converter_prefill_and_decode_logits_match_eager(exported):
    """The wrapper's own forward (what the capture traces), prefill then decode steps from its caches, the first
    in the prompt's chunk (position 14) and the next two starting a new one (16: only its own slot visible)."""
    model, ids = exported["model"], exported["ids"]
    lm = KVCacheLM(model, CACHE).eval()
    n = ids.shape[1]
    with torch.no_grad():
        out = lm(ids.to(torch.int32), torch.arange(n, dtype=torch.int32), **lm.spec.zeros())
        assert rel_err(out["logits"], exported["eager"]) <= 1e-4
        seq, caches = ids, {k: v for k, v in out.items() if k != "logits"}
        for tok in (5, 9, 17):
            nxt = torch.tensor([[tok]])
            step = lm(nxt.to(torch.int32), torch.tensor([seq.shape[1]], dtype=torch.int32), **caches)
            seq = torch.cat([seq, nxt], 1)
            assert rel_err(step["logits"], model(seq).logits[:, -1:]) <= 1e-4, seq.shape[1] - 1
            caches = {k: v for k, v in step.items() if k != "logits"}


@pytest.mark.parametrize("backend", ["litert", "tpu"])
def test_prefill_logits_match_eager(exported, backend):
    """A 14-token prompt padded into prefill_16."""
    check_prefill_logits(exported, backend)


@pytest.mark.parametrize("backend", ["litert", "tpu"])
def test_greedy_tokens_match_transformers_generate(exported, backend):
    check_greedy(exported, backend)


@pytest.mark.engine
def test_engine_generates_like_transformers(exported, tmp_path):
    check_engine(exported, tmp_path)


def test_convert_lm_checks_its_artifacts_against_transformers(exported, tmp_path):
    """convert_lm on a saved model directory: its own pre-publish check (targets/lm_verify.py) of the .tflite and
    the TPU artifact against transformers passes, and summary.json records it."""
    import json

    from tpu_export.targets.lm import convert_lm

    d = _save(copy.deepcopy(exported["model"]), tmp_path / "model")
    convert_lm(str(d), {"android": {}, "tpu-v6e": {"aot": False}}, tmp_path / "out", prefill_lengths=(16,),
               cache_len=CACHE)
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    for target in ("android", "tpu-v6e"):
        verify = summary["targets"][target]["verify"]
        assert isinstance(verify, dict) and "skipped" not in verify, (target, verify)
        assert verify["rel_err"] <= min(verify["bound"], 1e-4), (target, verify)


def test_alibi_falcon_is_refused_by_name():
    from tpu_export.converter.errors import UnsupportedModelError

    model = _model("falcon_7b", alibi=True)
    with pytest.raises(UnsupportedModelError, match=r"falcon with alibi=True \(ALiBi position bias, as in "
                                                    r"Falcon-RW\) has no KV-cache export"):
        prepare_lm(model, prefill_lengths=(8,), cache_len=CACHE)
