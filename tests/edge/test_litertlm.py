"""The .litertlm bundle (edge.litertlm) of tiny Llama and Gemma 3 model directories, run in Google's LiteRT-LM engine
(litert_lm, CPU): its greedy reply is the same text as our own greedy loop on the plain .tflite, which is the same
tokens as transformers' generate(do_sample=False); litert-lm-peek lists the sections; bad arguments are one-line
errors that leave no file."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
import torch

transformers = pytest.importorskip("transformers")
litert_lm = pytest.importorskip("litert_lm")
pytest.importorskip("litert_lm_builder")

from tests.llm_models import CHAT_TEMPLATE, SPECIAL, save_model_dir, tiny_tokenizer  # noqa: E402
from tpu_export import litert_torch  # noqa: E402
from tpu_export.converter.llm import CacheSpec, prepare_lm  # noqa: E402
from tpu_export.edge import convert_program  # noqa: E402
from tpu_export.edge.litertlm import LitertLmError, read_litertlm, write_litertlm  # noqa: E402
from tpu_export.generate import greedy_generate  # noqa: E402

pytestmark = [pytest.mark.engine]

CACHE = 96
NEW = 32
EOS = SPECIAL["eos"][1]
PROMPTS = {
    "padded": "hello world, the cache holds keys",  # 8 tokens: the engine prefills 7 in prefill_8 (one pad row)
    "one_chunk": "hello world, the cache holds keys and values; the decoder reads",  # 13 in prefill_16
    # 19 tokens: longer than every prefill, so the engine runs prefill_16, then 2 in prefill_8 (our loop refuses it)
    "two_chunks": "the quick brown fox jumps over the lazy dog. a tiny model reads a tiny text and writes",
}
LENGTHS = {"padded": 8, "one_chunk": 14, "two_chunks": 19}


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    root = tmp_path_factory.mktemp("litertlm")
    out = {}
    for arch in ("llama", "gemma3"):
        d = save_model_dir(arch, root / arch)
        model = transformers.AutoModelForCausalLM.from_pretrained(d).eval()
        prog, spec = prepare_lm(model, prefill_lengths=(8, 16), cache_len=CACHE)
        lite = convert_program(prog)
        path = write_litertlm(root / f"{arch}.litertlm", lite, tokenizer_json=d / "tokenizer.json",
                              stop_token_ids=[EOS], max_num_tokens=CACHE, cache_spec=spec,
                              prompt_template=CHAT_TEMPLATE)
        out[arch] = (model, lite, spec, path, d)
        if arch == "llama":  # the same model in the large-model form (data after the flatbuffer), bundled from a path
            from tpu_export.edge.convert import write_program

            large = write_program(prog, root / "llama_large.tflite", large=True)
            with pytest.MonkeyPatch.context() as mp:  # copied in as a multi-GB one is (edge.litertlm.copy_direct)
                mp.setattr("tpu_export.edge.litertlm._DIRECT_FROM", 0)
                out["llama_large"] = (model, large, spec, write_litertlm(
                    root / "llama_large.litertlm", large, tokenizer_json=d / "tokenizer.json", stop_token_ids=[EOS],
                    max_num_tokens=CACHE, cache_spec=spec, prompt_template=CHAT_TEMPLATE), d)
    return out


def _engine_reply(path, prompt):
    engine = litert_lm.Engine(str(path), max_num_tokens=CACHE)
    session = engine.create_session(apply_prompt_template=False, sampler_config=litert_lm.SamplerConfig(top_k=1),
                                    max_output_tokens=NEW)
    session.run_prefill([prompt])
    return session.run_decode().texts[0]


@pytest.mark.parametrize("arch,prompt", [("llama", "padded"), ("llama", "one_chunk"), ("llama", "two_chunks"),
                                         ("gemma3", "one_chunk"), ("gemma3", "two_chunks")])
def test_engine_generates_like_our_loop_and_transformers(bundles, arch, prompt):
    model, lite, spec, path, _ = bundles[arch]
    tok = tiny_tokenizer()
    ids = tok(PROMPTS[prompt]).input_ids
    assert len(ids) == LENGTHS[prompt]  # the prefill split the case is named for
    with torch.no_grad():
        want = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=NEW)[0, len(ids):].tolist()
    assert len(want) == NEW and EOS not in want  # 32 tokens compared, none cut by a stop
    if len(ids) <= 16:
        assert greedy_generate(litert_torch.Model(lite), spec, ids, NEW, eos_token_id=EOS) == want
    # the engine answers text (no ids); the Gemma 3 cases run past its 8-token sliding window
    assert _engine_reply(path, PROMPTS[prompt]) == tok.decode(want)



@pytest.mark.parametrize("cache", [512, 4096])  # one IF per layer; eight prefixes, IFs nested seven deep
def test_engine_runs_the_decode_over_the_filled_prefix(tmp_path, cache):
    """The decode signature picks its attention's prefix (of 256 or 512 slots; of 512 ... 4096) through IF ops and
    subgraphs of their own (edge.attention_prefix): the LiteRT-LM engine runs them and replies with transformers'
    greedy tokens."""
    from tpu_export.edge.inspect import op_histogram

    d = save_model_dir("llama", tmp_path / "llama")
    model = transformers.AutoModelForCausalLM.from_pretrained(d).eval()
    prog, spec = prepare_lm(model, prefill_lengths=(8, 16), cache_len=cache)
    lite = convert_program(prog)
    assert op_histogram(lite).get("IF", 0) >= 2
    path = write_litertlm(tmp_path / "llama.litertlm", lite, tokenizer_json=d / "tokenizer.json",
                          stop_token_ids=[EOS], max_num_tokens=cache, cache_spec=spec, prompt_template=CHAT_TEMPLATE)
    tok = tiny_tokenizer()
    ids = tok(PROMPTS["two_chunks"]).input_ids
    with torch.no_grad():
        want = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=NEW)[0, len(ids):].tolist()
    engine = litert_lm.Engine(str(path), max_num_tokens=cache)
    session = engine.create_session(apply_prompt_template=False, sampler_config=litert_lm.SamplerConfig(top_k=1),
                                    max_output_tokens=NEW)
    session.run_prefill([PROMPTS["two_chunks"]])
    assert session.run_decode().texts[0] == tok.decode(want)

def test_a_large_model_form_tflite_runs_in_the_engine(bundles):
    """The .tflite past 2 GiB is in the large-model form (Buffer.offset/size after the flatbuffer): forced on the tiny
    Llama, the bundle holds it as written (offsets from the TFLite section's start) and the engine replies with
    transformers' greedy tokens, as from the classic form."""
    model, large, _, path, _ = bundles["llama_large"]
    with open(large, "rb") as f:
        data = f.read()
    assert data != bundles["llama"][1] and abs(len(data) - len(bundles["llama"][1])) < 65536
    tok = tiny_tokenizer()
    ids = tok(PROMPTS["two_chunks"]).input_ids
    with torch.no_grad():
        want = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=NEW)[0, len(ids):].tolist()
    sections = {s["type"]: s for s in read_litertlm(path)["sections"]}
    begin, end = sections["TFLiteModel"]["begin"], sections["TFLiteModel"]["end"]
    with open(path, "rb") as f:
        f.seek(begin)
        assert end - begin == len(data) and f.read(len(data)) == data  # copied as is
    assert _engine_reply(path, PROMPTS["two_chunks"]) == tok.decode(want)


