"""LFM2's short convolutions beside its attention layers through the KV-cache export: each conv layer's window
of inputs is state passed in and returned like the KV caches (converter/llm_conv.py). A tiny random-init LFM2
(4 layers, conv and full attention alternating, L_cache 3): its state against transformers' own cache, the
prefill logits of a padded prompt against transformers' eager forward, 32 greedy tokens on the .tflite (our loop)
and the TPU artifact (PJRT CPU) against transformers' generate, and convert_lm on a saved directory."""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from tests.llm_models import VOCAB, greedy_reference, tiny_tokenizer  # noqa: E402
from tpu_export import litert_torch, tpu_backend  # noqa: E402
from tpu_export.converter.llm import KVCacheLM, prepare_lm  # noqa: E402
from tpu_export.converter.numerics import rel_err  # noqa: E402
from tpu_export.generate import greedy_generate  # noqa: E402

pytestmark = [pytest.mark.slow]

CACHE = 64
NEW = 32
EOS = 2
L_CACHE = 3
CONV_LAYERS = (0, 2)
# 14 tokens of tests.llm_models' tokenizer, inside prefill_16 with two pad rows
PROMPT = "hello world, the cache holds keys and values; the decoder reads"


def _model():
    # initializer_range 0.2 (not 0.02): the convolutions' outputs are large enough that their state changes the
    # logits (test_the_conv_state_changes_the_logits)
    cfg = transformers.Lfm2Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, pad_token_id=0, bos_token_id=1, eos_token_id=EOS,
        conv_L_cache=L_CACHE, initializer_range=0.2,
        layer_types=["conv" if i in CONV_LAYERS else "full_attention" for i in range(4)])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return transformers.Lfm2ForCausalLM(cfg).eval()


def _ids():
    ids = tiny_tokenizer()(PROMPT).input_ids
    assert len(ids) == 14
    return torch.tensor([ids])


def _padded(ids, L=16):
    """The prompt padded at the end as LiteRT-LM's engine pads it: token 0 at position 0."""
    n = ids.shape[1]
    tokens = torch.zeros(1, L, dtype=torch.int32)
    tokens[0, :n] = ids[0]
    return tokens, torch.tensor(list(range(n)) + [0] * (L - n), dtype=torch.int32)


@pytest.fixture(scope="module")
def exported():
    model = _model()
    ids = _ids()
    with torch.no_grad():
        want = model.generate(ids, do_sample=False, max_new_tokens=NEW)[0, ids.shape[1]:].tolist()
        eager = model(ids).logits
        hf_cache = model(ids, use_cache=True).cache
    assert len(want) == NEW and EOS not in want  # all 32 tokens compared
    prog, spec = prepare_lm(model, prefill_lengths=(8, 16), cache_len=CACHE)
    from tpu_export.edge import convert_program

    lite = convert_program(prog)
    rts = {"litert": litert_torch.Model(lite), "tpu": tpu_backend.export_program(prog, platforms=("cpu",))}
    return {"model": model, "ids": ids, "want": want, "eager": eager, "hf_cache": hf_cache, "prog": prog,
            "spec": spec, "lite": lite, "rts": rts}


def test_the_state_is_the_attention_caches_and_the_conv_windows(exported):
    spec = exported["spec"]
    assert spec.names() == ["kv_cache_k_1", "kv_cache_v_1", "kv_cache_k_3", "kv_cache_v_3",
                            "conv_state_0", "conv_state_2"]
    assert spec.shape_of("conv_state_0") == (1, 64, L_CACHE - 1)
    assert spec.nbytes == (2 * 2 * 2 * CACHE * 16 + 2 * 64 * (L_CACHE - 1)) * 4
    for sig in exported["prog"].signatures.values():
        assert {i.name for i in sig.inputs} == {"tokens", "input_pos", *spec.names()}


def test_converter_state_matches_transformers_cache(exported):
    """The wrapper's forward on the padded prompt: logits of the real rows against eager, each conv window
    against the last L_cache - 1 columns of transformers' conv_states and each K against its key cache (the
    window ends at the last real token, not after the pads)."""
    lm = KVCacheLM(exported["model"], CACHE).eval()
    tokens, pos = _padded(exported["ids"])
    with torch.no_grad():
        out = lm(tokens, pos, **lm.spec.zeros())
    assert rel_err(out["logits"][:, :14], exported["eager"]) <= 1e-4
    hf = exported["hf_cache"]
    for i in CONV_LAYERS:
        want = hf.layers[i].conv_states[0][..., 1:]
        assert rel_err(out[f"conv_state_{i}"], want) <= 1e-5
    for i in (1, 3):
        assert rel_err(out[f"kv_cache_k_{i}"][:, :, :14], hf.layers[i].keys) <= 1e-5


@pytest.mark.parametrize("backend", ["litert", "tpu"])
def test_prefill_logits_match_eager(exported, backend):
    """A 14-token prompt padded into prefill_16 (pads at position 0, as the engine passes them)."""
    tokens, pos = _padded(exported["ids"])
    out = exported["rts"][backend](tokens, pos, signature_name="prefill_16", **exported["spec"].zeros())
    assert rel_err(torch.as_tensor(out["logits"])[:, :14], exported["eager"]) <= 1e-4


