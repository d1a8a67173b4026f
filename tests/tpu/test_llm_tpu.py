"""The LLM's TPU artifact (tpu_backend.llm): KV caches donated and updated in place on PJRT CPU with the same 32
greedy tokens as transformers; the flash-decoding and masked prefill Pallas kernels (interpret mode on CPU against
the XLA path, and AOT-compiled for v6e through libtpu); the per-step report (bytes per decode token against the
lower bound, prefill MFU, unknown figures kept unknown); bf16 and weight-only int8 artifacts against the float model."""

from __future__ import annotations

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

from tests.numerics import rel_err  # noqa: E402
from tpu_export import tpu_backend  # noqa: E402
from tpu_export.converter.llm import prepare_lm  # noqa: E402
from tpu_export.generate import greedy_generate  # noqa: E402
from tpu_export.tpu_backend.export import donated_inputs  # noqa: E402
from tpu_export.tpu_backend.llm import OnDeviceLM, export_lm, lm_report  # noqa: E402

pytestmark = [pytest.mark.libtpu, pytest.mark.slow]

CACHE = 64
NEW = 32


@pytest.fixture(scope="module")
def llama():
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    hf = transformers.LlamaForCausalLM(cfg).eval()
    prog, spec = prepare_lm(hf, prefill_lengths=(16,), cache_len=CACHE)  # one prefill: capture and exports cost
    return hf, prog, spec


def _prompt(n):
    return torch.randint(3, 128, (1, n), generator=torch.Generator().manual_seed(n))


def test_caches_are_donated_and_generation_matches_transformers(llama, tmp_path):
    hf, prog, spec = llama
    bundle, spec = export_lm(prog, spec, platforms=("tpu", "cpu"))
    for sig in bundle.signatures.values():
        # the StableHLO itself aliases every cache argument to the output of the same name
        outs = [s.name for s in sig.outputs]
        aliased = {sig.inputs[i].name: outs[o] for i, o in donated_inputs(sig.exported, len(sig.weight_names)).items()}
        assert aliased == {n: n for n in spec.names()}
        assert sig.exported.mlir_module().count("tf.aliasing_output") == len(spec.names())
    bundle.save(str(tmp_path / "llm.tpuexp"))
    rt = OnDeviceLM(tpu_backend.load(str(tmp_path / "llm.tpuexp")))
    ids = _prompt(11)
    with torch.no_grad():
        want = hf.generate(ids, do_sample=False, max_new_tokens=NEW)[0, 11:].tolist()
    assert greedy_generate(rt, spec, ids, NEW) == want

    # in place: a decode step consumes the cache buffers it is given and returns its caches in the same memory
    out = rt(torch.zeros(1, 16, dtype=torch.int32), torch.arange(16, dtype=torch.int32), signature_name="prefill_16",
             **spec.zeros())
    given = {n: out[n] for n in spec.names()}
    ptrs = {n: a.unsafe_buffer_pointer() for n, a in given.items()}
    step = rt(torch.tensor([[5]], dtype=torch.int32), torch.tensor([16], dtype=torch.int32), signature_name="decode",
              **given)
    assert all(a.is_deleted() for a in given.values())
    assert {n: step[n].unsafe_buffer_pointer() for n in spec.names()} == ptrs


def test_device_array_of_the_wrong_shape_is_refused(llama):
    import jax.numpy as jnp

    _, prog, spec = llama
    bundle, spec = export_lm(prog, spec, platforms=("cpu",), signatures=["decode"])
    caches = {n: jnp.zeros(spec.shape) for n in spec.names()}
    caches["kv_cache_v_1"] = jnp.zeros((1, 2, CACHE + 1, 16))
    with pytest.raises(ValueError, match=r"input 'kv_cache_v_1' is a device array \[1, 2, 65, 16\] float32; "
                                         r"signature 'decode' takes \[1, 2, 64, 16\] float32"):
        OnDeviceLM(bundle)(torch.tensor([[5]], dtype=torch.int32), torch.tensor([8], dtype=torch.int32),
                           signature_name="decode", **caches)


