"""Multi-head latent attention through the KV-cache export (converter/llm_mla.py): tiny random-init DeepSeek-V3
(grouped top-k MoE with the router's score correction bias, a shared expert, YaRN RoPE), DeepSeek-V2 (group-limited
greedy MoE, its complex RoPE) and a Moonlight-style DeepSeek-V3 config (Kimi's: no query LoRA, one expert group).
The cache holds the compressed latent and the rope key; checked: prefill logits against transformers' eager forward,
32 greedy tokens on the .tflite (our loop and the LiteRT-LM engine) and the TPU artifact (PJRT CPU) against
transformers' generate, the cache's contents against transformers' own cache, and convert_lm on a saved model
directory (its built-in check, then generation from what it wrote)."""

from __future__ import annotations

import copy
import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from tests.llm_exported_checks import CACHE, EOS, NEW, PROMPT, check_engine, check_greedy, check_prefill_logits  # noqa: E402
from tests.llm_models import VOCAB, greedy_reference, tiny_tokenizer  # noqa: E402
from tpu_export import litert_torch, tpu_backend  # noqa: E402
from tpu_export.converter.errors import UnsupportedModelError  # noqa: E402
from tpu_export.converter.llm import KVCacheLM, prepare_lm  # noqa: E402
from tpu_export.converter.llm_mla import kv_bytes_per_token  # noqa: E402
from tpu_export.converter.numerics import rel_err  # noqa: E402

# v_head_dim (24) differs from qk_nope_head_dim (16) and the latent (32) from both: a width mixed up fails.
# initializer_range 0.2 (not 0.02) gives attention scores and router scores of a few units.
_BASE = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=3,
             num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=32, q_lora_rank=48, qk_rope_head_dim=16,
             qk_nope_head_dim=16, v_head_dim=24, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
             first_k_dense_replace=1, max_position_embeddings=256, pad_token_id=0, bos_token_id=1, eos_token_id=EOS,
             initializer_range=0.2, attn_implementation="eager")
# DeepSeek-V3's YaRN (factor 40 over 4096 positions, mscale 1, mscale_all_dim 1: the softmax scale grows too),
# scaled for a 256-position model
_YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "beta_fast": 32.0,
         "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0, "rope_theta": 10000.0}
FAMILIES = {
    "deepseek_v3": ("DeepseekV3", {"n_group": 2, "topk_group": 1, "routed_scaling_factor": 2.5,
                                   "norm_topk_prob": True, "rope_parameters": _YARN}),
    "deepseek_v2": ("DeepseekV2", {"topk_method": "group_limited_greedy", "n_group": 2, "topk_group": 1,
                                   "routed_scaling_factor": 2.0, "rope_parameters": _YARN}),
    # Moonlight-16B-A3B's layout (a DeepseekV3ForCausalLM): no q_lora, one expert group, plain RoPE
    "moonlight": ("DeepseekV3", {"q_lora_rank": None, "n_group": 1, "topk_group": 1, "routed_scaling_factor": 2.446,
                                 "norm_topk_prob": True,
                                 "rope_parameters": {"rope_type": "default", "rope_theta": 50000.0}}),
}


# the first seed whose greedy continuation of PROMPT runs 32 tokens without eos in every family
SEED = 2


def _model(family, **overrides):
    prefix, extra = FAMILIES[family]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        cfg = getattr(transformers, f"{prefix}Config")(**{**_BASE, **extra, **overrides})
        model = getattr(transformers, f"{prefix}ForCausalLM")(cfg).eval()
        with torch.no_grad():  # zero at init; DeepSeek-V3's trained ones move the expert choice, so do these
            for m in model.modules():
                if hasattr(m, "e_score_correction_bias"):
                    m.e_score_correction_bias.copy_(0.5 * torch.randn(m.e_score_correction_bias.shape))
    return model


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
        reference_cache = model(ids, use_cache=True).cache
    assert len(want) == NEW and EOS not in want  # all 32 tokens compared
    prog, spec = prepare_lm(model, prefill_lengths=(8, 16), cache_len=CACHE)
    from tpu_export.edge import convert_program

    lite = convert_program(prog)
    rts = {"litert": litert_torch.Model(lite), "tpu": tpu_backend.export_program(prog, platforms=("cpu",))}
    return {"family": family, "model": model, "ids": ids, "want": want, "eager": eager, "prog": prog,
            "spec": spec, "lite": lite, "rts": rts, "reference_cache": reference_cache}


