"""Hostile Hugging Face model directories on convert-lm: each is a real tiny Llama directory (tests/llm_models.py) with
one thing broken in the test, and the outcome asserted: an LmSourceError whose one line names the file or tensor, no
output written, and (in a child process, for what could hang or read without end) a time and memory bound."""

from __future__ import annotations

import json
import os
import shutil
import time

import pytest

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
from safetensors.torch import load_file, save_file  # noqa: E402

from tests.llm_models import VOCAB, save_model_dir  # noqa: E402
from tests.security.probe import probe  # noqa: E402
from tpu_export.targets.lm import convert_lm  # noqa: E402
from tpu_export.targets.lm_source import LmSourceError, load_lm_source  # noqa: E402

# a child's imports before the clock starts (every conversion has torch): the time is the check's, not an import's
SETUP = "import torch\nfrom tpu_export.targets.lm import convert_lm"
EMBED = "model.embed_tokens.weight"
DOWN = "model.layers.1.mlp.down_proj.weight"


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return save_model_dir("llama", tmp_path_factory.mktemp("llama") / "model")


@pytest.fixture
def d(base, tmp_path):
    return shutil.copytree(base, tmp_path / "model")


def _refused(d, out, *needles, seconds: float = 20) -> str:
    t0 = time.perf_counter()
    with pytest.raises(LmSourceError) as e:
        convert_lm(str(d), ["android"], str(out))
    took = time.perf_counter() - t0
    msg = str(e.value)
    assert "\n" not in msg and all(n in msg for n in needles), msg
    assert not os.path.lexists(out) and not [p for p in os.listdir(out.parent) if p.startswith(".out")]
    assert took < seconds, took
    return msg


def _tensors(d):
    return load_file(str(d / "model.safetensors"))


def _save(d, tensors, name="model.safetensors"):
    save_file(tensors, str(d / name), metadata={"format": "pt"})


def _sharded(d, shard_of: dict):
    """Split model.safetensors into shards named by ``shard_of(tensor name) -> file name`` with an index."""
    t = _tensors(d)
    os.remove(d / "model.safetensors")
    wm = {k: shard_of(k) for k in t}
    for shard in set(wm.values()):
        if "/" not in shard and not os.path.isabs(shard):
            _save(d, {k: v for k, v in t.items() if wm[k] == shard}, shard)
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": wm}))
    return t, wm


def test_the_intact_directory_loads(d):
    src = load_lm_source(str(d))  # the reference for every row below: only the broken part differs
    assert src.stop_token_ids == (2,) and src.bos_token_id == 1


def test_sharded_directory_with_a_symlink_inside_loads(d):
    _sharded(d, lambda k: "model-00001.safetensors" if k == EMBED else "model-00002.safetensors")
    (d / "real").mkdir()
    os.rename(d / "model-00002.safetensors", d / "real" / "model-00002.safetensors")
    (d / "model-00002.safetensors").symlink_to("real/model-00002.safetensors")  # stays inside: followed
    assert load_lm_source(str(d)).model.get_input_embeddings().weight.shape[0] == VOCAB


@pytest.mark.parametrize("name", ["../x/y.safetensors", "/abs/model.safetensors"])
def test_shard_outside_the_directory_is_refused(d, tmp_path, name):
    (tmp_path / "x").mkdir()
    t, _ = _sharded(d, lambda k: name if k == DOWN else "model-00001.safetensors")
    save_file({DOWN: t[DOWN]}, str(tmp_path / "x" / "y.safetensors"))  # the weights the index points at exist
    _refused(d, tmp_path / "out", "model.safetensors.index.json", repr(name), "not a plain file name")


def test_shard_symlink_leaving_the_directory_is_refused(d, tmp_path):
    t, _ = _sharded(d, lambda k: "model-00002.safetensors" if k == DOWN else "model-00001.safetensors")
    os.rename(d / "model-00002.safetensors", tmp_path / "elsewhere.safetensors")
    (d / "model-00002.safetensors").symlink_to(tmp_path / "elsewhere.safetensors")
    _refused(d, tmp_path / "out", "model-00002.safetensors", "outside the folder")


def test_non_safetensors_shard_in_the_index_is_refused(d, tmp_path):
    _sharded(d, lambda k: "pytorch_model-00001.bin" if k == DOWN else "model-00001.safetensors")
    (d / "pytorch_model-00001.bin").write_bytes(b"\x80\x04pickle")
    _refused(d, tmp_path / "out", "'pytorch_model-00001.bin'", "not a .safetensors file")


def test_index_naming_a_missing_shard_is_refused(d, tmp_path):
    _sharded(d, lambda k: "model-00001.safetensors")
    idx = json.loads((d / "model.safetensors.index.json").read_text())
    idx["weight_map"][DOWN] = "model-00009.safetensors"
    (d / "model.safetensors.index.json").write_text(json.dumps(idx))
    _refused(d, tmp_path / "out", "model-00009.safetensors", "no such file")


