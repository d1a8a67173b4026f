"""A transformers Llama (random init, GQA, RoPE) exported with its KV cache as explicit state
(converter.llm) to one .tflite and one TPU artifact with prefill_<L> / decode signatures, and generated
from greedily (tpu_export.generate) on the LiteRT interpreter and on PJRT CPU: the same tokens as
transformers' own generate(do_sample=False); then Qwen2, Qwen3, Phi-3, Gemma 3 (sliding windows run past)
and Mixtral (top-2 experts) the same way."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from tests.numerics import rel_err  # noqa: E402
from tpu_export import litert_torch, tpu_backend  # noqa: E402
from tpu_export.converter.llm import KVCacheLM, lm_requests, prepare_lm  # noqa: E402
from tpu_export.generate import CacheFullError, GenerateArgumentError, greedy_generate  # noqa: E402

pytestmark = [pytest.mark.slow]

PREFILL = (8, 16)
CACHE = 64
NEW = 32


@pytest.fixture(scope="module")
def hf():
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    return transformers.LlamaForCausalLM(cfg).eval()


@pytest.fixture(scope="module")
def runtimes(hf, tmp_path_factory):
    """The edge path through litert_torch's public multi-signature Converter; the TPU path through one
    Program, saved as an artifact and loaded back."""
    lm = KVCacheLM(hf, CACHE).eval()
    conv = litert_torch.Converter()
    for r in lm_requests(lm, PREFILL):
        conv.signature(r.name, r.module, r.args, r.kwargs)
    with torch.no_grad():
        lite = conv.convert()
    prog, spec = prepare_lm(hf, prefill_lengths=PREFILL, cache_len=CACHE)
    path = tmp_path_factory.mktemp("llm") / "llama.tpuexp"
    tpu_backend.export_program(prog, platforms=("cpu",)).save(str(path))
    return {"litert": lite, "tpu": tpu_backend.load(str(path))}, spec


def _prompt(n):
    return torch.randint(3, 128, (1, n), generator=torch.Generator().manual_seed(n))


def test_signatures_share_weights(runtimes, hf):
    rts, _ = runtimes
    names = ["prefill_8", "prefill_16", "decode"]
    assert sorted(rts["litert"].signature_names()) == sorted(names)
    assert sorted(rts["tpu"].signature_names) == sorted(names)
    # three signatures, one copy of the weights in the flatbuffer
    weight_bytes = sum(p.numel() * 4 for p in hf.parameters())
    assert weight_bytes < len(rts["litert"].tflite_model()) < 1.3 * weight_bytes


@pytest.mark.parametrize("backend", ["litert", "tpu"])
@pytest.mark.parametrize("n", [8, 11])  # a full prefill_8, and a prompt padded into prefill_16
def test_prefill_logits_match_transformers(runtimes, hf, backend, n):
    rts, spec = runtimes
    ids = _prompt(n)
    L = 8 if n <= 8 else 16
    tokens = torch.zeros(1, L, dtype=torch.int32)
    tokens[0, :n] = ids[0]
    out = rts[backend](tokens, torch.arange(L, dtype=torch.int32), signature_name=f"prefill_{L}", **spec.zeros())
    with torch.no_grad():
        want = hf(ids).logits
    assert rel_err(torch.as_tensor(out["logits"])[:, :n], want) <= 1e-4
    assert tuple(out["kv_cache_k_1"].shape) == spec.shape == (1, 2, CACHE, 16)


@pytest.mark.parametrize("backend", ["litert", "tpu"])
@pytest.mark.parametrize("n", [8, 11])
def test_greedy_tokens_match_transformers_generate(runtimes, hf, backend, n):
    rts, spec = runtimes
    ids = _prompt(n)
    with torch.no_grad():
        want = hf.generate(ids, do_sample=False, max_new_tokens=NEW)[0, n:].tolist()
    assert len(want) == NEW  # no early stop at eos: the comparison covers all 32 tokens
    got = greedy_generate(rts[backend], spec, ids, NEW, eos_token_id=hf.generation_config.eos_token_id)
    assert got == want


@pytest.mark.parametrize("backend", ["litert", "tpu"])
@pytest.mark.parametrize("n", [18, 41])  # prefill_16 + a chunk of 1 in prefill_8; 16 + 16 + 8 in prefill_8
def test_a_prompt_longer_than_every_prefill_is_prefilled_in_chunks(runtimes, hf, backend, n):
    rts, spec = runtimes
    ids = _prompt(n)
    new = CACHE - n + 1  # to the last cache slot
    with torch.no_grad():
        want = hf.generate(ids, do_sample=False, max_new_tokens=new, min_new_tokens=new)[0, n:].tolist()
    assert greedy_generate(rts[backend], spec, ids, new) == want


def test_prefill_plan_keeps_every_chunk_in_the_cache():
    from tpu_export.targets.lm_runtime import prefill_plan

    assert prefill_plan(17, (8, 16), 64) == [(0, 16, 16), (16, 1, 8)]
    assert prefill_plan(40, (8, 16), 64) == [(0, 16, 16), (16, 16, 16), (32, 8, 8)]
    assert prefill_plan(60, (16,), 64) == [(0, 16, 16), (16, 16, 16), (32, 16, 16), (48, 12, 16)]
    # the last chunk's 16 rows would run past a 56-slot cache: refused before anything runs
    with pytest.raises(ValueError, match="the chunk from position 48 needs a prefill length of at most 8"):
        prefill_plan(50, (16,), 56)


def test_prompt_too_long_and_full_cache_are_clear_errors(runtimes):
    rts, spec = runtimes
    with pytest.raises(GenerateArgumentError, match=r"prompt: it is empty"):
        greedy_generate(rts["litert"], spec, [], 4)
    with pytest.raises(CacheFullError, match=r"the cache holds 64"):
        greedy_generate(rts["tpu"], spec, _prompt(16), CACHE - 14)
    assert len(greedy_generate(rts["tpu"], spec, _prompt(16), CACHE - 15)) == CACHE - 15  # exactly full


def test_bad_prefill_lengths_are_refused(hf):
    with pytest.raises(ValueError, match="prefill lengths"):
        lm_requests(KVCacheLM(hf, 8), (16,))


_TINY = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=256, bos_token_id=1, eos_token_id=2)
# what each config adds over Llama; windows of 8 tokens so that 11 prompt + 32 new tokens run far past them
ARCHS = {
    "llama3_rope": ("Llama", {"rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                                  "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                  "original_max_position_embeddings": 16}}),  # RoPE scaling
    "qwen2": ("Qwen2", {}),  # QKV bias
    "qwen3": ("Qwen3", {"head_dim": 16}),  # QK norm
    "phi3": ("Phi3", {"pad_token_id": 0, "sliding_window": 8}),  # fused qkv / gate_up, every layer slides
    "gemma3": ("Gemma3Text", {"head_dim": 16, "sliding_window": 8,  # scaled tied embeddings, mixed layers
                              "layer_types": ["sliding_attention", "full_attention"]}),
    "mixtral": ("Mixtral", {"num_local_experts": 4, "num_experts_per_tok": 2}),  # top-2 of 4 experts
}


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_other_architectures_generate_like_transformers(arch):
    prefix, extra = ARCHS[arch]
    torch.manual_seed(0)
    config = getattr(transformers, f"{prefix}Config")(**_TINY, **extra)
    model = getattr(transformers, "Gemma3ForCausalLM" if prefix == "Gemma3Text" else f"{prefix}ForCausalLM")(config)
    model.eval()
    prompts = {n: _prompt(n) for n in (11, 27)}  # one prefill; two chunks of prefill_16, the windows run past
    with torch.no_grad():  # before the export wrapper (which may switch a MoE's experts dispatch)
        want = {n: model.generate(ids, do_sample=False, max_new_tokens=NEW, min_new_tokens=NEW)[0, n:].tolist()
                for n, ids in prompts.items()}
    prog, spec = prepare_lm(model, prefill_lengths=(16,), cache_len=CACHE)
    from tpu_export.edge import convert_program

    for rt in (litert_torch.Model(convert_program(prog)), tpu_backend.export_program(prog, platforms=("cpu",))):
        for n, ids in prompts.items():
            assert greedy_generate(rt, spec, ids, NEW) == want[n], n



@pytest.fixture(scope="module")
def gemma3_window():
    """Gemma 3 with a window of 8 slots over a cache of 64: its decode and the same decode over the whole cache
    (converter.llm's window read switched off) on caches full of random values, so that a slot the window leaves
    out but the mask would show (or the reverse) changes the logits."""
    prefix, extra = ARCHS["gemma3"]
    torch.manual_seed(0)
    model = transformers.Gemma3ForCausalLM(transformers.Gemma3TextConfig(**_TINY, **extra)).eval()
    lm = KVCacheLM(model, CACHE).eval()
    caches = {n: torch.randn(lm.spec.shape) for n in lm.spec.names()}
    return model, lm, caches


def _decode(lm, caches, pos, window=True):
    token, input_pos = torch.tensor([[5]], dtype=torch.int32), torch.tensor([pos], dtype=torch.int32)
    saved = lm._window
    if not window:
        lm._window = lambda *a: None
    try:
        with torch.no_grad():
            return lm(token, input_pos, **caches)
    finally:
        lm._window = saved


@pytest.mark.parametrize("pos", [0, 5, 7, 8, 30, CACHE - 1])  # the window's start clamped at 0, moving, at the end
def test_sliding_layer_decode_reads_only_its_window(gemma3_window, pos):
    _, lm, caches = gemma3_window
    want = _decode(lm, caches, pos, window=False)
    got = _decode(lm, caches, pos)
    assert rel_err(got["logits"], want["logits"]) <= 1e-6
    for name in lm.spec.names():  # the same writes (a later layer's to float rounding of an earlier one's output)
        assert rel_err(got[name], want[name]) <= 1e-6


def test_sliding_window_read_on_both_backends(gemma3_window):
    """The decode signature gathers the 8-slot window of the sliding layer (K and V), not of the global one, and
    the .tflite and the TPU artifact give the whole-cache decode's logits at a start clamped low, moving and
    clamped high."""
    from tpu_export.edge import convert_program

    model, lm, caches = gemma3_window
    prog, spec = prepare_lm(model, prefill_lengths=(8,), cache_len=CACHE)
    ops = prog.signature("decode").op_histogram()
    assert ops.get("aten.index_select.default") == 2 and "aten.index_select.default" not in \
        prog.signature("prefill_8").op_histogram()
    rts = {"litert": litert_torch.Model(convert_program(prog)),
           "tpu": tpu_backend.export_program(prog, platforms=("cpu",))}
    for pos in (3, 30, CACHE - 1):
        want = _decode(lm, caches, pos, window=False)["logits"]
        for name, rt in rts.items():
            out = rt(torch.tensor([[5]], dtype=torch.int32), torch.tensor([pos], dtype=torch.int32),
                     signature_name="decode", **caches)
            assert rel_err(torch.as_tensor(out["logits"]), want) <= 1e-4, (name, pos)


def test_prefix_lengths_of_a_cache():
    from tpu_export.edge.attention_prefix import prefix_lengths

    assert prefix_lengths(64) == prefix_lengths(511) == []  # one attention over every slot
    assert prefix_lengths(512) == [256, 512]
    assert prefix_lengths(1000) == [334, 668, 1000]  # steps of at least 256 slots
    assert prefix_lengths(4096) == list(range(512, 4097, 512))
    assert prefix_lengths(8192) == list(range(1024, 8193, 1024))  # at most 8


def test_edge_decode_reads_only_the_filled_prefix_of_a_long_cache(hf):
    """A 1024-slot cache: the .tflite's decode picks at run time the shortest static prefix (256, 512, 768 or 1024
    slots) that holds the position (edge.attention_prefix: an IF chain over subgraphs shared by the layers), and gives
    the whole-cache decode's logits at each prefix's edges, with random values in every slot (a slot the prefix left
    out while the mask showed it would change them)."""
    from tpu_export.edge import convert_program
    from tpu_export.edge.inspect import op_histogram

    cache = 1024
    lm = KVCacheLM(hf, cache).eval()
    prog, spec = prepare_lm(hf, prefill_lengths=(8,), cache_len=cache)
    lite = convert_program(prog)
    from ai_edge_litert import schema_py_generated as schema

    model = schema.Model.GetRootAs(lite, 0)
    index = {model.SignatureDefs(i).SignatureKey().decode(): model.SignatureDefs(i).SubgraphIndex()
             for i in range(model.SignatureDefsLength())}
    assert model.SubgraphsLength() == 2 + 4 + 2  # two signatures, four prefixes, two choosers
    assert op_histogram(lite, subgraph=index["decode"]).get("IF") == 2  # one per layer
    assert "IF" not in op_histogram(lite, subgraph=index["prefill_8"])
    rt = litert_torch.Model(lite)
    caches = {n: torch.randn(spec.shape, generator=torch.Generator().manual_seed(1)) for n in spec.names()}
    token = torch.tensor([[7]], dtype=torch.int32)
    for pos in (0, 255, 256, 511, 512, 767, 768, cache - 1):
        input_pos = torch.tensor([pos], dtype=torch.int32)
        with torch.no_grad():
            want = lm(token, input_pos, **caches)
        got = rt(token, input_pos, signature_name="decode", **caches)
        assert rel_err(torch.as_tensor(got["logits"]), want["logits"]) <= 1e-5, pos
        assert rel_err(torch.as_tensor(got["kv_cache_v_1"]), want["kv_cache_v_1"]) <= 1e-6, pos

@pytest.mark.libtpu
def test_tpu_artifact_aot_compiles_every_signature_for_v6e(hf):
    pytest.importorskip("libtpu", reason="AOT compilation for TPU needs libtpu (pip install 'libtpu==0.0.42.*')")
    prog, _ = prepare_lm(hf, prefill_lengths=PREFILL, cache_len=CACHE)
    compiled = tpu_backend.export_program(prog, platforms=("tpu", "cpu")).compile_for("tpu-v6e")
    assert compiled.platform == "tpu"
    assert sorted(compiled.signatures) == ["decode", "prefill_16", "prefill_8"]


def test_batch_of_two_prefills_and_decodes_like_transformers(hf):
    """batch=2 (for TPU serving): two prompts at the same positions, each row's logits as transformers' own."""
    from tpu_export.edge import convert_program

    prog, spec = prepare_lm(hf, prefill_lengths=(8,), cache_len=16, batch=2)
    assert spec.shape == (2, 2, 16, 16)
    ids = torch.cat([_prompt(8), _prompt(9)[:, :8]])
    nxt = torch.tensor([[5], [7]])
    with torch.no_grad():
        want = hf(torch.cat([ids, nxt], 1)).logits
    for rt in (litert_torch.Model(convert_program(prog)), tpu_backend.export_program(prog, platforms=("cpu",))):
        out = rt(ids.to(torch.int32), torch.arange(8, dtype=torch.int32), signature_name="prefill_8", **spec.zeros())
        assert rel_err(torch.as_tensor(out["logits"]), want[:, :8]) <= 1e-4
        out = rt(nxt.to(torch.int32), torch.tensor([8], dtype=torch.int32), signature_name="decode",
                 **{k: out[k] for k in spec.names()})
        assert rel_err(torch.as_tensor(out["logits"]), want[:, 8:]) <= 1e-4


def test_each_signature_writes_its_cache_start_index_once(runtimes):
    """Every layer's k and v DYNAMIC_UPDATE_SLICE reads one start index (0, 0, pos[0], 0), a CONCATENATION written
    once per signature (was one per write: 2 per layer in each decode step)."""
    from ai_edge_litert import schema_py_generated as s

    flat = runtimes[0]["litert"].tflite_model()
    m = s.Model.GetRootAs(flat, 0)
    code = [max(m.OperatorCodes(i).BuiltinCode(), m.OperatorCodes(i).DeprecatedBuiltinCode())
            for i in range(m.OperatorCodesLength())]
    for k in range(m.SignatureDefsLength()):
        sg = m.Subgraphs(m.SignatureDefs(k).SubgraphIndex())
        ops = [sg.Operators(i) for i in range(sg.OperatorsLength())]
        writes = [op for op in ops if code[op.OpcodeIndex()] == s.BuiltinOperator.DYNAMIC_UPDATE_SLICE]
        starts = {op.Inputs(2) for op in writes}
        makers = [op for op in ops if op.OutputsLength() and op.Outputs(0) in starts]
        assert len(writes) == 4 and len(starts) == 1  # 2 layers x (k, v)
        assert [code[op.OpcodeIndex()] for op in makers] == [s.BuiltinOperator.CONCATENATION]


@pytest.mark.parametrize("start", [3, 0, 7])  # inside; at 0; past the end (clamped back to end at the last slot)
def test_cache_write_is_a_clamped_dynamic_update_slice_on_both_backends(start):
    """converter.llm_ops.cache_write: the block lands at pos[0] (the other positions are ignored: LiteRT-LM pads
    with 0), clamped like DYNAMIC_UPDATE_SLICE / lax.dynamic_update_slice, the same numbers as eager torch."""
    from tpu_export import converter
    from tpu_export.converter.llm_ops import cache_write
    from tpu_export.edge import convert_program
    from tpu_export.edge.inspect import op_histogram

    class W(torch.nn.Module):
        def forward(self, cache, update, pos):
            return cache_write(cache, update, pos, 2) * 1.0

    cache, update = torch.randn(1, 2, 10, 4), torch.randn(1, 2, 3, 4)
    pos = torch.tensor([start, 0, 0], dtype=torch.int32)
    want = W()(cache, update, pos)
    at = min(start, 7)
    assert torch.equal(want[:, :, at:at + 3], update) and torch.equal(want[:, :, :at], cache[:, :, :at])
    prog = converter.prepare(W().eval(), (cache, update, pos))
    flat = convert_program(prog)
    ops = op_histogram(flat)
    assert ops.get("DYNAMIC_UPDATE_SLICE") == 1 and "SCATTER_ND" not in ops
    for rt in (litert_torch.Model(flat), tpu_backend.export_program(prog, platforms=("cpu",))):
        out = rt(cache, update, pos)
        out = out if isinstance(out, torch.Tensor) else torch.as_tensor(next(iter(out.values())))
        assert torch.equal(torch.as_tensor(out), want)


def test_prefill_without_logits_generates_the_same_tokens(hf):
    """prefill_logits=False (what convert-lm exports): the prefill signatures return only the caches, the capture
    drops the vocabulary projection of every prefill row, and generation (prefill all prompt tokens but the last,
    decode the last) still equals transformers, a 1-token prompt (no prefill at all) included."""
    from tpu_export.edge import convert_program

    prog, spec = prepare_lm(hf, prefill_lengths=(8,), cache_len=CACHE, prefill_logits=False)
    assert [o.name for o in prog.signatures["prefill_8"].outputs] == spec.names()
    assert "logits" in [o.name for o in prog.signatures["decode"].outputs]
    rt = litert_torch.Model(convert_program(prog))
    for n in (1, 9):
        ids = _prompt(n)
        with torch.no_grad():
            want = hf.generate(ids, do_sample=False, max_new_tokens=NEW)[0, n:].tolist()
        assert greedy_generate(rt, spec, ids, NEW, eos_token_id=hf.generation_config.eos_token_id) == want
