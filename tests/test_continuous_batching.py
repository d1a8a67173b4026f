"""Continuous batching of an LM: a tiny seeded Llama directory converted for tpu-v6e with ``slots=4`` (no AOT
compile; PJRT CPU runs it). Requests of different prompt lengths (one prefilled in chunks) and samplers run through
``decode_slots``, joining free rows as others leave; each one's tokens equal its solo ``generate`` (same seed) and,
greedy, transformers' own generate. Each row of ``decode_slots`` is computed from its own inputs only, and its
logits match transformers' forward. Through ``tpu-export serve``, concurrent OpenAI clients get transformers'
greedy text."""

from __future__ import annotations

import concurrent.futures
import json

import numpy as np
import pytest

pytest.importorskip("transformers")

import tpu_export  # noqa: E402
from tests.llm_models import save_model_dir  # noqa: E402
from tpu_export.generate import Sampling, generate_ids  # noqa: E402
from tpu_export.generators import load_generator  # noqa: E402

pytestmark = [pytest.mark.slow]

SLOTS = 5  # decode_slots over 5 rows and decode_slots_4 over the first 4
NEW = 16
# 6 requests on 5 rows: the last one joins as one leaves. Prompt lengths 1 to 14 tokens; prefill_8 takes
# the 13- and 14-token prompts in two chunks.
PROMPTS = ["hello", "the quick brown fox jumps over the lazy dog and more", "a", "cache keys values",
           "0123456789 hello world tokens", "x y"]
SAMPLERS = [Sampling(), Sampling(temperature=0.8, seed=1), Sampling(temperature=1.0, top_k=20, seed=7), Sampling(),
            Sampling(temperature=0.7, top_p=0.9, seed=3), Sampling(temperature=1.2, seed=11)]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_model_dir("llama", tmp_path_factory.mktemp("hf") / "llama")