def test_oversized_safetensors_header_length_is_refused(d, tmp_path):
    raw = (d / "model.safetensors").read_bytes()
    (d / "model.safetensors").write_bytes((1 << 40).to_bytes(8, "little") + raw[8:])
    _refused(d, tmp_path / "out", "model.safetensors", "header length 1099511627776 does not fit")


def test_tensor_range_past_the_end_is_refused(d, tmp_path):
    raw = (d / "model.safetensors").read_bytes()
    (d / "model.safetensors").write_bytes(raw[: len(raw) - 4096])  # the data is cut, the header is not
    _refused(d, tmp_path / "out", "model.safetensors", "data_offsets", "truncated")


@pytest.mark.subprocess
@pytest.mark.parametrize("name", ["tokenizer_config.json", "generation_config.json"])
def test_dev_zero_symlink_is_refused_without_reading(d, tmp_path, name):
    os.remove(d / name)
    (d / name).symlink_to("/dev/zero")
    r = probe(f"convert_lm({str(d)!r}, ['android'], {str(tmp_path / 'out')!r})",
              setup=SETUP, timeout=120)
    assert r["error"] == "LmSourceError" and name in r["message"] and "/dev/zero" in r["message"], r
    assert r["seconds"] < 5 and r["hwm_mb"] < 1500, r
    assert not os.path.lexists(tmp_path / "out")


def _fifo_probe(d, tmp_path, rel):
    os.remove(d / rel) if os.path.lexists(d / rel) else None
    os.mkfifo(d / rel)
    r = probe(f"convert_lm({str(d)!r}, ['android'], {str(tmp_path / 'out')!r})",
              setup=SETUP, timeout=120)
    assert r["error"] == "LmSourceError" and rel in r["message"] and "is a FIFO" in r["message"], r
    assert r["seconds"] < 5 and r["hwm_mb"] < 1500, r
    assert not os.path.lexists(tmp_path / "out")


@pytest.mark.subprocess
@pytest.mark.parametrize("rel", ["model.safetensors", "tokenizer_config.json", "tokenizer.json", "config.json",
                                 "chat_template.jinja", "generation_config.json", "special_tokens_map.json"])
def test_fifo_in_the_directory_is_refused_at_once(d, tmp_path, rel):
    _fifo_probe(d, tmp_path, rel)


@pytest.mark.subprocess
def test_fifo_as_an_indexed_shard_is_refused_at_once(d, tmp_path):
    _sharded(d, lambda k: "model-00002.safetensors" if k == DOWN else "model-00001.safetensors")
    _fifo_probe(d, tmp_path, "model-00002.safetensors")


@pytest.mark.subprocess
def test_a_million_layers_is_refused_before_anything_is_built(d, tmp_path):
    cfg = json.loads((d / "config.json").read_text())
    cfg["num_hidden_layers"] = 1_000_000
    (d / "config.json").write_text(json.dumps(cfg))
    r = probe(f"convert_lm({str(d)!r}, ['android'], {str(tmp_path / 'out')!r})",
              setup=SETUP, timeout=120)
    assert r["error"] == "LmSourceError", r
    assert "num_hidden_layers is 1000000" in r["message"] and "config.json" in r["message"], r
    assert r["seconds"] < 1 and r["hwm_mb"] < 1500, r
    assert not os.path.lexists(tmp_path / "out")


@pytest.mark.parametrize("key,value,needle", [("vocab_size", 10**9, "vocab_size 1000000000"),
                                              ("hidden_size", "64", "hidden_size is '64'"),
                                              ("max_position_embeddings", 1 << 40, "max_position_embeddings"),
                                              ("num_key_value_heads", 3, "num_key_value_heads 3")])
def test_config_sizes_beyond_the_weights_are_refused(d, tmp_path, key, value, needle):
    cfg = json.loads((d / "config.json").read_text())
    cfg[key] = value
    (d / "config.json").write_text(json.dumps(cfg))
    _refused(d, tmp_path / "out", "config.json", needle, seconds=5)


def test_missing_tensor_is_refused_naming_it(d, tmp_path):
    t = _tensors(d)
    del t[DOWN]
    _save(d, t)
    _refused(d, tmp_path / "out", repr(DOWN), "not in the safetensors weights", "random values")


def test_extra_tensor_is_refused_naming_it(d, tmp_path):
    t = _tensors(d)
    t["model.layers.7.mlp.down_proj.weight"] = t[DOWN].clone()
    _save(d, t)
    _refused(d, tmp_path / "out", "'model.layers.7.mlp.down_proj.weight'", "has no such tensor")


def test_wrong_shape_is_refused_naming_it(d, tmp_path):
    t = _tensors(d)
    t[DOWN] = torch.zeros(64, 64)
    _save(d, t)
    _refused(d, tmp_path / "out", repr(DOWN), "shape [64, 64]", "[64, 128]")


def test_wrong_dtype_is_refused_naming_it(d, tmp_path):
    t = _tensors(d)
    t[DOWN] = torch.zeros(t[DOWN].shape, dtype=torch.int32)
    _save(d, t)
    _refused(d, tmp_path / "out", repr(DOWN), "stored as I32")