@pytest.mark.parametrize("b, hq, hkv, s, d, window, dtype", [
    (2, 8, 2, 384, 128, None, "float32"),   # GQA, batch 2 at different positions, 3 blocks of 128, head dim 128
    (1, 4, 4, 384, 64, 100, "float32"),     # head dim 64 (the transposed cache read), a sliding window: the
                                            # visible slots start past block 0
    (1, 8, 2, 256, 64, None, "bfloat16"),   # one block; the model-level test below takes a 64-slot cache
])
def test_decode_kernel_matches_xla_in_interpret_mode(b, hq, hkv, s, d, window, dtype):
    import jax.numpy as jnp

    from tpu_export.tpu_backend.pallas.config import PallasConfig
    from tpu_export.tpu_backend.pallas.decode_attention import decode_attention
    from tpu_export.tpu_backend.pallas.sdpa import xla_attention

    rng = np.random.default_rng(s)
    dt = jnp.dtype(dtype)
    q, k, v = (jnp.asarray(rng.standard_normal(shape), dt) for shape in
               [(b, hq, 1, d), (b, hkv, s, d), (b, hkv, s, d)])
    pos = np.array([s - 100, 3]) if b == 2 else np.array([s // 2 + 37])
    slots = np.arange(s)[None, :]
    visible = slots <= pos[:, None]
    if window:
        visible &= slots > pos[:, None] - window
    mask = jnp.asarray(np.where(visible, 0.0, np.finfo(np.float32).min)[:, None, None, :], dt)
    want = xla_attention(q, k, v, mask=mask)
    got = decode_attention(q, k, v, mask, config=PallasConfig(mode=True, interpret=True))
    err = rel_err(np.asarray(got, np.float32), np.asarray(want, np.float32))
    # float32: the same float32 online softmax; bfloat16: the kernel scales q in bf16 (one rounding), XLA the logits
    assert err <= (1e-5 if dtype == "float32" else 1e-2), err


@pytest.mark.parametrize("b, hq, hkv, t, s, d, start", [
    (1, 4, 2, 16, 64, 16, 0),      # the tests' tiny Llama: one block each way
    (2, 4, 2, 256, 384, 64, 50),   # batch 2, a prompt from slot 50: 3 kv blocks, the last one past the diagonal
])
def test_prefill_kernel_matches_xla_in_interpret_mode(b, hq, hkv, t, s, d, start):
    import jax.numpy as jnp

    from tpu_export.tpu_backend.pallas.config import PallasConfig
    from tpu_export.tpu_backend.pallas.prefill_attention import prefill_attention
    from tpu_export.tpu_backend.pallas.sdpa import xla_attention

    rng = np.random.default_rng(t)
    q, k, v = (jnp.asarray(rng.standard_normal(shape), jnp.float32) for shape in
               [(b, hq, t, d), (b, hkv, s, d), (b, hkv, s, d)])
    visible = np.arange(s)[None, :] <= start + np.arange(t)[:, None]
    mask = jnp.asarray(np.where(visible, 0.0, np.finfo(np.float32).min)[None, None], jnp.float32)
    got = prefill_attention(q, k, v, mask, config=PallasConfig(mode=True, interpret=True))
    assert rel_err(np.asarray(got), np.asarray(xla_attention(q, k, v, mask=mask))) <= 1e-5


def test_decode_signature_interpret_matches_xla(llama):
    """The whole decode step with the kernel taking the graph's repeated cache un-repeated (the prefill kernel's
    numbers are the kernel test's above: interpreting both signatures of the model doubles this test's time)."""
    from tpu_export.tpu_backend.pallas.config import PallasConfig

    _, prog, spec = llama
    kernel, _ = export_lm(prog, spec, platforms=("cpu",), signatures=["decode"],
                          use_pallas=PallasConfig(mode=True, interpret=True))
    xla, _ = export_lm(prog, spec, platforms=("cpu",), signatures=["decode"])
    gen = torch.Generator().manual_seed(1)
    caches = {n: torch.randn(spec.shape, generator=gen) for n in spec.names()}
    args = (torch.tensor([[5]], dtype=torch.int32), torch.tensor([40], dtype=torch.int32))
    a, b = kernel(*args, signature_name="decode", **caches), xla(*args, signature_name="decode", **caches)
    assert rel_err(a["logits"], b["logits"]) <= 1e-5


def test_decode_kernel_aot_compiles_for_v6e_and_the_report(llama, tmp_path):
    pytest.importorskip("libtpu", reason="AOT compilation for TPU needs libtpu (pip install 'libtpu==0.0.42.*')")
    _, prog, spec = llama
    bundle, spec = export_lm(prog, spec, dtype="bfloat16", platforms=("tpu", "cpu"), use_pallas=True)
    text = bundle.signatures["decode"].exported.mlir_module()
    assert text.count('"tpu_export_decode_attention') >= 2, "one decode kernel per layer in the TPU branch"
    prefill = bundle.signatures["prefill_16"].exported.mlir_module()
    assert prefill.count('"tpu_export_prefill_attention') >= 2 and "tpu_export_decode_attention" not in prefill
    compiled = bundle.compile_for("tpu-v6e")
    rep = compiled.report["llm"]
    dec = rep["decode"]
    lb = dec["lower_bound_bytes_per_step"]
    sizes = {w: bundle.weights[w].numel() * bundle.weights[w].element_size()
             for w in bundle.signatures["decode"].weight_names}  # the decode step's (bf16) weights
    emb = "model.model.embed_tokens.weight"
    assert bundle.lm_info["gathered_only"] == [emb]  # the table is read by rows; lm_head is its own weight
    assert lb["weights"] == sum(sizes.values()) - sizes[emb] and lb["embedding_rows"] == 64 * 2
    assert lb["kv_cache_read"] == 4 * 2 * CACHE * 16 * 2  # 4 caches of [1, 2, 64, 16], bf16
    for count in ("xla", "hbm_estimate"):
        d = dec[count]
        assert d["ratio_to_lower_bound"] == pytest.approx(d["bytes_per_token"] / dec["lower_bound_bytes_per_token"])
        assert d["ratio_to_lower_bound"] >= 1.0, count
        assert d["tokens_per_s_per_chip"] == pytest.approx(1638e9 / d["bytes_per_token"])
    # XLA's count includes every prefetch hop of a weight: never below the HBM traffic
    assert dec["xla"]["bytes_per_step"] >= dec["hbm_estimate"]["bytes_per_step"]
    pre = rep["prefill_16"]
    # model FLOPs of prefill_16: 2 x 16 tokens x the matmul weights (per layer q, o 64x64, k, v 32x64, gate, up,
    # down 128x64; lm_head 128x64), plus causal attention: 4 x 4 heads x 16 channels x 136 query-key pairs, per layer
    matmul = 2 * (2 * 64 * 64 + 2 * 32 * 64 + 3 * 128 * 64) + 128 * 64
    assert pre["model_flops"] == 2 * 16 * matmul + 2 * 4 * 4 * 16 * 136
    assert pre["tokens"] == 16 and pre["xla_flops"] > 0 and 0 < pre["mfu_at_roofline"] <= 1
    from tpu_export.tpu_backend.artifact.load import read_artifact

    bundle.save(str(tmp_path / "llm.tpuexp"))
    (saved,) = read_artifact(str(tmp_path / "llm.tpuexp")).reports().values()
    assert saved["llm"]["decode"]["xla"]["ratio_to_lower_bound"] == pytest.approx(dec["xla"]["ratio_to_lower_bound"])


def test_report_keeps_unknown_figures_unknown(llama):
    _, prog, spec = llama
    bundle, _ = export_lm(prog, spec, platforms=("cpu",))
    cost = {"flops": {"per_device": 1e6, "per_chip": 1e6}, "bytes_accessed": {"per_device": -1.0, "per_chip": -1.0},
            "optimal_seconds": {"value": -3.0}}
    report = {"chips_used": 1, "signatures": {"decode": {"cost": cost}, "prefill_16": {"cost": cost}}}
    from tpu_export.tpu_backend.chips import CHIPS

    rep = lm_report(bundle, report, CHIPS["tpu-v6e"])
    assert rep["decode"]["xla"]["bytes_per_token"] == {"value": None, "unknown": "XLA's cost analysis gave bytes "
                                                       "accessed = -1.0 (not known for this program)"}
    assert rep["decode"]["xla"]["ratio_to_lower_bound"]["value"] is None
    no_exe = "no TPU executable to count HBM traffic from"
    assert rep["decode"]["hbm_estimate"]["ratio_to_lower_bound"]["unknown"] == no_exe
    assert rep["prefill_16"]["mfu_at_xla_estimate"]["unknown"].endswith("optimal_seconds = -3.0 (not known for this "
                                                                       "program)")
    assert rep["prefill_16"]["mfu_at_roofline"]["value"] is None
    # the report's own form of an unknown figure (null with the reason) keeps its reason
    cost["bytes_accessed"] = {"per_device": None, "per_chip": None, "unknown": "XLA gave -2.0"}
    assert lm_report(bundle, report, CHIPS["tpu-v6e"])["decode"]["xla"]["bytes_per_token"]["unknown"] == "XLA gave -2.0"
    assert lm_report(bundle, {"signatures": {}}, None) is None


def _teacher_forced_agreement(rt, spec, ids, ref_tokens):
    """Top-1 agreement of ``rt`` with the float model's greedy tokens, fed the float model's own tokens (so one
    flipped near-tie does not derail every later position)."""
    n = ids.shape[1]
    tokens = torch.zeros(1, 16, dtype=torch.int32)
    tokens[0, :n] = ids[0]
    out = rt(tokens, torch.arange(16, dtype=torch.int32), signature_name="prefill_16", **spec.zeros())
    hits = [int(torch.as_tensor(out["logits"])[0, n - 1].argmax()) == ref_tokens[0]]
    for i, tok in enumerate(ref_tokens[:-1]):
        out = rt(torch.tensor([[tok]], dtype=torch.int32), torch.tensor([n + i], dtype=torch.int32),
                 signature_name="decode", **{k: out[k] for k in spec.names()})
        hits.append(int(torch.as_tensor(out["logits"])[0, 0].argmax()) == ref_tokens[i + 1])
    return sum(hits) / len(hits)


# Floors for a random-init tiny model, whose logits are nearly flat (gaps of a few 1e-3 between the top tokens):
# any rounding flips some near-ties, so a floor of 100% would test the seed, not the scheme. Teacher-forced
# agreement measured with this seed: 1.0 for each scheme; the floor leaves room for three near-ties in 32.
FLOOR = 0.9
SCHEMES = [("bfloat16", None), ("float32", "int8"), ("bfloat16", "int8")]


def test_quantized_greedy_agreement_with_the_float_model(llama):
    hf, prog, spec = llama
    ids = _prompt(11)
    with torch.no_grad():  # the float artifact generates like transformers (test above): its tokens are the reference
        ref = hf.generate(ids, do_sample=False, max_new_tokens=NEW)[0, 11:].tolist()
    for dtype, quant in SCHEMES:
        bundle, qspec = export_lm(prog, spec, dtype=dtype, quant=quant, platforms=("cpu",))
        if dtype == "bfloat16":
            sig = bundle.signatures["decode"]
            assert {s.dtype for s in sig.inputs if s.name.startswith("kv_cache_")} == {"bfloat16"}
            assert qspec.dtype == torch.bfloat16
            assert [s.dtype for s in sig.outputs if s.name == "logits"] == ["float32"]
        if quant:
            assert bundle.quant == "weight_only_int8" and "model.model.embed_tokens.weight" in bundle.quantized_weights
        rt = OnDeviceLM(bundle)
        free = greedy_generate(rt, qspec, ids, NEW)
        forced = _teacher_forced_agreement(rt, qspec, ids, ref)
        prefix = next((i for i, (a, b) in enumerate(zip(free, ref)) if a != b), NEW)
        print(f"{dtype} {quant}: teacher-forced top-1 agreement with the float model {forced:.3f}, free-running "
              f"identical prefix {prefix}/{NEW}")
        assert forced >= FLOOR, (dtype, quant, forced)