@pytest.mark.parametrize("piece", [None, 4096])
def test_copy_direct_appends_the_file_whole_and_falls_back_where_unaligned(tmp_path, monkeypatch, piece):
    """The bundle's copy of a large .tflite (#15): whole 4 KiB blocks by O_DIRECT at a block-aligned position (when
    the filesystem takes O_DIRECT; one piece, or 15 pieces through the writer threads), the tail and an unaligned
    position through the stream; the bytes are the file's either way and the stream is left at their end."""
    from tpu_export.edge import file_copy
    from tpu_export.edge.file_copy import copy_direct

    if piece:
        monkeypatch.setattr(file_copy, "_PIECE", piece)

    data = os.urandom(5 * 4096 * 3 + 123)
    src = tmp_path / "m.tflite"
    src.write_bytes(data)
    try:
        os.close(os.open(tmp_path / "probe", os.O_WRONLY | os.O_CREAT | getattr(os, "O_DIRECT", 0)))
        direct = hasattr(os, "O_DIRECT")
    except OSError:
        direct = False
    for head, want_direct in ((16384, len(data) - 123 if direct else 0), (100, 0)):
        with open(tmp_path / "b.bin", "wb") as f:
            f.write(b"h" * head)
            assert copy_direct(str(src), f) == want_direct
            assert f.tell() == head + len(data)
            f.write(b"end")
        assert (tmp_path / "b.bin").read_bytes() == b"h" * head + data + b"end"


