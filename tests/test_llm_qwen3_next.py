"""Qwen3-Next's gated delta rule layers beside its attention layers through the KV-cache export: each linear
attention layer's conv window and recurrent state are state passed in and returned like the KV caches
(converter/llm_linear.py). A tiny random-init Qwen3-Next (4 layers, linear and gated full attention alternating,
top-2 of 4 experts with a shared expert): its state against transformers' own cache, the prefill logits of padded
prompts (one of 90 tokens, past the delta rule's 64-token chunk) against transformers' eager forward, 32 greedy
tokens on the .tflite (our loop) and the TPU artifact (PJRT CPU) against transformers' generate, and convert_lm on
a saved directory."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from tests.llm_exported_checks import EOS, NEW, PROMPT, check_greedy, check_prefill_logits  # noqa: E402
from tests.llm_models import TEXT, VOCAB, greedy_reference, save_lm_dir, tiny_tokenizer  # noqa: E402
from tpu_export import litert_torch, tpu_backend  # noqa: E402
from tpu_export.converter.llm import KVCacheLM, prepare_lm  # noqa: E402
from tpu_export.converter.numerics import rel_err  # noqa: E402

pytestmark = [pytest.mark.slow]

CACHE = 128
LINEAR = (0, 2)
LONG, LONG_PREFILL = 90, 96  # past the 64-token chunk of torch_chunk_gated_delta_rule
CONV_DIM = 2 * 2 * 16 + 4 * 16  # q and k (2 key heads of 16), v (4 value heads of 16)


def _model():
    # initializer_range 0.2 (not 0.02): the linear attention's outputs are large enough that its state changes the
    # logits (test_the_recurrent_state_changes_the_logits)
    cfg = transformers.Qwen3NextConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, linear_conv_kernel_dim=4, linear_key_head_dim=16,
        linear_value_head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4, num_experts=4,
        num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32,
        max_position_embeddings=256, pad_token_id=0, bos_token_id=1, eos_token_id=EOS, initializer_range=0.2,
        layer_types=["linear_attention" if i in LINEAR else "full_attention" for i in range(4)])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)  # a seed whose 32 greedy tokens hold no <eos>
        return transformers.Qwen3NextForCausalLM(cfg).eval()


def _padded(ids, L):
    """The prompt padded at the end as LiteRT-LM's engine pads it: token 0 at position 0."""
    n = ids.shape[1]
    tokens = torch.zeros(1, L, dtype=torch.int32)
    tokens[0, :n] = ids[0]
    return tokens, torch.tensor(list(range(n)) + [0] * (L - n), dtype=torch.int32)


def _reference(model, ids):
    with torch.no_grad():
        out = model(ids, use_cache=True)
    return out.logits, out.cache


@pytest.fixture(scope="module")
def exported():
    model = _model()
    ids = torch.tensor([tiny_tokenizer()(PROMPT).input_ids])
    long_ids = torch.tensor([tiny_tokenizer()(TEXT).input_ids[:LONG]])
    assert ids.shape[1] == 14 and long_ids.shape[1] == LONG
    with torch.no_grad():
        want = model.generate(ids, do_sample=False, max_new_tokens=NEW)[0, ids.shape[1]:].tolist()
    assert len(want) == NEW and EOS not in want  # all 32 tokens compared
    eager, hf_cache = _reference(model, ids)
    prog, spec = prepare_lm(model, prefill_lengths=(16, LONG_PREFILL), cache_len=CACHE)
    from tpu_export.edge import convert_program

    lite = convert_program(prog)
    rts = {"litert": litert_torch.Model(lite), "tpu": tpu_backend.export_program(prog, platforms=("cpu",))}
    return {"model": model, "ids": ids, "long_ids": long_ids, "want": want, "eager": eager, "hf_cache": hf_cache,
            "long": _reference(model, long_ids), "prog": prog, "spec": spec, "lite": lite, "rts": rts}


def test_the_state_is_the_attention_caches_and_each_linear_layers_two_states(exported):
    spec = exported["spec"]
    assert spec.names() == ["kv_cache_k_1", "kv_cache_v_1", "kv_cache_k_3", "kv_cache_v_3", "conv_state_0",
                            "recurrent_state_0", "conv_state_2", "recurrent_state_2"]
    assert spec.shape_of("conv_state_0") == (1, CONV_DIM, 3)
    assert spec.shape_of("recurrent_state_2") == (1, 4, 16, 16)
    assert spec.bytes_per_token == 2 * 2 * 2 * 16 * 4  # the two attention layers only: the states do not grow
    assert spec.nbytes == (CACHE * spec.bytes_per_token + 2 * (CONV_DIM * 3 + 4 * 16 * 16) * 4)
    for sig in exported["prog"].signatures.values():
        assert {i.name for i in sig.inputs} == {"tokens", "input_pos", *spec.names()}


def _check_state(out, hf, n, bound):
    """Each conv window against the last kernel - 1 columns of transformers' conv_states, each recurrent state
    against its recurrent_states, each K against its key cache, within ``bound``."""
    for i in LINEAR:
        layer = hf.layers[i]
        assert rel_err(torch.as_tensor(out[f"conv_state_{i}"]), layer.conv_states[0][..., 1:]) <= bound
        assert rel_err(torch.as_tensor(out[f"recurrent_state_{i}"]), layer.recurrent_states[0]) <= bound
    for i in (1, 3):
        assert rel_err(torch.as_tensor(out[f"kv_cache_k_{i}"])[:, :, :n], hf.layers[i].keys) <= bound