@pytest.fixture(scope="module")
def lm_folder(model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("lm") / "out"
    tpu_export.convert_lm(model_dir, {"tpu-v6e": {"aot": False, "slots": SLOTS}}, out, prefill_lengths=(8,),
                          cache_len=64)
    return out / "tpu-v6e"


@pytest.fixture(scope="module")
def gen(lm_folder):
    return load_generator(lm_folder)


def _stops(gen):
    return frozenset(int(i) for i in gen.meta.get("stop_token_ids") or ())


def _engine(gen):
    from tpu_export.serve._slots import SlotEngine

    return SlotEngine(gen.runtime, gen.spec, gen.meta["slots"])


def _hf_greedy(model_dir, prompt: str, new: int) -> list:
    """transformers' greedy continuation, up to and with its eos."""
    import torch
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir).eval()
    ids = tok(prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(ids, do_sample=False, max_new_tokens=new)[0, ids.shape[1]:].tolist()
    eos = model.generation_config.eos_token_id
    return out[:out.index(eos) + 1] if eos in out else out


def test_lm_json_names_the_slots_and_the_protocol(lm_folder):
    meta = json.loads((lm_folder / "lm.json").read_text())
    assert meta["cache_protocol"] == 2 and meta["slots"] == SLOTS
    summary = json.loads((lm_folder.parent / "summary.json").read_text())
    inputs = dict((n, s) for n, s, _ in summary["signatures"]["decode_slots"]["inputs"])
    assert inputs["tokens"] == [SLOTS, 1] and inputs["input_pos"] == [SLOTS]
    assert summary["signatures"]["decode_slots_4"]["inputs"][1][1] == [4]
    prefill = dict((n, s) for n, s, _ in summary["signatures"]["slots_prefill_8"]["inputs"])
    assert prefill["tokens"] == [SLOTS, 8] and prefill["input_pos"] == [8] and prefill["rows"] == [SLOTS]


def test_slotted_requests_match_solo_generate_and_transformers(gen, model_dir):
    from tpu_export.serve._slots import SlotSeq

    stops = _stops(gen)
    solo = [generate_ids(gen.runtime, gen.spec, gen.encode(p), NEW, sampling=s, eos_token_id=stops).tokens
            for p, s in zip(PROMPTS, SAMPLERS)]
    assert max(len(gen.encode(p)) for p in PROMPTS) > 8  # a chunked prefill is among them
    seqs = [SlotSeq(gen.encode(p), NEW, s.picker(), stops) for p, s in zip(PROMPTS, SAMPLERS)]
    engine = _engine(gen)
    engine.run(seqs)
    assert [s.tokens for s in seqs] == solo  # exactly, sampled ones too (the same seeds)
    assert engine.calls["decode_slots"] and engine.calls["decode_slots_4"]  # 5 rows busy, then 4 or fewer
    assert len(engine.free) == SLOTS and not engine.decoding
    for p, s, seq in zip(PROMPTS, SAMPLERS, seqs):
        if s.greedy:
            assert seq.tokens == _hf_greedy(model_dir, p, NEW)


def test_requests_arriving_together_are_prefilled_in_one_call(gen, model_dir):
    """Three prompts that fit prefill_8 arrive together: one slots_prefill_8 call writes each into its row (the
    two spare rows of the call repeat the first); the next decode step's logits of each row are transformers'
    forward over its prompt (within 1e-4), and each generation equals its solo generate, greedy and seeded."""
    import torch
    import transformers

    from tpu_export.serve._slots import SlotSeq

    prompts = ["hello world", "cache keys values", "x y z w"]
    samplers = [Sampling(), Sampling(temperature=0.8, seed=1), Sampling()]
    stops = _stops(gen)
    engine = _engine(gen)
    assert engine.many == {8: SLOTS}
    seqs = [SlotSeq(gen.encode(p), NEW, s.picker(), stops) for p, s in zip(prompts, samplers)]
    for seq in seqs:
        assert engine.add(seq)
    assert engine._prefill_many() == seqs and engine.calls["slots_prefill_8"] == 1 and not engine.prefilling
    tokens = torch.zeros(4, 1, dtype=torch.int32)
    pos = torch.zeros(4, dtype=torch.int32)
    for seq in seqs:
        tokens[seq.slot, 0], pos[seq.slot] = seq.feed, seq.pos
    out = engine.program.run_on_device(tokens, pos, signature_name="decode_slots_4", **engine.caches)
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir).eval()
    with torch.no_grad():
        for seq in seqs:
            ref = model(torch.tensor([seq.ids])).logits[0, -1].numpy()
            assert np.abs(np.asarray(out["logits"])[seq.slot, 0] - ref).max() < 1e-4

    engine = _engine(gen)
    seqs = [SlotSeq(gen.encode(p), NEW, s.picker(), stops) for p, s in zip(prompts, samplers)]
    engine.run(seqs)
    assert engine.calls["slots_prefill_8"] == 1 and all(seq.in_row for seq in seqs)
    for p, s, seq in zip(prompts, samplers, seqs):
        assert seq.tokens == generate_ids(gen.runtime, gen.spec, gen.encode(p), NEW, sampling=s,
                                          eos_token_id=stops).tokens
        if s.greedy:
            assert seq.tokens == _hf_greedy(model_dir, p, NEW)


def test_a_long_prompts_last_chunk_is_not_prefilled_with_new_ones(gen):
    """A prompt of two prefill_8 chunks has its first one done when three short prompts arrive: they share one
    slots_prefill_8 call, its last chunk goes on from its own caches; every generation equals its solo generate."""
    from tpu_export.serve._slots import SlotSeq

    stops = _stops(gen)
    engine = _engine(gen)
    prompts = [PROMPTS[0], PROMPTS[1], "cache keys values", "x y z w", "hello world"]
    seqs = [SlotSeq(gen.encode(p), NEW, s.picker(), stops) for p, s in zip(prompts, SAMPLERS)]
    assert engine.add(seqs[0])
    engine.step()
    assert engine.solo is seqs[0]
    assert engine.add(seqs[1])
    engine.step()  # the long prompt's first chunk
    assert len(seqs[1].plan) == 1 and seqs[1].plan[0][0] > 0
    for seq in seqs[2:]:
        assert engine.add(seq)
    engine.step()
    assert engine.calls["slots_prefill_8"] == 1 and [s.in_row for s in seqs] == [False, False, True, True, True]
    while engine.decoding or engine.prefilling or engine.solo is not None:
        engine.step()
    for p, s, seq in zip(prompts, SAMPLERS, seqs):
        assert seq.tokens == generate_ids(gen.runtime, gen.spec, gen.encode(p), NEW, sampling=s,
                                          eos_token_id=stops).tokens


