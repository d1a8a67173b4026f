"""GraniteMoeHybrid's Mamba-2 mixers beside its attention layers through the KV-cache export: each Mamba layer's
conv window and SSM state are state passed in and returned like the KV caches (converter/llm_mamba.py). A tiny
random-init GraniteMoeHybrid (4 layers, Mamba-2 and NoPE attention alternating as in Granite-4.0-H, top-2 of 4
experts beside the shared MLP, Granite's multipliers, 8-token scan chunks so that the 14-token prompt runs two):
its state against transformers' own cache, the prefill logits of the padded prompt against transformers' eager
forward, 32 greedy tokens on the .tflite (our loop) and the TPU artifact (PJRT CPU) against transformers'
generate, and convert_lm on a saved directory."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch

transformers = pytest.importorskip("transformers")

from tests.llm_exported_checks import EOS, NEW, PROMPT, check_greedy, check_prefill_logits  # noqa: E402
from tests.llm_models import VOCAB, greedy_reference, save_lm_dir, tiny_tokenizer  # noqa: E402
from tpu_export import litert_torch, tpu_backend  # noqa: E402
from tpu_export.converter.llm import KVCacheLM, prepare_lm  # noqa: E402
from tpu_export.converter.numerics import rel_err  # noqa: E402

pytestmark = [pytest.mark.slow]

CACHE = 64
LINEAR = (0, 2)
CHUNK = 8  # mamba_chunk_size: the 14-token prompt runs two chunks of the scan
CONV_DIM = 2 * 64 + 2 * 2 * 16  # x (mamba_expand 2 x hidden 64), B and C (2 groups of d_state 16)
SSM = (8, 16, 16)  # mamba_n_heads, mamba_d_head, mamba_d_state


def _model():
    # initializer_range 0.2 (not 0.02): the mixers' outputs are large enough that their state changes the logits
    # (test_the_recurrent_state_changes_the_logits)
    cfg = transformers.GraniteMoeHybridConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, pad_token_id=0, bos_token_id=1, eos_token_id=EOS,
        initializer_range=0.2, num_local_experts=4, num_experts_per_tok=2, shared_intermediate_size=64,
        mamba_n_heads=8, mamba_n_groups=2, mamba_d_state=16, mamba_d_head=16, mamba_d_conv=4, mamba_expand=2,
        mamba_chunk_size=CHUNK, embedding_multiplier=12.0, attention_multiplier=0.05, residual_multiplier=0.22,
        logits_scaling=8.0, layer_types=["linear_attention" if i in LINEAR else "full_attention" for i in range(4)])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = transformers.GraniteMoeHybridForCausalLM(cfg).eval()
        # dt_bias as Mamba-2 initialises it (softplus(dt_bias) = dt in [0.001, 0.1]; transformers sets 1, dt 1.3):
        # the SSM state then decays over tens of tokens, not a few, and the state passed between calls matters
        with torch.no_grad():
            for i in LINEAR:
                dt = torch.exp(torch.empty(SSM[0]).uniform_(math.log(1e-3), math.log(0.1)))
                model.model.layers[i].mamba.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))
        return model


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
    assert ids.shape[1] == 14
    with torch.no_grad():
        want = model.generate(ids, do_sample=False, max_new_tokens=NEW)[0, ids.shape[1]:].tolist()
    assert len(want) == NEW and EOS not in want  # all 32 tokens compared
    eager, hf_cache = _reference(model, ids)
    prog, spec = prepare_lm(model, prefill_lengths=(8, 16), cache_len=CACHE)
    from tpu_export.edge import convert_program

    lite = convert_program(prog)
    rts = {"litert": litert_torch.Model(lite), "tpu": tpu_backend.export_program(prog, platforms=("cpu",))}
    return {"model": model, "ids": ids, "want": want, "eager": eager, "hf_cache": hf_cache, "prog": prog,
            "spec": spec, "lite": lite, "rts": rts}


def test_the_state_is_the_attention_caches_and_each_mamba_layers_two_states(exported):
    spec = exported["spec"]
    assert spec.names() == ["kv_cache_k_1", "kv_cache_v_1", "kv_cache_k_3", "kv_cache_v_3", "conv_state_0",
                            "recurrent_state_0", "conv_state_2", "recurrent_state_2"]
    assert spec.shape_of("conv_state_0") == (1, CONV_DIM, 3)
    assert spec.shape_of("recurrent_state_2") == (1, *SSM)
    assert spec.bytes_per_token == 2 * 2 * 2 * 16 * 4  # the two attention layers only: the states do not grow
    assert spec.nbytes == (CACHE * spec.bytes_per_token + 2 * (CONV_DIM * 3 + 8 * 16 * 16) * 4)
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
    """Without the pad rows' dt set to 0 (the kind's scope), the same padded prefill ends at another SSM state
    than transformers': the masking is what keeps it."""
    from tpu_export.converter import llm_state

    key = ("granitemoehybrid", "linear_attention")
    monkeypatch.setitem(llm_state.KINDS, key, dataclasses.replace(llm_state.KINDS[key], scope=None))
    lm = KVCacheLM(exported["model"], CACHE).eval()
    tokens, pos = _padded(exported["ids"], 16)
    with torch.no_grad():
        out = lm(tokens, pos, **lm.spec.zeros())
    assert rel_err(out["recurrent_state_0"], exported["hf_cache"].layers[0].recurrent_states[0]) > 1e-2