@pytest.mark.parametrize("backend", ["litert", "tpu"])
def test_greedy_tokens_match_transformers_generate(exported, backend):
    got = greedy_generate(exported["rts"][backend], exported["spec"], exported["ids"], NEW, eos_token_id=EOS)
    assert got == exported["want"]


def test_the_conv_state_changes_the_logits(exported):
    """On the .tflite: decoding the prompt's last token after its prefill with the conv windows zeroed changes
    the logits, so the state the graph returns is read."""
    rt, spec, ids = exported["rts"]["litert"], exported["spec"], exported["ids"]
    tokens, pos = _padded(ids[:, :-1])
    out = rt(tokens, pos, signature_name="prefill_16", **spec.zeros())
    state = {k: torch.as_tensor(out[k]) for k in spec.names()}
    last, at = ids[:, -1:].to(torch.int32), torch.tensor([13], dtype=torch.int32)
    kept = torch.as_tensor(rt(last, at, signature_name="decode", **state)["logits"])
    zeroed = {k: torch.zeros_like(v) if k.startswith("conv_state_") else v for k, v in state.items()}
    lost = torch.as_tensor(rt(last, at, signature_name="decode", **zeroed)["logits"])
    assert rel_err(kept, exported["eager"][:, -1:]) <= 1e-4
    assert rel_err(lost, kept) > 1e-2


def test_write_litertlm_refuses_the_conv_state(exported, tmp_path):
    """The LiteRT-LM engine carries only KV caches between calls (docs/llm.md#lfm2): no bundle, one line."""
    from tpu_export.edge.litertlm import LitertLmError, write_litertlm

    tok = tmp_path / "tok"
    tiny_tokenizer().save_pretrained(tok)
    with pytest.raises(LitertLmError, match=r"^this model: no \.litertlm: the LiteRT-LM engine has no place for a "
                                            r"convolution state \(conv_state_0, .*the \.tflite with `tpu-export "
                                            r"generate` and the TPU artifact run it$"):
        write_litertlm(tmp_path / "lm.litertlm", exported["lite"], tokenizer_json=tok / "tokenizer.json",
                       stop_token_ids=[EOS], max_num_tokens=CACHE, cache_spec=exported["spec"])
    assert not (tmp_path / "lm.litertlm").exists()


@pytest.mark.libtpu
def test_convert_lm_on_a_model_directory(tmp_path):
    """convert_lm on a saved LFM2 directory: its built-in check of every artifact passes at float32's bound, the
    edge target holds model.tflite and says why it holds no model.litertlm, lm.json carries the conv windows,
    and the .tflite and the TPU artifact generate transformers' tokens through lm.json (the generate loop)."""
    from tpu_export.generators import load_generator
    from tpu_export.targets.lm import convert_lm

    src = tmp_path / "lfm2"
    model = _model()
    model.generation_config = transformers.GenerationConfig(bos_token_id=1, eos_token_id=EOS, pad_token_id=0)
    model.save_pretrained(src)
    tiny_tokenizer().save_pretrained(src)
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
    assert refusal.startswith("lfm2 (Lfm2ForCausalLM): no .litertlm: the LiteRT-LM engine has no place for a "
                              "convolution state") and any(refusal in m for m in said)
    assert sorted(p.name for p in (out / "android").iterdir()) == ["lm.json", "model.tflite", "tokenizer.json"]
    cache = json.loads((out / "android" / "lm.json").read_text())["cache"]
    assert cache["kv_layers"] == [1, 3]
    assert cache["states"] == {"conv_state_0": [64, L_CACHE - 1], "conv_state_2": [64, L_CACHE - 1]}
    for artifact in ("android/model.tflite", "tpu-v6e/model.tpuexp"):
        assert load_generator(out / artifact).generate(PROMPT, NEW).tokens == want


def test_another_familys_conv_layers_stay_refused():
    """LFM2-MoE's conv layers are its own class, unchecked against transformers here: refused by layer type."""
    from tpu_export.converter.errors import UnsupportedModelError

    cfg = transformers.Lfm2MoeConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
                                     moe_intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     num_key_value_heads=2, num_experts=4, num_experts_per_tok=2,
                                     num_dense_layers=1, layer_types=["conv", "full_attention"])
    model = transformers.Lfm2MoeForCausalLM(cfg).eval()
    with pytest.raises(UnsupportedModelError, match=r"^lfm2_moe: its 'conv' \(short "
                                                    r"convolutions, whose state is a window of inputs, not a KV "
                                                    r"cache\) layers have no export yet"):
        KVCacheLM(model, CACHE)


def test_convert_lm_streamed_writes_the_tflite_without_a_bundle(tmp_path, monkeypatch):
    """The large-model path (weights streamed to disk, targets/lm_stream.py) writes no .litertlm either, and its
    .tflite passes the built-in check."""
    from tpu_export.targets import lm_stream
    from tpu_export.targets.lm import convert_lm

    monkeypatch.setattr(lm_stream, "STREAM_LM_FROM", 0)
    out = tmp_path / "out"
    convert_lm(_model(), ["android"], str(out), tokenizer=tiny_tokenizer(), prefill_lengths=(16,), cache_len=CACHE)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["targets"]["android"]["verify"]["rel_err"] <= 1e-4
    assert "model.litertlm" in summary["targets"]["android"]["not_written"]
    assert not (out / "android" / "model.litertlm").exists() and (out / "android" / "model.tflite").exists()