def test_a_request_joins_mid_stream(gen):
    from tpu_export.serve._slots import SlotSeq

    stops = _stops(gen)
    engine = _engine(gen)
    first = SlotSeq(gen.encode(PROMPTS[1]), NEW, SAMPLERS[1].picker(), stops)
    late = SlotSeq(gen.encode(PROMPTS[4]), NEW, SAMPLERS[4].picker(), stops)
    assert engine.add(first)
    for _ in range(5):
        engine.step()
    assert len(first.tokens) == 5 and engine.solo is first  # alone: the batch-1 decode
    assert engine.add(late)  # prefilled (two chunks) while the first keeps decoding
    engine.step()
    assert engine.solo is first and len(first.tokens) == 6  # the late one's first chunk
    engine.step()
    assert engine.solo is None and set(engine.decoding.values()) == {first, late}  # both in decode_slots
    while engine.decoding or engine.prefilling:
        engine.step()
    for p, s, seq in ((PROMPTS[1], SAMPLERS[1], first), (PROMPTS[4], SAMPLERS[4], late)):
        assert seq.tokens == generate_ids(gen.runtime, gen.spec, gen.encode(p), NEW, sampling=s,
                                          eos_token_id=stops).tokens


def test_each_row_depends_on_its_own_inputs_only(gen, model_dir):
    """Row 1's logits are bit-identical whatever the other rows feed, and within 1e-4 of transformers' forward."""
    import torch
    import transformers

    engine = _engine(gen)
    ids = gen.encode(PROMPTS[3])
    rows = engine.rows
    rng = np.random.default_rng(0)

    def step(others_random: bool):
        caches = {}
        for n, shape in rows.shapes().items():
            c = rng.standard_normal(shape).astype(np.float32) if others_random else np.zeros(shape, np.float32)
            caches[n] = c
        # row 1 holds the prompt's prefix, written by the batch-1 prefill, then its last token decodes
        c1 = gen.spec.zeros()
        out = gen.runtime(torch.tensor([ids[:-1] + [0] * (8 - len(ids) + 1)], dtype=torch.int32),
                          torch.tensor(list(range(len(ids) - 1)) + [0] * (8 - len(ids) + 1), dtype=torch.int32),
                          signature_name="prefill_8", **c1)
        for n in rows.names():
            caches[n][1] = np.asarray(out[n])[0]
        tokens = rng.integers(0, 256, (SLOTS, 1)).astype(np.int32) if others_random else np.zeros((SLOTS, 1),
                                                                                                    np.int32)
        pos = rng.integers(0, 64, SLOTS).astype(np.int32) if others_random else np.zeros(SLOTS, np.int32)
        tokens[1, 0], pos[1] = ids[-1], len(ids) - 1
        res = engine.program.run_on_device(tokens, pos, signature_name="decode_slots", **caches)
        return np.asarray(res["logits"])[1, 0]

    a, b = step(False), step(True)
    assert np.array_equal(a, b)
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir).eval()
    with torch.no_grad():
        ref = model(torch.tensor([ids])).logits[0, -1].numpy()
    assert np.abs(a - ref).max() < 1e-4


def test_slots_are_refused_where_they_do_not_apply(model_dir, tmp_path):
    with pytest.raises(TypeError, match="android.*slots"):
        tpu_export.convert_lm(model_dir, {"android": {"slots": 4}}, tmp_path / "a", prefill_lengths=(8,),
                              cache_len=64)
    with pytest.raises(ValueError, match="different slots"):
        tpu_export.convert_lm(model_dir, {"tpu-v6e": {"slots": 4, "aot": False}, "cpu-xla": {"slots": 8}},
                              tmp_path / "b", prefill_lengths=(8,), cache_len=64)
    with pytest.raises(TypeError, match="slots must be an integer"):
        tpu_export.convert_lm(model_dir, {"tpu-v6e": {"slots": 0}}, tmp_path / "c", prefill_lengths=(8,),
                              cache_len=64)


def test_served_concurrently_with_continuous_batching(lm_folder, model_dir):
    openai = pytest.importorskip("openai")
    pytest.importorskip("uvicorn")
    from tests.test_serve import metric, serving
    from tpu_export import serve

    prompts = PROMPTS  # 6 concurrent clients on 5 rows
    refs = {p: _hf_greedy(model_dir, p, NEW) for p in prompts}
    with serving(serve.app([f"tiny={lm_folder}"])) as base:
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=120)

        def ask(p):
            return client.completions.create(model="tiny", prompt=p, max_tokens=NEW, temperature=0)

        with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
            answers = list(pool.map(ask, prompts))
        steps = metric(base, "tpu_export_serve_batch_requests_count", model="tiny")
        rows = metric(base, "tpu_export_serve_batch_requests_sum", model="tiny")
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    for p, r in zip(prompts, answers):
        want = [t for t in refs[p] if t != 2]
        assert r.choices[0].text == tok.decode(want, skip_special_tokens=False)
        assert r.usage.completion_tokens == len(refs[p])
        assert r.choices[0].finish_reason == ("stop" if 2 in refs[p] else "length")
    assert steps > 0 and rows / steps > 1  # decode steps ran several requests at once


