"""litert_torch.generative.export_hf.export, litert-torch 0.10's argument names over tpu-export's one capture:
a saved model directory (or a model object with its tokenizer) -> output_dir/model.litertlm, which the LiteRT-LM
engine runs to transformers' greedy text; arguments we do not implement fail by name."""

from __future__ import annotations

import os

import pytest

transformers = pytest.importorskip("transformers")
pytest.importorskip("litert_lm")

from tests.llm_models import greedy_reference, save_model_dir  # noqa: E402
from tpu_export.generators import EngineGenerator  # noqa: E402
from tpu_export.litert_torch.generative import export_hf  # noqa: E402

PROMPT = "hello world, hello"
NEW = 32


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_model_dir("qwen3", tmp_path_factory.mktemp("hf") / "qwen3")


@pytest.fixture(scope="module")
def want(model_dir):
    return greedy_reference(model_dir, PROMPT, NEW)["text"]


def _engine_text(path):
    return EngineGenerator(str(path)).generate(PROMPT, NEW).text


@pytest.mark.engine
def test_export_dir_float_runs_in_the_engine_like_transformers(model_dir, want, tmp_path):
    out = tmp_path / "float"
    path = export_hf.export(model=str(model_dir), output_dir=str(out), prefill_lengths=[8, 16], cache_length=64,
                            quantization_recipe="none", keep_temporary_files=True)
    assert path == str(out / "model.litertlm") and sorted(os.listdir(out)) == ["model.litertlm", "model.tflite"]
    assert _engine_text(path) == want


@pytest.mark.engine
def test_export_a_model_object_with_its_tokenizer_and_the_default_recipe(model_dir, want, tmp_path):
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir).eval()
    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    path = export_hf.export(model, str(tmp_path), prefill_lengths="16", cache_length=64, tokenizer=tok,
                            use_v2=True, enable_dynamic_shape=False)  # the peer's off values are accepted
    assert os.listdir(tmp_path) == ["model.litertlm"]
    float_bytes = sum(p.numel() * 4 for p in model.parameters())
    assert os.path.getsize(path) < 0.7 * float_bytes  # dynamic_wi8_afp32, the peer's default recipe
    text = _engine_text(path)
    assert len(text) > 0  # it runs; int8 agreement with the float model is measured in the notes, not asserted


@pytest.mark.parametrize("kwargs, match", [
    ({"enable_dynamic_shape": True}, r"enable_dynamic_shape=True is not supported: shapes are static"),
    ({"externalize_embedder": True}, r"externalize_embedder=True is not supported: one prefill/decode model"),
    ({"quantization_recipe": "static_wi8_ai8"}, r"quantization_recipe='static_wi8_ai8' is not supported"),
    ({"v_ts_idx": 3}, r"v_ts_idx=3 is not supported: K and V caches are \[1, kv_heads, cache_len, head_dim\]"),
    ({"trust_remote_code": True}, r"trust_remote_code=True is not supported"),
    ({"cache_lengths": [64, 128]}, r"cache_lengths=\[64, 128\] is not supported: one cache length"),
    ({"task": "image_text_to_text"}, r"task='image_text_to_text' is not supported: text generation only"),
    ({"sampler_top_k": 5}, r"sampler_top_k=5 is not supported"),
])
def test_unsupported_arguments_fail_by_name_before_any_work(model_dir, tmp_path, kwargs, match):
    with pytest.raises(NotImplementedError, match=match):
        export_hf.export(model=str(model_dir), output_dir=str(tmp_path / "o"), cache_length=64, **kwargs)
    assert not (tmp_path / "o").exists()


def test_unknown_argument_and_hub_id(tmp_path):
    with pytest.raises(TypeError, match="unexpected keyword argument 'prefil_lengths'"):
        export_hf.export(model="x", output_dir=str(tmp_path), prefil_lengths=[8])
    with pytest.raises(FileNotFoundError, match="not a local directory; nothing is downloaded"):
        export_hf.export(model="google/gemma-3-270m", output_dir=str(tmp_path / "o"))


def test_both_import_spellings_reach_the_same_export():
    """litert-torch 0.10 users write ``from litert_torch.generative.export_hf import export; export.export(...)``
    (a submodule there); the issue's ``export_hf.export(...)`` works too."""
    import importlib

    from tpu_export.litert_torch.generative.export_hf import export as peer_style

    assert peer_style.export is export_hf.export is peer_style
    assert callable(importlib.import_module("tpu_export.litert_torch.generative.export_hf.export").export)