def test_decode_returns_the_ssm_state_and_leaves_its_input(exported):
    """transformers' decode kernel (selective_state_update) writes the state it is handed: the wrapper hands it a
    copy, so decode's inputs stay as they were and the new state, an output, matches transformers' after the prompt
    and one more token."""
    lm, ids = KVCacheLM(exported["model"], CACHE).eval(), exported["ids"]
    tokens, pos = _padded(ids[:, :-1], 16)
    with torch.no_grad():
        state = {k: v for k, v in lm(tokens, pos, **lm.spec.zeros()).items() if k != "logits"}
        before = {k: v.clone() for k, v in state.items()}
        out = lm(ids[:, -1:].to(torch.int32), torch.tensor([13], dtype=torch.int32), **state)
    assert all(torch.equal(state[k], before[k]) for k in state)
    hf = exported["hf_cache"]
    for i in LINEAR:
        assert rel_err(out[f"recurrent_state_{i}"], hf.layers[i].recurrent_states[0]) <= 1e-5
        assert rel_err(out[f"recurrent_state_{i}"], state[f"recurrent_state_{i}"]) > 1e-2
    assert rel_err(out["logits"], exported["eager"][:, -1:]) <= 1e-4


@pytest.mark.parametrize("backend", ["litert", "tpu"])
def test_prefill_logits_match_eager(exported, backend):
    check_prefill_logits(exported, backend)


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
    """convert_lm on a saved GraniteMoeHybrid directory: its built-in check of every artifact passes at float32's bound,
    the edge target holds model.tflite and says why it holds no model.litertlm, lm.json carries both states of
    each Mamba layer, and the .tflite and the TPU artifact generate transformers' tokens through lm.json
    (the generate loop)."""
    from tpu_export.generators import load_generator
    from tpu_export.targets.lm import convert_lm

    src = save_lm_dir(_model(), tmp_path / "granite_hybrid")
    want = greedy_reference(src, PROMPT, NEW)["tokens"]
    out = tmp_path / "out"
    said = []
    convert_lm(str(src), ["android", "tpu-v6e"], str(out), prefill_lengths=(8, 16), cache_len=CACHE,
               progress=said.append)
    summary = json.loads((out / "summary.json").read_text())
    for target in ("android", "tpu-v6e"):
        check = summary["targets"][target]["verify"]
        assert check["scheme"] == "float32" and check["rel_err"] <= 1e-4
    refusal = summary["targets"]["android"]["not_written"]["model.litertlm"]
    assert refusal.startswith("granitemoehybrid (GraniteMoeHybridForCausalLM): no .litertlm: the LiteRT-LM engine "
                              "has no place for") and any(refusal in m for m in said)
    assert sorted(p.name for p in (out / "android").iterdir()) == ["lm.json", "model.tflite", "tokenizer.json"]
    cache = json.loads((out / "android" / "lm.json").read_text())["cache"]
    assert cache["kv_layers"] == [1, 3]
    assert cache["states"] == {"conv_state_0": [CONV_DIM, 3], "recurrent_state_0": list(SSM),
                               "conv_state_2": [CONV_DIM, 3], "recurrent_state_2": list(SSM)}
    for artifact in ("android/model.tflite", "tpu-v6e/model.tpuexp"):
        assert load_generator(out / artifact).generate(PROMPT, NEW).tokens == want