def test_decode_slots_takes_the_pallas_decode_kernel_per_row():
    """The TPU decode kernel reads each row's visible cache range from its own mask row: decode_slots through the
    kernel (Pallas' interpreter, on CPU) matches the XLA attention, rows at different positions."""
    import torch

    from tests.llm_models import tiny_model
    from tpu_export.converter.llm import prepare_lm
    from tpu_export.tpu_backend.llm import export_lm
    from tpu_export.tpu_backend.pallas.config import PallasConfig

    prog, spec = prepare_lm(tiny_model("llama"), prefill_lengths=(8,), cache_len=64, prefill_logits=False, slots=2)
    kernel, _ = export_lm(prog, spec, platforms=("cpu",), signatures=["decode_slots"],
                          use_pallas=PallasConfig(mode=True, interpret=True))
    xla, _ = export_lm(prog, spec, platforms=("cpu",), signatures=["decode_slots"])
    gen = torch.Generator().manual_seed(1)
    caches = {n: torch.randn((2, *spec.shape_of(n)[1:]), generator=gen) for n in spec.names()}
    args = (torch.tensor([[5], [9]], dtype=torch.int32), torch.tensor([40, 3], dtype=torch.int32))
    a = kernel(*args, signature_name="decode_slots", **caches)["logits"]
    b = xla(*args, signature_name="decode_slots", **caches)["logits"]
    assert float((a - b).abs().max() / b.abs().max()) <= 1e-5
    tpu, _ = export_lm(prog, spec, dtype="bfloat16", platforms=("tpu", "cpu"), use_pallas=True,
                       signatures=["decode_slots"])
    assert tpu.signatures["decode_slots"].exported.mlir_module().count('"tpu_export_decode_attention') >= 2


@pytest.mark.parametrize("arch", ["qwen3", "phi3", "gemma3"])
def test_slot_rows_match_transformers_across_families(arch):
    """KVCacheLM's decode_slots graph (torch eager): four rows of different lengths, fed a token a step, each row's
    logits at every step against transformers' forward over that row's sequence (sliding windows of 8 slots: the
    longest row runs past them)."""
    import torch

    from tests.llm_models import tiny_model
    from tpu_export.converter.llm import KVCacheLM

    model = tiny_model(arch)
    rows = KVCacheLM(model, 64, batch=4, slots=True).eval()
    gen = torch.Generator().manual_seed(0)
    seqs = [torch.randint(4, 256, (n,), generator=gen).tolist() for n in (13, 3, 1, 7)]
    caches = rows.spec.zeros()
    worst = 0.0
    with torch.no_grad():
        for step in range(max(map(len, seqs))):
            live = [b for b, s in enumerate(seqs) if step < len(s)]
            tokens = torch.tensor([[s[step] if step < len(s) else 0] for s in seqs], dtype=torch.int32)
            pos = torch.tensor([step if step < len(s) else 0 for s in seqs], dtype=torch.int32)
            out = rows(tokens, pos, **caches)
            caches = {n: out[n] for n in rows.spec.names()}
            for b in live:
                ref = model(torch.tensor([seqs[b][:step + 1]])).logits[0, -1]
                worst = max(worst, float((out["logits"][b, 0] - ref).abs().max()))
    assert worst < 1e-4, worst


