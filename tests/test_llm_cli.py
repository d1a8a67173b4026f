"""`tpu-export convert-lm` on a saved Hugging Face model directory (tests.llm_models' tiny Llama) to android and
tpu-v6e, then `tpu-export generate` on both outputs through the CLI: the LiteRT-LM engine runs the .litertlm, PJRT
CPU runs the TPU artifact (it carries a cpu lowering beside the tpu one). Greedy text equals transformers'
generate(do_sample=False); sampling with a seed repeats and differs from greedy; errors are one line."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil

import pytest

transformers = pytest.importorskip("transformers")

from tests.llm_models import greedy_reference, save_model_dir  # noqa: E402
from tpu_export.cli import main  # noqa: E402
from tpu_export.generate import Sampling  # noqa: E402
from tpu_export.generators import load_generator  # noqa: E402

pytestmark = [pytest.mark.engine, pytest.mark.libtpu, pytest.mark.slow]

NEW = 32
PROMPT = "the cache holds keys"  # 4 tokens of the test tokenizer: prefill_8
TIMING = re.compile(r"^prefill: [\d.]+ ms \(\d+ tokens\); decode: [\d.]+ tokens/s \(\d+ new tokens\)", re.M)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_model_dir("llama", tmp_path_factory.mktemp("hf") / "llama")


@pytest.fixture(scope="module")
def reference(model_dir):
    """transformers' own greedy continuation of PROMPT (all 32 tokens: no early eos)."""
    return greedy_reference(model_dir, PROMPT, NEW)


@pytest.fixture(scope="module")
def out(model_dir, tmp_path_factory):
    o = tmp_path_factory.mktemp("lm") / "out"
    assert main(["convert-lm", str(model_dir), "--target", "android", "--target", "tpu-v6e", "--prefill", "8,16",
                 "--cache", "64", "-o", str(o), "--quiet"]) == 0
    return o


def _generate(capsys, artifact, *extra, prompt=PROMPT):
    rc = main(["generate", str(artifact), "--prompt", prompt, "--max-new-tokens", str(NEW), *extra])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def test_convert_lm_writes_both_outputs_and_a_summary(out):
    assert sorted(os.listdir(out / "android")) == ["lm.json", "model.litertlm", "model.tflite", "tokenizer.json"]
    assert sorted(os.listdir(out / "tpu-v6e")) == ["lm.json", "model.tpuexp", "tokenizer.json"]
    s = json.loads((out / "summary.json").read_text())
    assert s["cache"]["cache_len"] == 64 and s["prefill_lengths"] == [8, 16]
    assert sorted(s["signatures"]) == ["decode", "prefill_16", "prefill_8"]
    assert {"load", "capture"} <= set(s["stages"])
    assert {"lower", "write"} <= set(s["targets"]["android"]["stages"])
    assert {"lower", "write"} <= set(s["targets"]["tpu-v6e"]["stages"])


@pytest.mark.parametrize("artifact", ["android/model.litertlm", "tpu-v6e"])
def test_greedy_generate_matches_transformers(out, reference, capsys, artifact):
    rc, text, err = _generate(capsys, out / artifact)
    assert rc == 0, err
    assert text == reference["text"] + "\n"
    assert TIMING.search(err), err


def test_sampling_with_a_seed_repeats_and_differs_from_greedy(out, reference, capsys):
    rc, text, _ = _generate(capsys, out / "tpu-v6e", "--temperature", "1.5", "--top-k", "50", "--top-p", "0.95",
                            "--seed", "7")
    gen = load_generator(out / "tpu-v6e")  # the same run from Python, then other seeds and rules
    hot = Sampling(temperature=1.5, top_k=50, top_p=0.95, seed=7)
    assert rc == 0 and text == gen.generate(PROMPT, NEW, sampling=hot).text + "\n"
    assert gen.generate(PROMPT, NEW, sampling=hot).tokens != reference["tokens"]
    assert gen.generate(PROMPT, NEW, sampling=dataclasses.replace(hot, seed=8)).tokens != \
        gen.generate(PROMPT, NEW, sampling=hot).tokens
    # top_k 1 is greedy at any temperature; a tiny top_p keeps only the most likely token
    assert gen.generate(PROMPT, NEW, sampling=Sampling(temperature=5.0, top_k=1, seed=1)).tokens == reference["tokens"]
    assert gen.generate(PROMPT, NEW, sampling=Sampling(temperature=5.0, top_p=1e-6, seed=1)).tokens == \
        reference["tokens"]