@pytest.mark.slow
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


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["litert", "tpu"])
def test_prefill_logits_match_eager(exported, backend):
    """A 14-token prompt padded into prefill_16: the logits of its rows."""
    check_prefill_logits(exported, backend)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["litert", "tpu"])
def test_greedy_tokens_match_transformers_generate(exported, backend):
    check_greedy(exported, backend)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["litert", "tpu"])
def test_the_cache_holds_the_latent_and_the_rope_key(exported, backend):
    """Per layer K is [1, 1, cache, kv_lora_rank] and V [1, 1, cache, qk_rope_head_dim]; after the prefill their
    first 14 slots are what transformers' own cache of the eager forward holds (the normalised latent, the rotated
    rope key) and the slots past the prompt's pad rows are still zero."""
    spec, cfg = exported["spec"], exported["model"].config
    assert spec.kv_heads == 1 and spec.head_dim == cfg.kv_lora_rank and spec.v_width == cfg.qk_rope_head_dim
    tokens = torch.zeros(1, 16, dtype=torch.int32)
    tokens[0, :14] = exported["ids"][0]
    out = exported["rts"][backend](tokens, torch.arange(16, dtype=torch.int32), signature_name="prefill_16",
                                   **spec.zeros())
    for i, layer in enumerate(exported["reference_cache"].layers):
        k, v = torch.as_tensor(out[f"kv_cache_k_{i}"]), torch.as_tensor(out[f"kv_cache_v_{i}"])
        assert tuple(k.shape) == (1, 1, CACHE, cfg.kv_lora_rank) and tuple(v.shape) == (1, 1, CACHE,
                                                                                        cfg.qk_rope_head_dim)
        want_rope = layer.values
        if exported["family"] == "deepseek_v2":  # V2 keeps its complex pairs interleaved; the export de-interleaves
            want_rope = torch.cat([want_rope[..., 0::2], want_rope[..., 1::2]], dim=-1)
        assert rel_err(k[:, :, :14], layer.keys) <= 1e-5
        assert rel_err(v[:, :, :14], want_rope) <= 1e-5
        assert not k[:, :, 16:].any() and not v[:, :, 16:].any()


@pytest.mark.slow
def test_bytes_per_token(exported):
    spec, cfg = exported["spec"], exported["model"].config
    assert spec.bytes_per_token == 3 * (32 + 16) * 4  # 3 layers x (latent 32 + rope key 16) float32
    assert spec.nbytes == CACHE * spec.bytes_per_token
    assert sum(t.numel() * t.element_size() for t in spec.zeros().values()) == spec.nbytes
    sizes = kv_bytes_per_token(cfg)
    assert sizes["mla"] == spec.bytes_per_token
    assert sizes["plain_kv"] == 3 * 4 * (16 + 16 + 24) * 4  # K [4 heads, 16 + 16] and V [4, 24], 3 layers


def test_bytes_per_token_at_deepseek_v3_dims():
    """DeepSeek-V3's published dims (DeepseekV3Config's defaults): 61 layers, kv_lora_rank 512, qk_rope_head_dim
    64, 128 heads of qk_nope_head_dim 128 and v_head_dim 128."""
    cfg = transformers.DeepseekV3Config()
    assert (cfg.num_hidden_layers, cfg.kv_lora_rank, cfg.qk_rope_head_dim, cfg.num_attention_heads,
            cfg.qk_nope_head_dim, cfg.v_head_dim) == (61, 512, 64, 128, 128, 128)
    bf16 = kv_bytes_per_token(cfg, torch.bfloat16)
    assert bf16["mla"] == 61 * (512 + 64) * 2 == 70_272
    assert bf16["plain_kv"] == 61 * 128 * (128 + 64 + 128) * 2 == 4_997_120
    assert bf16["ratio"] == 71.11
    assert kv_bytes_per_token(cfg)["mla"] == 140_544  # float32, as captured


@pytest.mark.slow
def test_the_experts_export_with_static_shapes(exported):
    """The experts run transformers' batched_mm dispatch, and every value of every captured graph has a static
    shape (no data-dependent expert grouping)."""
    assert exported["model"].config._experts_implementation == "batched_mm"
    for sig in exported["prog"].signatures.values():
        for node in sig.graph.nodes:
            val = node.meta.get("val")
            if isinstance(val, torch.Tensor):
                assert all(isinstance(d, int) for d in val.shape), (sig.name, node.name, val.shape)


@pytest.mark.engine
@pytest.mark.slow
def test_engine_generates_like_transformers(exported, tmp_path):
    """The LiteRT-LM engine allocates each cache from the .tflite's own tensor of that name: K and V of different
    widths run as any other cache."""
    check_engine(exported, tmp_path)