def test_a_hung_up_request_leaves_its_row_and_the_others_go_on(lm_folder, gen):
    """The scheduler between decode steps: a request whose client hung up (its cancel flag) leaves at the next
    step; the one beside it runs to its end with its solo tokens; a request past its deadline never takes a row."""
    import asyncio
    import time

    from tpu_export.serve import ServeConfig
    from tpu_export.serve._batcher import Job
    from tpu_export.serve._models import Aborted, load_models
    from tpu_export.serve._slots import SlotScheduler

    model = load_models([f"tiny={lm_folder}"], ServeConfig())["tiny"]
    assert model.engine is not None and model.slots == SLOTS

    async def main():
        sched = SlotScheduler("tiny", model, max_queue=8)
        sched.start()
        try:
            quit_req = model.prepare(PROMPTS[1], NEW, Sampling(), [])
            keep_req = model.prepare(PROMPTS[4], NEW, SAMPLERS[4], [])
            quitter = Job("tiny", 1, quit_req, time.monotonic() + 60)
            pieces = []

            def hang_up(text):
                pieces.append(text)
                quitter.cancel.set()

            quit_req.emit = hang_up
            late = Job("tiny", 1, model.prepare("x y", NEW, Sampling(), []), time.monotonic() - 1)
            keeper = Job("tiny", 1, keep_req, time.monotonic() + 60)
            futs = [sched.submit(j) for j in (quitter, keeper, late)]
            return await asyncio.wait_for(asyncio.gather(*futs), 120)
        finally:
            await sched.stop()

    quit_res, keep_res, late_res = asyncio.run(main())
    assert isinstance(quit_res, Aborted) and quit_res.reason == "disconnect"
    assert isinstance(late_res, Aborted) and late_res.reason == "deadline"
    solo = generate_ids(gen.runtime, gen.spec, gen.encode(PROMPTS[4]), NEW, sampling=SAMPLERS[4],
                        eos_token_id=_stops(gen)).tokens
    assert keep_res.completion_tokens == len(solo)
    assert keep_res.text == gen.tokenizer.decode([t for t in solo if t not in _stops(gen)], skip_special_tokens=False)


def test_a_newer_cache_protocol_is_refused_by_name(lm_folder, tmp_path):
    import shutil

    from tpu_export.generators import GeneratorError

    folder = tmp_path / "tpu-v6e"
    shutil.copytree(lm_folder, folder)
    meta = json.loads((folder / "lm.json").read_text())
    (folder / "lm.json").write_text(json.dumps({**meta, "cache_protocol": 3}))
    with pytest.raises(GeneratorError, match="cache_protocol is 3; this tpu-export runs 1 and 2"):
        load_generator(folder)
    (folder / "lm.json").write_text(json.dumps({**meta, "slots": 0}))
    with pytest.raises(GeneratorError, match="slots is 0"):
        load_generator(folder)


def test_bfloat16_slots_match_solo_generate(model_dir, tmp_path):
    """dtype=bfloat16: the B-row caches and insert_slot's batch-1 ones are stored bf16 alike."""
    from tpu_export.serve._slots import SlotSeq

    out = tmp_path / "out"
    tpu_export.convert_lm(model_dir, {"tpu-v6e": {"aot": False, "slots": 2, "dtype": "bfloat16"}}, out,
                          prefill_lengths=(8,), cache_len=64)
    bf = load_generator(out / "tpu-v6e")
    assert str(bf.spec.dtype) == "torch.bfloat16"
    stops = _stops(bf)
    prompts, samplers = PROMPTS[:3], SAMPLERS[:3]
    seqs = [SlotSeq(bf.encode(p), NEW, s.picker(), stops) for p, s in zip(prompts, samplers)]
    _engine(bf).run(seqs)
    assert [s.tokens for s in seqs] == [
        generate_ids(bf.runtime, bf.spec, bf.encode(p), NEW, sampling=s, eos_token_id=stops).tokens
        for p, s in zip(prompts, samplers)]


def test_slots_refusals_name_the_fix(tmp_path, capsys):
    """A model whose state is not a KV cache (LFM2's convolution windows) is refused by name, and so is slots for
    ``convert`` (no KV cache) and for an edge target on the command line."""
    import torch

    from tests.test_llm_lfm2 import _model
    from tpu_export.cli import main
    from tpu_export.converter.errors import UnsupportedModelError
    from tpu_export.converter.llm import KVCacheLM

    with pytest.raises(UnsupportedModelError, match="slots .continuous batching. are not exported for layers with a "
                                                    "state beside the KV cache"):
        KVCacheLM(_model(), 64, batch=2, slots=True)
    with pytest.raises(ValueError, match="option slots is for convert_lm"):
        tpu_export.convert(torch.nn.Linear(2, 2), (torch.zeros(1, 2),), targets={"tpu-v6e": {"slots": 4}},
                           out_dir=tmp_path / "x")
    assert main(["convert-lm", str(tmp_path), "--target", "android:slots=4", "-o", str(tmp_path / "o")]) == 2
    assert "android does not take slots" in capsys.readouterr().err