@pytest.mark.subprocess
def test_peek_lists_the_sections(bundles):
    path = bundles["llama"][3]
    peek = shutil.which("litert-lm-peek", path=os.path.dirname(sys.executable))
    text = subprocess.run([peek, "--litertlm_file", str(path)], capture_output=True, text=True, check=True).stdout
    for want in ("LlmMetadataProto", "ExecutorMetadataProto", "HF_Tokenizer_Zlib", "TFLiteModel",
                 "tf_lite_prefill_decode", 'decode_output_name: "kv_cache_v_1"', "TYPE_GLOBAL_VALUE_CACHE",
                 f"maximum_sequence_length: {CACHE}", f"max_num_tokens: {CACHE}"):
        assert want in text, want
    info = read_litertlm(path)
    assert [s["type"] for s in info["sections"]] == ["LlmMetadataProto", "ExecutorMetadataProto",
                                                     "HF_Tokenizer_Zlib", "TFLiteModel"]
    llm, ex = info["sections"][0]["metadata"], info["sections"][1]["metadata"]["llm_executor_metadata"]
    assert llm["stop_tokens"] == [{"token_ids": {"ids": [EOS]}}] and llm["jinja_prompt_template"] == CHAT_TEMPLATE
    assert [b["sequence_axis"] for b in ex["state_buffers"]] == [2] * 4
    assert info["sections"][3]["items"] == {"model_type": "tf_lite_prefill_decode"}


def _bad_cases(b):
    model, lite, spec, _, d = b
    tok = d / "tokenizer.json"
    ok = dict(tokenizer_json=tok, stop_token_ids=[EOS], max_num_tokens=CACHE, cache_spec=spec)
    return {
        "suffix": (("x.tflite", lite), ok, r"path: .* must be a file path ending in \.litertlm"),
        "stop_out_of_vocab": (("x.litertlm", lite), {**ok, "stop_token_ids": [999]},
                              r"stop_token_ids: token ids \[999\] are outside .* \[0, 256\)"),
        "max_tokens": (("x.litertlm", lite), {**ok, "max_num_tokens": CACHE + 1},
                       r"max_num_tokens: 97 must be an int in \[1, 96\]"),
        "no_tokenizer": (("x.litertlm", lite), {**ok, "tokenizer_json": d / "nope.json"},
                         r"tokenizer_json: .*nope\.json: the tokenizer: no such file"),
        "other_spec": (("x.litertlm", lite), {**ok, "cache_spec": CacheSpec(2, 2, 64, 16), "max_num_tokens": 64},
                       r"tflite: signature '\w+' input 'kv_cache_k_0' is \(\(1, 2, 96, 16\), 'float32'\), "
                       r"LiteRT-LM needs \(\(1, 2, 64, 16\)"),
        "batch": (("x.litertlm", lite), {**ok, "cache_spec": CacheSpec(2, 2, CACHE, 16, batch=2)},
                  r"cache_spec: batch 2; LiteRT-LM runs batch 1"),
        "not_tflite": (("x.litertlm", b"not a flatbuffer at all"), ok, r"tflite: not a valid \.tflite"),
        "template": (("x.litertlm", lite), {**ok, "prompt_template": "{% for m in messages %}"},
                     r"prompt_template: jinja syntax error on line 1"),
        "model_type": (("x.litertlm", lite), {**ok, "model_type": "llama"}, r"model_type: 'llama' is not one of"),
    }


@pytest.mark.parametrize("case", ["suffix", "stop_out_of_vocab", "max_tokens", "no_tokenizer", "other_spec", "batch",
                                  "not_tflite", "template", "model_type"])
def test_bad_arguments_are_one_line_errors_and_leave_no_file(bundles, tmp_path, case):
    (name, lite), kwargs, match = _bad_cases(bundles["llama"])[case]
    with pytest.raises(Exception, match=match) as e:
        write_litertlm(tmp_path / name, lite, **kwargs)
    assert "\n" not in str(e.value)
    assert os.listdir(tmp_path) == []


def test_a_tflite_without_llm_signatures_is_refused(bundles, tmp_path):
    from tpu_export import converter

    plain = convert_program(converter.prepare(torch.nn.Linear(4, 4).eval(), (torch.randn(1, 4),)))
    _, _, spec, _, d = bundles["llama"]
    with pytest.raises(LitertLmError, match=r"signatures \['serving_default'\]; LiteRT-LM needs 'decode' and at "
                                            r"least one 'prefill_<L>'"):
        write_litertlm(tmp_path / "x.litertlm", plain, tokenizer_json=d / "tokenizer.json", stop_token_ids=[EOS],
                       max_num_tokens=8, cache_spec=spec)
    assert os.listdir(tmp_path) == []