def test_all_nan_weights_are_refused_or_warned_with_the_flag(d, tmp_path):
    t = _tensors(d)
    t[DOWN] = torch.full_like(t[DOWN], float("nan"))
    _save(d, t)
    _refused(d, tmp_path / "out", repr(DOWN), "NaN or infinite", "--allow-nonfinite-weights")
    with pytest.warns(UserWarning, match=f"{DOWN}.*NaN or infinite"):
        src = load_lm_source(str(d), allow_nonfinite_weights=True)
    assert torch.isnan(dict(src.model.named_parameters())[DOWN]).all()  # converted as it is, not repaired


def test_allow_nonfinite_weights_flag_reaches_the_load(d, tmp_path, capsys):
    from tpu_export.cli import main

    t = _tensors(d)
    t[DOWN][0, 0] = float("inf")
    _save(d, t)
    out = tmp_path / "out"
    assert main(["convert-lm", str(d), "--target", "android", "-o", str(out), "--quiet"]) == 1
    assert "--allow-nonfinite-weights" in capsys.readouterr().err
    # with the flag the load passes (warned) and the next check refuses: a prefill longer than the cache
    assert main(["convert-lm", str(d), "--target", "android", "-o", str(out), "--quiet", "--cache", "8",
                 "--prefill", "32", "--allow-nonfinite-weights"]) == 1
    err = capsys.readouterr().err
    assert "NaN or infinite values; converting anyway" in err and "prefill length 32 is more than cache_len 8" in err
    assert not os.path.lexists(out)


def test_tokenizer_larger_than_the_embedding_is_refused(d, tmp_path):
    tok = json.loads((d / "tokenizer.json").read_text())
    tok["added_tokens"].append({"id": 300, "content": "<extra>", "single_word": False, "lstrip": False,
                                "rstrip": False, "normalized": False, "special": True})
    (d / "tokenizer.json").write_text(json.dumps(tok))
    _refused(d, tmp_path / "out", "tokenizer.json", "ids up to 300", f"{VOCAB} rows")


@pytest.mark.parametrize("value", ["abc", [2, "x"], True, -1, VOCAB])
def test_bad_eos_token_id_is_refused(d, tmp_path, value):
    gen = json.loads((d / "generation_config.json").read_text())
    gen["eos_token_id"] = value
    (d / "generation_config.json").write_text(json.dumps(gen))
    msg = _refused(d, tmp_path / "out", "generation_config.json", "eos_token_id", "is not a token id")
    assert "invalid literal" not in msg


def test_huge_cache_is_refused_before_allocation(d, tmp_path):
    t0 = time.perf_counter()
    with pytest.raises(LmSourceError, match=r"cache_len 10000000000 makes a .* GiB KV cache"):
        convert_lm(str(d), ["android"], str(tmp_path / "out"), cache_len=10**10)
    assert time.perf_counter() - t0 < 20 and not os.path.lexists(tmp_path / "out")


def test_peft_adapter_directory_is_refused(d, tmp_path):
    (d / "adapter_config.json").write_text("{}")
    _refused(d, tmp_path / "out", "adapter_config.json", "PEFT adapter")


def test_export_hf_refuses_the_same_directory(d, tmp_path):
    from tpu_export.litert_torch.generative import export_hf

    t = _tensors(d)
    del t[DOWN]
    _save(d, t)
    with pytest.raises(LmSourceError, match=f"{DOWN}"):
        export_hf.export(model=str(d), output_dir=str(tmp_path / "out"), prefill_lengths=[8], cache_length=64)
    assert not os.path.lexists(tmp_path / "out")


def test_nan_weights_are_found_in_a_mapped_model_too(d, tmp_path, monkeypatch):
    """Past the streaming threshold the weights are maps of the shard, never in memory: checked all the same."""
    from tpu_export.converter.lazy_weights import _FileMap
    from tpu_export.targets import lm_stream

    monkeypatch.setattr(lm_stream, "STREAM_LM_FROM", 0)
    t = _tensors(d)
    t[DOWN][3, 5] = float("nan")
    _save(d, t)
    _refused(d, tmp_path / "out", repr(DOWN), "NaN or infinite")
    with pytest.warns(UserWarning, match=DOWN):
        src = load_lm_source(str(d), allow_nonfinite_weights=True)
    assert all(isinstance(m, _FileMap) for m in src.model.tpu_export_spool)  # mapped, not loaded
    assert torch.isnan(dict(src.model.named_parameters())[DOWN][3, 5])


def test_finite_weights_whose_sum_overflows_are_not_refused():
    """The check sums a piece first (fast); a sum overflowing to infinity is no proof, so the piece is looked at."""
    from tpu_export.targets.lm_dir import check_finite

    m = torch.nn.Linear(64, 64, bias=False)
    with torch.no_grad():
        m.weight.fill_(3e38)
    check_finite(m, "big")  # finite, though the float32 sum is inf
    with torch.no_grad():
        m.weight[7, 9] = float("-inf")
    with pytest.raises(LmSourceError, match=r"^big: weight 'weight' holds NaN or infinite values"):
        check_finite(m, "big")
