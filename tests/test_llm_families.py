"""Causal-LM families through convert_lm, one row each: a tiny random-init model of the family saved as a model
directory, converted once for android and tpu-v6e, then its prefill logits (prefill_16 of the prompt but its last
token, decode of the last) on the .tflite (LiteRT interpreter) and the TPU artifact (PJRT CPU: it carries a cpu
lowering beside the tpu one) against transformers' eager forward, and 32 greedy tokens from the .litertlm on the
LiteRT-LM engine and from the TPU artifact on our loop against transformers' generate(do_sample=False).

Every row sets a sliding window (or chunk) to 8 slots where the family has one, so that the 14-token prompt and the
32 new tokens run past it, GQA (4 query / 2 KV heads) where the family has it, and initializer_range 0.2 (not
0.02) so that attention scores reach a few units and what a family adds (windows, norms, scales, softcaps) moves
the logits: ``off`` names the config change that takes the feature out, and test_the_feature_changes_the_logits
checks it does. A family whose state is more than KV caches (``litertlm=False``: Qwen3-Next's linear attention,
GraniteMoeHybrid's Mamba-2 layers) has no .litertlm, so its .tflite generates on our loop instead of the engine.
docs/llm.md's "Families" table lists the same rows (test_the_docs_table_lists_every_family).
"""

from __future__ import annotations

import dataclasses
import pathlib
import re

import pytest
import torch

transformers = pytest.importorskip("transformers")

from tests.llm_models import VOCAB, save_lm_dir, tiny_tokenizer  # noqa: E402
from tpu_export.converter.numerics import rel_err  # noqa: E402

PREFILL = 16
CACHE = 64
NEW = 32
EOS = 2
# 14 tokens of tests.llm_models' tokenizer: past every 8-slot window, inside prefill_16
PROMPT = "hello world, the cache holds keys and values; the decoder reads"
DOCS = pathlib.Path(__file__).resolve().parents[1] / "docs" / "llm.md"

_BASE = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=256, pad_token_id=0, bos_token_id=1, eos_token_id=EOS,
             tie_word_embeddings=False, initializer_range=0.2)
_SLIDE = dict(sliding_window=8, layer_types=["sliding_attention", "full_attention"])
_MHA = dict(num_key_value_heads=None)  # families without GQA (a key/value head count they would not read)
_MOE = dict(num_local_experts=4, num_experts_per_tok=2)
# multi-head latent attention: the latent (32), the rope key (16), the no-rope key (16) and V (24) all differ
_MLA = dict(num_hidden_layers=3, num_key_value_heads=4, kv_lora_rank=32, q_lora_rank=48, qk_rope_head_dim=16,
            qk_nope_head_dim=16, v_head_dim=24, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
            first_k_dense_replace=1, moe_intermediate_size=32)
# DeepSeek-V3's YaRN (mscale 1, mscale_all_dim 1: the softmax scale grows too), scaled for 256 positions
_YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "beta_fast": 32.0,
         "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0, "rope_theta": 10000.0}


def _sinks(model):
    """GPT-OSS's sinks are initialised at the std of any weight, too small to take a share of the softmax."""
    for layer in model.model.layers:
        layer.self_attn.sinks.copy_(2.0 * torch.randn(layer.self_attn.sinks.shape))


@dataclasses.dataclass(frozen=True)
class Family:
    name: str  # as docs/llm.md's table names it
    model_type: str  # transformers' config model_type
    config: dict  # over _BASE
    exercises: str  # what this row checks that the others do not, for the docs table
    off: dict | None = None  # config changes that take the exercised feature out (same weights)
    tweak: object = None  # fn(model), under no_grad, before saving: weights the initialiser leaves inert
    seed: int = 0
    litertlm: bool = True  # False: state beside the KV caches, which the LiteRT-LM engine does not carry

    @property
    def id(self) -> str:
        return re.sub(r"[^a-z0-9]+", "_", self.name.lower()).strip("_")