# each row moves transformers' own logits, so the matches above say DeepSeek's routing is computed, not ignored
_ROUTING_OFF = {"the router's score correction bias": "bias", "the expert group limit": {"topk_group": 2},
                "routed_scaling_factor": {"routed_scaling_factor": 1.0}, "norm_topk_prob": {"norm_topk_prob": False}}


@pytest.mark.parametrize("feature", sorted(_ROUTING_OFF))
def test_the_routing_features_change_the_logits(feature):
    ids = _ids()
    off = _ROUTING_OFF[feature]
    model = _model("deepseek_v3")
    if off == "bias":
        other = copy.deepcopy(model)
        for m in other.modules():
            if hasattr(m, "e_score_correction_bias"):
                m.e_score_correction_bias.zero_()
    else:
        other = _model("deepseek_v3", **off)
    with torch.no_grad():
        assert rel_err(other(ids).logits, model(ids).logits) > 1e-2


def test_rotate_half_rope_layout_matches_eager():
    """DeepSeek-V3 with rope_interleave=False (transformers' rotate_half form), prefill and one decode step."""
    model, ids = _model("deepseek_v3", rope_interleave=False), _ids()
    lm = KVCacheLM(model, CACHE).eval()
    with torch.no_grad():
        out = lm(ids.to(torch.int32), torch.arange(14, dtype=torch.int32), **lm.spec.zeros())
        nxt = torch.tensor([[5]])
        step = lm(nxt.to(torch.int32), torch.tensor([14], dtype=torch.int32),
                  **{k: v for k, v in out.items() if k != "logits"})
        assert rel_err(out["logits"], model(ids).logits) <= 1e-4
        assert rel_err(step["logits"], model(torch.cat([ids, nxt], 1)).logits[:, -1:]) <= 1e-4


def test_other_mla_families_are_refused_by_name():
    cfg = transformers.MiniCPM3Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=64, num_hidden_layers=1,
                                      num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=16, q_lora_rank=16,
                                      qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8)
    with pytest.raises(UnsupportedModelError, match="MiniCPM3Attention: multi-head latent attention"):
        KVCacheLM(transformers.MiniCPM3ForCausalLM(cfg).eval(), CACHE)


def test_an_unimplemented_attention_argument_is_refused_by_name():
    from tpu_export.converter.llm_mla import _mla_forward

    attn = _model("moonlight").model.layers[0].self_attn
    with pytest.raises(UnsupportedModelError, match=r"DeepseekV3Attention layer 0: the attention argument "
                                                    r"sliding_window=int"):
        _mla_forward(attn, torch.zeros(1, 2, 64), None, None, sliding_window=4)


@pytest.mark.slow
@pytest.mark.libtpu
def test_convert_lm_on_a_model_directory(tmp_path):
    """convert_lm on a saved DeepSeek-V3 directory: its built-in check of every artifact passes at float32's bound,
    summary.json states the cache's bytes per token against a plain K/V cache, and the written .tflite and TPU
    artifact generate transformers' tokens through lm.json (the generate command's loop)."""
    from tpu_export.generators import load_generator
    from tpu_export.targets.lm import convert_lm

    src = tmp_path / "deepseek_v3"
    model = _model("deepseek_v3")
    model.generation_config = transformers.GenerationConfig(bos_token_id=1, eos_token_id=EOS, pad_token_id=0)
    model.save_pretrained(src)
    tiny_tokenizer().save_pretrained(src)
    want = greedy_reference(src, PROMPT, NEW)["tokens"]
    out = tmp_path / "out"
    convert_lm(str(src), ["android", "tpu-v6e"], str(out), prefill_lengths=(8, 16), cache_len=CACHE)
    summary = json.loads((out / "summary.json").read_text())
    for target in ("android", "tpu-v6e"):
        check = summary["targets"][target]["verify"]
        assert check["scheme"] == "float32" and check["rel_err"] <= 1e-4
    assert summary["cache"] == {"num_layers": 3, "kv_heads": 1, "cache_len": CACHE, "head_dim": 32, "v_head_dim": 16,
                                "dtype": "float32", "bytes_per_token": 576, "plain_kv_bytes_per_token": 2688,
                                "plain_kv_over_mla": 4.67}
    for artifact in ("android/model.tflite", "tpu-v6e/model.tpuexp"):
        assert load_generator(out / artifact).generate(PROMPT, NEW).tokens == want