@pytest.mark.parametrize("artifact", ["android/model.litertlm", "tpu-v6e"])
def test_chat_wraps_the_prompt_in_the_models_template(out, model_dir, capsys, artifact):
    import torch

    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir).eval()
    ids = tok.apply_chat_template([{"role": "user", "content": PROMPT}], add_generation_prompt=True,
                                  return_tensors="pt", return_dict=True)["input_ids"]
    with torch.no_grad():
        new = model.generate(ids, do_sample=False, max_new_tokens=8)[0, ids.shape[1]:].tolist()
    eos = model.generation_config.eos_token_id
    want = tok.decode(new[:new.index(eos)] if eos in new else new)
    rc = main(["generate", str(out / artifact), "--prompt", PROMPT, "--max-new-tokens", "8", "--chat"])
    assert rc == 0 and capsys.readouterr().out == want + "\n"


def test_engine_sampling_with_a_seed_repeats(out, reference, capsys):
    hot = ("--temperature", "1.5", "--top-k", "50", "--seed", "7")
    runs = [_generate(capsys, out / "android/model.litertlm", *hot)[1] for _ in range(2)]
    assert runs[0] == runs[1] and runs[0] != reference["text"] + "\n"


def test_inspect_a_litertlm(out, capsys):
    assert main(["inspect", str(out / "android/model.litertlm")]) == 0
    text = capsys.readouterr().out
    assert "max_num_tokens 64; stop tokens [[2]]" in text and "4 cache buffers" in text
    assert "prefill_8 (tokens [1, 8], 4 cache inputs)" in text


def test_inspect_reads_the_model_section_through_a_view(out, monkeypatch):
    """The .tflite section's signatures are read from a view of the file's map, never a bytes copy of the section (a
    2.28 GB bundle peaked at 4.7 GB RSS), released before the map closes; the description is the one a copy gives."""
    from tpu_export.targets import lm_describe, tflite_io

    path, read, seen = str(out / "android/model.litertlm"), tflite_io.signatures, []
    monkeypatch.setattr(tflite_io, "signatures", lambda data: seen.append(data) or read(data))
    text = lm_describe.describe_litertlm(path)
    (view,) = seen
    assert isinstance(view, memoryview) and "prefill_16 (tokens [1, 16], 4 cache inputs)" in text
    with pytest.raises(ValueError, match="released"):
        len(view)
    monkeypatch.setattr(tflite_io, "signatures", lambda data: read(bytes(data)))  # the section copied, as before
    assert lm_describe.describe_litertlm(path) == text


def _one_line_error(capsys, argv) -> str:
    rc = main(argv + (["--quiet"] if argv[0] == "convert-lm" else []))
    err = capsys.readouterr().err.strip()
    assert rc != 0 and len(err.splitlines()) == 1, err
    return err


def test_pickled_weights_and_missing_tokenizer_are_one_line_errors(model_dir, tmp_path, capsys):
    pickled = tmp_path / "pickled"
    shutil.copytree(model_dir, pickled)
    (pickled / "model.safetensors").rename(pickled / "pytorch_model.bin")  # never unpickled: refused by name
    err = _one_line_error(capsys, ["convert-lm", str(pickled), "--target", "cpu-xla", "-o", str(tmp_path / "o")])
    assert "pytorch_model.bin" in err and "pickle" in err and "save_pretrained" in err
    no_tok = tmp_path / "no_tok"
    shutil.copytree(model_dir, no_tok)
    (no_tok / "tokenizer.json").unlink()
    err = _one_line_error(capsys, ["convert-lm", str(no_tok), "--target", "cpu-xla", "-o", str(tmp_path / "o")])
    assert "no tokenizer.json" in err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("artifact", ["android/model.litertlm", "android/model.tflite", "tpu-v6e"])