FAMILIES = [
    Family("Llama", "llama", {}, "GQA, RoPE, SwiGLU, RMSNorm"),
    Family("Llama 3 RoPE scaling", "llama", {"rope_parameters": {
        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16}}, "llama3 RoPE frequency scaling",
        off={"rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}}),
    Family("Qwen2", "qwen2", {}, "QKV bias"),
    Family("Qwen3", "qwen3", {"head_dim": 32}, "per-head QK RMSNorm, head_dim apart from hidden / heads"),
    Family("Qwen3 sliding window", "qwen3", {"head_dim": 32, "use_sliding_window": True, "sliding_window": 8,
                                             "max_window_layers": 1}, "Qwen's max_window_layers: layers past it slide",
           off={"use_sliding_window": False}),
    Family("Phi-3", "phi3", {"sliding_window": 8}, "fused QKV and gate-up projections, every layer slides",
           off={"sliding_window": None}),
    Family("Gemma 3 text", "gemma3_text", {**_SLIDE, "head_dim": 16, "tie_word_embeddings": True,
                                        "initializer_range": 0.02},  # its embeddings are scaled up already
           "scaled tied embeddings, QK norm, sliding and global layers with their own RoPE bases",
           off={"sliding_window": 1024}),
    Family("Gemma 2", "gemma2", {**_SLIDE, "head_dim": 16, "attn_logit_softcapping": 2.0,
                                 "final_logit_softcapping": 3.0}, "attention and final logit softcapping",
           off={"attn_logit_softcapping": None, "final_logit_softcapping": None}),
    Family("Mixtral", "mixtral", {**_MOE, "sliding_window": 8}, "top-2 of 4 experts, every layer slides",
           off={"sliding_window": None}),
    Family("GPT-OSS", "gpt_oss", {**_SLIDE, **_MOE, "head_dim": 16, "rope_parameters": {
        "rope_type": "yarn", "factor": 16.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
        "rope_theta": 150000.0, "original_max_position_embeddings": 16}},
        "attention sinks, YaRN RoPE, biased top-k experts", tweak=_sinks),
    Family("Mistral", "mistral", {"sliding_window": 8, "head_dim": 16}, "every layer slides",
           off={"sliding_window": None}),
    Family("Granite", "granite", {"embedding_multiplier": 12.0, "attention_multiplier": 0.05,
                                  "residual_multiplier": 0.22, "logits_scaling": 8.0},
           "embedding, attention, residual and logit multipliers",
           off={"embedding_multiplier": 1.0, "attention_multiplier": 0.25, "residual_multiplier": 1.0,
                "logits_scaling": 1.0}),
    Family("OLMo 2", "olmo2", {}, "QK RMSNorm over all heads, norms after attention and MLP"),
    Family("SmolLM3", "smollm3", {"num_hidden_layers": 4, "no_rope_layer_interval": 2},
           "NoPE layers (every second layer without RoPE)",
           off={"no_rope_layers": [1, 1, 1, 1]}),
    Family("Qwen3-MoE", "qwen3_moe", {**_MOE, "moe_intermediate_size": 32, "norm_topk_prob": True},
           "top-2 of 4 experts with normalised weights, QK norm"),
    Family("Cohere2", "cohere2", {**_SLIDE, "logit_scale": 0.5, "tie_word_embeddings": True},
           "parallel attention + MLP, LayerNorm, interleaved RoPE on sliding layers only, logit scale",
           off={"sliding_window": 1024}),
    Family("StableLM", "stablelm", {"use_qkv_bias": True, "qk_layernorm": True,
                                    "rope_parameters": {"rope_theta": 10000.0, "partial_rotary_factor": 0.25}},
           "partial RoPE (a quarter of each head), LayerNorm, per-head QK LayerNorm, QKV bias",
           off={"rope_parameters": {"rope_theta": 10000.0, "partial_rotary_factor": 1.0}}),
    Family("GPT-NeoX", "gpt_neox", {**_MHA, "use_parallel_residual": True,
                                    "rope_parameters": {"rope_theta": 10000.0, "partial_rotary_factor": 0.25}},
           "fused QKV, partial RoPE, parallel residual",
           off={"use_parallel_residual": False}),
    Family("GPT-2", "gpt2", {**_MHA, "tie_word_embeddings": True},
           "learned absolute positions, Conv1D projections, tied embeddings"),
    Family("Phi", "phi", {"num_key_value_heads": 2, "qk_layernorm": True},
           "parallel attention + MLP, partial RoPE, biased dense layers, QK LayerNorm", seed=4,
           off={"rope_parameters": {"rope_theta": 10000.0, "partial_rotary_factor": 1.0}}),
    Family("GLM-4", "glm4", {"head_dim": 16}, "interleaved partial RoPE, norms after attention and MLP",
           off={"rope_parameters": {"rope_theta": 10000.0, "partial_rotary_factor": 1.0}}),
    Family("EXAONE 4", "exaone4", {**_SLIDE, "sliding_window_pattern": 2},
           "QK norm, norms after attention and MLP, sliding layers with RoPE and global layers without",
           off={"sliding_window": 1024}),
    Family("ERNIE 4.5", "ernie4_5", {"head_dim": 16, "use_bias": True}, "interleaved RoPE, biased projections", seed=1),
    Family("OLMo 3", "olmo3", {**_SLIDE}, "OLMo 2 with sliding and global layers", off={"sliding_window": 1024}),
    Family("Ministral", "ministral", {**_SLIDE, "head_dim": 16}, "sliding and global layers",
           off={"sliding_window": 1024}),
    Family("Helium", "helium", {"head_dim": 16}, "Llama's layout in Helium's own modeling code"),
    Family("Starcoder2", "starcoder2", {"sliding_window": 8}, "LayerNorm, biased GELU MLP, every layer slides",
           off={"sliding_window": None}),
    Family("Qwen2-MoE", "qwen2_moe", {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                                      "shared_expert_intermediate_size": 64},
           "top-2 of 4 experts plus a gated shared expert"),
    Family("OLMoE", "olmoe", {**_MOE}, "top-2 of 4 experts, QK RMSNorm over all heads"),
    Family("GraniteMoE", "granitemoe", {**_MOE, "embedding_multiplier": 12.0, "attention_multiplier": 0.05,
                                        "residual_multiplier": 0.22, "logits_scaling": 8.0},
           "top-2 of 4 experts with Granite's multipliers"),
    Family("Seed-OSS", "seed_oss", {"head_dim": 16, "attention_out_bias": True}, "QKV and output projection biases"),
    Family("Apertus", "apertus", {}, "xIELU activation, QK norm, llama3 RoPE scaling"),
    Family("Arcee", "arcee", {}, "ReLU² MLP without a gate"),
    Family("Nemotron", "nemotron", {"head_dim": 16}, "LayerNorm1P, ReLU² MLP, partial RoPE",
           off={"rope_parameters": {"rope_theta": 10000.0, "partial_rotary_factor": 1.0}}),
    Family("Cohere", "cohere", {"use_qk_norm": True, "logit_scale": 0.5, "tie_word_embeddings": True},
           "parallel attention + MLP, interleaved RoPE, per-head QK LayerNorm, logit scale"),
    Family("GLM", "glm", {"head_dim": 16}, "interleaved partial RoPE, QKV bias",
           off={"rope_parameters": {"rope_theta": 10000.0, "partial_rotary_factor": 1.0}}),
    Family("HunYuan dense", "hunyuan_v1_dense", {"head_dim": 16}, "QK norm after RoPE", seed=2),
    Family("Gemma", "gemma", {"head_dim": 16}, "GeGLU, embeddings scaled by sqrt(hidden), RMSNorm of 1 + w"),
    Family("GPT-J", "gptj", {**_MHA, "rotary_dim": 8}, "interleaved partial RoPE, parallel attention + MLP",
           off={"rotary_dim": 16}),
    Family("OPT", "opt", {**_MHA, "ffn_dim": 128, "word_embed_proj_dim": 64},
           "learned positions (offset 2), ReLU MLP, biased projections"),
    Family("Persimmon", "persimmon", {**_MHA, "qk_layernorm": True}, "ReLU² MLP, QK LayerNorm, partial RoPE"),
    Family("DiffLlama", "diffllama", {}, "differential attention (two softmaxes, their difference)"),
    Family("PhiMoE", "phimoe", {**_MOE, "sliding_window": 8}, "top-2 of 4 experts (sparsemixer), every layer slides",
           off={"sliding_window": None}, seed=1),
    Family("GPT-BigCode", "gpt_bigcode", {**_MHA, "multi_query": True}, "multi-query attention: one KV head cached"),
    Family("Falcon", "falcon", {"new_decoder_architecture": True, "num_kv_heads": 2, "ffn_hidden_size": 128,
                                "alibi": False},
           "each KV head broadcast to its query group before the cache, cached once; parallel attention + MLP"),
    Family("Falcon 7B", "falcon", {"new_decoder_architecture": False, "multi_query": True, "parallel_attn": True,
                                   "ffn_hidden_size": 128, "alibi": False, "tie_word_embeddings": True},
           "multi-query attention, one LayerNorm shared by attention and MLP"),
    Family("Llama 4 text", "llama4_text", {"attention_chunk_size": None, "num_hidden_layers": 4, "head_dim": 16,
                                           "intermediate_size": 64, "intermediate_size_mlp": 128, **_MOE,
                                           "num_experts_per_tok": 1, "interleave_moe_layer_step": 2,
                                           "floor_scale": 4, "attn_scale": 0.5},
           "NoPE layers with attention temperature tuning, QK L2 norm, MoE with a shared expert",
           off={"attn_temperature_tuning": False}),
    Family("Llama 4 chunked", "llama4_text", {"attention_chunk_size": 8, "num_hidden_layers": 4, "head_dim": 16,
                                              "intermediate_size": 64, "intermediate_size_mlp": 128, **_MOE,
                                              "num_experts_per_tok": 1, "interleave_moe_layer_step": 2,
                                              "floor_scale": 4, "attn_scale": 0.5},
           "chunked local attention (8-slot chunks) beside global NoPE layers",
           off={"layer_types": ["full_attention"] * 4}),
    Family("DeepSeek-V3", "deepseek_v3", {**_MLA, "n_group": 2, "topk_group": 1, "routed_scaling_factor": 2.5,
                                          "norm_topk_prob": True, "rope_parameters": _YARN},
           "MLA with the compressed latent cached, grouped top-k routing with a router bias, shared expert, YaRN",
           seed=2),
    Family("DeepSeek-V2", "deepseek_v2", {**_MLA, "topk_method": "group_limited_greedy", "n_group": 2,
                                          "topk_group": 1, "routed_scaling_factor": 2.0, "rope_parameters": _YARN},
           "MLA (complex RoPE), group-limited greedy routing"),
    Family("Moonlight", "deepseek_v3", {**_MLA, "q_lora_rank": None, "n_group": 1, "topk_group": 1,
                                        "routed_scaling_factor": 2.446, "norm_topk_prob": True,
                                        "rope_parameters": {"rope_type": "default", "rope_theta": 50000.0}},
           "MLA without a query low-rank projection (Kimi / Moonlight's DeepSeek-V3 layout)"),
    Family("Qwen3-Next", "qwen3_next", {"layer_types": ["linear_attention", "full_attention"], "head_dim": 16,
                                        "linear_num_key_heads": 2, "linear_num_value_heads": 4,
                                        "linear_key_head_dim": 16, "linear_value_head_dim": 16, "num_experts": 4,
                                        "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                                        "shared_expert_intermediate_size": 32},
           "gated delta rule layers (conv window and recurrent state passed as state, no .litertlm), gated "
           "attention, top-2 of 4 experts plus a shared expert", litertlm=False),
    Family("GraniteMoeHybrid", "granitemoehybrid", {
        "layer_types": ["linear_attention", "full_attention"], "mamba_n_heads": 8, "mamba_n_groups": 2,
        "mamba_d_state": 16, "mamba_d_head": 16, "mamba_chunk_size": 8, "position_embedding_type": "rope",
        **_MOE, "shared_intermediate_size": 64, "embedding_multiplier": 12.0, "attention_multiplier": 0.05,
        "residual_multiplier": 0.22, "logits_scaling": 8.0},
        "Mamba-2 layers (conv window and SSM state passed as state, no .litertlm) beside RoPE attention, top-2 of 4 "
        "experts plus a shared MLP, Granite's multipliers", litertlm=False),
    Family("Bamba", "bamba", {"attn_layer_indices": [1], "mamba_n_heads": 8, "mamba_n_groups": 2, "mamba_d_state": 16,
                              "mamba_d_head": 16, "mamba_chunk_size": 8},
           "Mamba-2 layers in Bamba's own modeling code (GraniteMoeHybrid's mixer), no .litertlm", litertlm=False),
]
BY_ID = {f.id: f for f in FAMILIES}
assert len(BY_ID) == len(FAMILIES), "two rows with the same id"


def family_config(f: Family, **changes):
    return transformers.AutoConfig.for_model(f.model_type, **{**_BASE, **f.config, **changes})


def family_model(f: Family, **changes):
    """The tiny model of row ``f`` from its seed (the same weights for any ``changes`` that keep the shapes)."""
    cfg = family_config(f, **changes)
    cfg._attn_implementation = "eager"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(f.seed)
        model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
        if f.tweak is not None:
            with torch.no_grad():
                f.tweak(model)
    return model


def prompt_ids() -> list[int]:
    ids = tiny_tokenizer()(PROMPT).input_ids
    assert len(ids) == 14
    return ids


@pytest.fixture(scope="module", params=[f.id for f in FAMILIES])
def converted(request, tmp_path_factory):
    """The family's model directory, transformers' eager logits and greedy tokens on the prompt, and convert_lm's
    output folder (android + tpu-v6e); built once per family."""
    from tpu_export.targets.lm import convert_lm

    f = BY_ID[request.param]
    root = tmp_path_factory.mktemp(f.id)
    model = family_model(f)
    d = save_lm_dir(model, root / "model")
    ref = transformers.AutoModelForCausalLM.from_pretrained(d, attn_implementation="eager").eval()
    ids = torch.tensor([prompt_ids()])
    with torch.no_grad():
        eager = ref(ids).logits[0, -1]
        want = ref.generate(ids, do_sample=False, max_new_tokens=NEW)[0, ids.shape[1]:].tolist()
    assert len(want) == NEW and EOS not in want, f"{f.name}: pick a seed whose greedy run has no early <eos>"
    convert_lm(d, ["android", "tpu-v6e"], root / "out", prefill_lengths=(PREFILL,), cache_len=CACHE)
    return {"family": f, "out": root / "out", "eager": eager, "want": want, "loops": {}}


_ARTIFACTS = {"tflite": "android/model.tflite", "tpu": "tpu-v6e/model.tpuexp"}


def _loop(converted, artifact):
    """Our loop on one artifact, opened once per family (PJRT compiles each signature on its first call)."""
    from tpu_export.generators import load_generator

    if artifact not in converted["loops"]:
        converted["loops"][artifact] = load_generator(converted["out"] / _ARTIFACTS[artifact])
    return converted["loops"][artifact]


@pytest.mark.slow
@pytest.mark.libtpu
@pytest.mark.parametrize("artifact", sorted(_ARTIFACTS))
def test_prefill_logits_match_eager(converted, artifact, record_property):
    """prefill_16 of the prompt but its last token, then decode of the last: logits that read every cache row the
    prefill wrote (what generate runs first). The rel err is recorded (pytest --junitxml) for docs/llm.md."""
    from tpu_export.targets.lm_runtime import prompt_step

    gen = _loop(converted, artifact)
    got = torch.as_tensor(prompt_step(gen.runtime, gen.spec, prompt_ids(), PREFILL)["logits"])[0, 0]
    err = rel_err(got, converted["eager"])
    record_property("rel_err", f"{err:.3g}")
    assert err <= 1e-4


@pytest.mark.slow
@pytest.mark.libtpu
def test_tpu_artifact_generates_like_transformers(converted):
    res = _loop(converted, "tpu").generate(PROMPT, NEW)
    assert res.tokens == converted["want"]


@pytest.mark.slow
@pytest.mark.libtpu
@pytest.mark.engine
def test_engine_generates_like_transformers(converted):
    from tpu_export.generators import EngineGenerator

    if not converted["family"].litertlm:
        pytest.skip("no .litertlm for a state beside the KV caches: test_tflite_generates_like_transformers")
    res = EngineGenerator(str(converted["out"] / "android" / "model.litertlm")).generate(PROMPT, NEW)
    assert res.new_tokens == NEW and res.text == tiny_tokenizer().decode(converted["want"])


@pytest.mark.slow
@pytest.mark.libtpu
def test_tflite_generates_like_transformers(converted):
    """A family without a .litertlm: its .tflite on our loop instead of the engine (the others: the engine's)."""
    if converted["family"].litertlm:
        pytest.skip("the .litertlm on the engine: test_engine_generates_like_transformers")
    assert not (converted["out"] / "android" / "model.litertlm").exists()
    assert _loop(converted, "tflite").generate(PROMPT, NEW).tokens == converted["want"]


@pytest.mark.parametrize("family", [f.id for f in FAMILIES if f.off is not None])
def test_the_feature_changes_the_logits(family):
    """The row's feature taken out (``off``) moves transformers' own logits: a match above says it is computed."""
    f = BY_ID[family]
    ids = torch.tensor([prompt_ids()])
    with torch.no_grad():
        on, off = family_model(f)(ids).logits, family_model(f, **f.off)(ids).logits
    assert rel_err(off, on) > 1e-2


def _docs_rows() -> list[tuple[str, str, str]]:
    text = DOCS.read_text(encoding="utf-8")
    section = text.split("\n### Families\n", 1)[1].split("\n#", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| Family")]
    return [tuple(c.strip().strip("`") for c in line.strip("|").split("|")) for line in rows]


def test_the_docs_table_lists_every_family():
    want = [(f.name, f.model_type, f.exercises) for f in FAMILIES]
    assert _docs_rows() == want