def test_converter_state_matches_transformers_cache(exported):
    """The wrapper's forward on the padded 14-token prompt: logits of the real rows against eager, the states
    against transformers' cache (the state after the last real token, not after the pads)."""
    lm = KVCacheLM(exported["model"], CACHE).eval()
    tokens, pos = _padded(exported["ids"], 16)
    with torch.no_grad():
        out = lm(tokens, pos, **lm.spec.zeros())
    assert rel_err(out["logits"][:, :14], exported["eager"]) <= 1e-4
    _check_state(out, exported["hf_cache"], 14, 1e-5)


def test_the_pads_would_move_the_recurrent_state_unmasked(exported, monkeypatch):
    """Without the pad rows' g and beta set to 0 (the kind's scope), the same padded prefill ends at another
    recurrent state than transformers': the masking is what keeps it."""
    from tpu_export.converter import llm_state

    key = ("qwen3_next", "linear_attention")
    monkeypatch.setitem(llm_state.KINDS, key, dataclasses.replace(llm_state.KINDS[key], scope=None))
    lm = KVCacheLM(exported["model"], CACHE).eval()
    tokens, pos = _padded(exported["ids"], 16)
    with torch.no_grad():
        out = lm(tokens, pos, **lm.spec.zeros())
    assert rel_err(out["recurrent_state_0"], exported["hf_cache"].layers[0].recurrent_states[0]) > 1e-2


@pytest.mark.parametrize("backend", ["litert", "tpu"])
def test_prefill_logits_match_eager(exported, backend):
    check_prefill_logits(exported, backend)


@pytest.mark.parametrize("backend", ["litert", "tpu"])
def test_a_prompt_past_the_chunk_matches_transformers(exported, backend):
    """90 tokens padded into prefill_96 (the chunked delta rule runs two 64-token chunks): the logits and every
    state within 1e-4 of eager and of transformers' cache after the prompt (a K of the .tflite measured 1.9e-5 off:
    the attention layer reads two chunks of delta rule outputs computed in another order)."""
    eager, hf = exported["long"]
    tokens, pos = _padded(exported["long_ids"], LONG_PREFILL)
    out = exported["rts"][backend](tokens, pos, signature_name=f"prefill_{LONG_PREFILL}", **exported["spec"].zeros())
    assert rel_err(torch.as_tensor(out["logits"])[:, :LONG], eager) <= 1e-4
    _check_state(out, hf, LONG, 1e-4)


@pytest.mark.parametrize("backend", ["litert", "tpu"])
def test_greedy_tokens_match_transformers_generate(exported, backend):
    check_greedy(exported, backend)


def test_the_recurrent_state_changes_the_logits(exported):
    """On the .tflite: decoding the prompt's last token after its prefill with the recurrent states zeroed changes
    the logits, so the state the graph returns is read."""
    rt, spec, ids = exported["rts"]["litert"], exported["spec"], exported["ids"]
    tokens, pos = _padded(ids[:, :-1], 16)
    out = rt(tokens, pos, signature_name="prefill_16", **spec.zeros())
    state = {k: torch.as_tensor(out[k]) for k in spec.names()}
    last, at = ids[:, -1:].to(torch.int32), torch.tensor([13], dtype=torch.int32)
    kept = torch.as_tensor(rt(last, at, signature_name="decode", **state)["logits"])
    zeroed = {k: torch.zeros_like(v) if k.startswith("recurrent_state_") else v for k, v in state.items()}
    lost = torch.as_tensor(rt(last, at, signature_name="decode", **zeroed)["logits"])
    assert rel_err(kept, exported["eager"][:, -1:]) <= 1e-4
    assert rel_err(lost, kept) > 1e-2


@pytest.mark.libtpu
def test_convert_lm_on_a_model_directory(tmp_path):
    """convert_lm on a saved Qwen3-Next directory: its built-in check of every artifact passes at float32's bound,
    the edge target holds model.tflite and says why it holds no model.litertlm, lm.json carries both states of
    each linear attention layer, and the .tflite and the TPU artifact generate transformers' tokens through lm.json
    (the generate loop)."""
    from tpu_export.generators import load_generator
    from tpu_export.targets.lm import convert_lm

    src = save_lm_dir(_model(), tmp_path / "qwen3_next")
    want = greedy_reference(src, PROMPT, NEW)["tokens"]
    out = tmp_path / "out"
    said = []
    convert_lm(str(src), ["android", "tpu-v6e"], str(out), prefill_lengths=(8, 16), cache_len=64,
               progress=said.append)
    summary = json.loads((out / "summary.json").read_text())
    for target in ("android", "tpu-v6e"):
        check = summary["targets"][target]["verify"]
        assert check["scheme"] == "float32" and check["rel_err"] <= 1e-4
    refusal = summary["targets"]["android"]["not_written"]["model.litertlm"]
    assert refusal.startswith("qwen3_next (Qwen3NextForCausalLM): no .litertlm: the LiteRT-LM engine has no place "
                              "for") and any(refusal in m for m in said)
    assert sorted(p.name for p in (out / "android").iterdir()) == ["lm.json", "model.tflite", "tokenizer.json"]
    cache = json.loads((out / "android" / "lm.json").read_text())["cache"]
    assert cache["kv_layers"] == [1, 3]
    assert cache["states"] == {"conv_state_0": [CONV_DIM, 3], "recurrent_state_0": [4, 16, 16],
                               "conv_state_2": [CONV_DIM, 3], "recurrent_state_2": [4, 16, 16]}
    for artifact in ("android/model.tflite", "tpu-v6e/model.tpuexp"):
        assert load_generator(out / artifact).generate(PROMPT, NEW).tokens == want