def test_a_prompt_longer_than_every_prefill_generates_alike_on_every_runtime(model_dir, out, capsys, artifact):
    """24 prompt tokens, more than prefill_16 holds: prefilled in chunks by our loop on the .tflite and the TPU
    artifact, as the LiteRT-LM engine prefills them; all three give transformers' greedy text."""
    long_prompt = PROMPT * 6
    want = greedy_reference(model_dir, long_prompt, 16)
    rc = main(["generate", str(out / artifact), "--prompt", long_prompt, "--max-new-tokens", "16"])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    assert cap.out == want["text"] + "\n"


def test_a_full_cache_is_one_line(out, capsys):
    err = _one_line_error(capsys, ["generate", str(out / "tpu-v6e"), "--prompt", PROMPT, "--max-new-tokens", "62"])
    assert "4 prompt tokens + 62 new tokens need 65 cache slots; the cache holds 64" in err
    bundle = str(out / "android/model.litertlm")
    err = _one_line_error(capsys, ["generate", bundle, "--prompt", PROMPT, "--max-new-tokens", "61"])
    assert "4 prompt tokens + 61 new tokens exceed" in err and "max_num_tokens 64" in err
    assert main(["generate", bundle, "--prompt", PROMPT, "--max-new-tokens", "60"]) == 0  # exactly full: all 60
    assert TIMING.search(capsys.readouterr().err).group(0).endswith("(60 new tokens)")


def test_a_foreign_out_dir_is_not_replaced(model_dir, tmp_path, capsys):
    (tmp_path / "mine.txt").write_text("keep")
    err = _one_line_error(capsys, ["convert-lm", str(model_dir), "--target", "cpu-xla", "-o", str(tmp_path)])
    assert "refusing to replace" in err and (tmp_path / "mine.txt").read_text() == "keep"


def test_a_cache_protocol_module_converts_from_python(model_dir, reference, tmp_path):
    """A user module that follows converter.llm's cache protocol (here KVCacheLM itself), with its tokenizer."""
    from tpu_export.converter.llm import KVCacheLM
    from tpu_export.targets.lm import convert_lm
    from tpu_export.targets.lm_source import LmSourceError

    lm = KVCacheLM(transformers.AutoModelForCausalLM.from_pretrained(model_dir), cache_len=48).eval()
    with pytest.raises(LmSourceError, match="its cache protocol spec holds 48 slots; cache_len=64 cannot change it"):
        convert_lm(lm, ["cpu-xla"], tmp_path / "o", cache_len=64, tokenizer=model_dir / "tokenizer.json")
    written = convert_lm(lm, ["cpu-xla"], tmp_path / "o", prefill_lengths=(8,), tokenizer=model_dir / "tokenizer.json")
    gen = load_generator(written["cpu-xla"]["model.tpuexp"])
    assert gen.generate(PROMPT, NEW).tokens == reference["tokens"]


def test_bf16_tpu_artifact_has_bf16_caches_a_decode_report_and_generates(model_dir, reference, tmp_path, capsys):
    """--target tpu-v6e:dtype=bfloat16 goes through tpu_backend.llm.export_lm: weights and caches bf16 (lm.json says
    so, generate feeds bf16 zeros), report.json's llm section compares decode bytes with the lower bound."""
    o = tmp_path / "out"
    assert main(["convert-lm", str(model_dir), "--target", "tpu-v6e:dtype=bfloat16", "--prefill", "8",
                 "--cache", "64", "-o", str(o), "--quiet"]) == 0
    assert json.loads((o / "tpu-v6e" / "lm.json").read_text())["cache"]["dtype"] == "bfloat16"
    assert main(["inspect", str(o / "tpu-v6e" / "model.tpuexp")]) == 0
    shown = capsys.readouterr().out
    assert re.search(r"kv_cache_k_0\s+\[1, 2, 64, 16\] bfloat16", shown)
    assert '"lower_bound_bytes_per_token"' in shown and '"tokens_per_s_per_chip"' in shown
    res = load_generator(o / "tpu-v6e" / "model.tpuexp").generate(PROMPT, NEW)
    # bf16 weights on a random-init model whose logits nearly tie: the first tokens agree with float32's
    assert res.tokens[:4] == reference["tokens"][:4] and len(res.tokens) == NEW


def test_cache_dir_makes_a_second_tpu_conversion_a_hit(model_dir, tmp_path, monkeypatch):
    """convert-lm --cache-dir DIR: the second conversion of the same model reuses every signature's executable."""
    monkeypatch.delenv("TPU_EXPORT_AOT_CACHE", raising=False)
    argv = ["convert-lm", str(model_dir), "--target", "tpu-v6e:dtype=bfloat16", "--prefill", "8", "--cache", "64",
            "--cache-dir", str(tmp_path / "cache"), "--quiet"]

    def cache_states(o):
        (report,) = list(o.glob("tpu-v6e/model.tpuexp/compiled/*/report.json"))
        return {k: v["compile_cache"] for k, v in json.loads(report.read_text())["signatures"].items()}

    assert main(argv + ["-o", str(tmp_path / "a")]) == 0
    assert cache_states(tmp_path / "a") == {"prefill_8": "miss", "decode": "miss"}
    assert main(argv + ["-o", str(tmp_path / "b")]) == 0
    assert cache_states(tmp_path / "b") == {"prefill_8": "hit", "decode": "hit"}


def test_the_torch_model_is_freed_before_the_last_edge_target_quantizes(model_dir, tmp_path):
    """convert_lm drops the Program and the model it loaded once the last target's float .tflite exists (nothing
    after reads them: bench/llm.py's Gemma-3-100M int8 peak RSS 2.22 -> 1.34 GB with the float bytes freed too), and
    not before: an earlier target still has it. Seen from the progress callback at each quantize stage."""
    import gc
    import weakref

    from tpu_export.targets.lm import convert_lm

    def models():
        return [o for o in gc.get_objects() if isinstance(o, transformers.PreTrainedModel)]

    before = {id(m) for m in models()}
    loaded, alive_at_quantize = [], {}

    def progress(msg):
        if msg.startswith("load: done"):
            loaded.extend(weakref.ref(m) for m in models() if id(m) not in before)
        elif ": quantize: " in msg and "done" not in msg:
            gc.collect()
            alive_at_quantize[msg.split(":")[0]] = [r() is not None for r in loaded]

    written = convert_lm(model_dir, ["android", "ios"], tmp_path / "o", prefill_lengths=(8,), cache_len=64,
                         quantize="dynamic_int8", progress=progress)
    assert len(loaded) == 2  # the scan sees the model convert_lm loaded (LlamaForCausalLM and its LlamaModel)
    assert alive_at_quantize == {"android": [True, True], "ios": [False, False]}
    sizes = {t: os.path.getsize(f["model.tflite"]) for t, f in written.items()}
    assert sizes["android"] == sizes["ios"]  # the same quantized model, before and after the release


def test_the_narrowing_warning_offers_no_enable_x64_in_convert_lm():
    """A cache-protocol module with int64 ids: the capture's 64-bit warning reaches the caller without the advice
    to pass enable_x64 (convert_lm has none); other warnings pass through unchanged."""
    import warnings

    from tpu_export.converter.passes.dtype_policy import KEEP_64_ADVICE
    from tpu_export.targets.lm import _lm_narrowing_said

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with _lm_narrowing_said():
            warnings.warn("signature 'decode': 64-bit inputs ['ids'] become 32-bit (int64->int32, float64->float32), "
                          f"as LiteRT and TPUs run them. {KEEP_64_ADVICE}", stacklevel=1)
            warnings.warn("something else", RuntimeWarning, stacklevel=1)
    said = [(w.category, str(w.message)) for w in caught]
    assert said[0][0] is UserWarning and "enable_x64" not in said[0][1] and "int32 token ids" in said[0][1]
    assert said[1] == (RuntimeWarning, "something else")
