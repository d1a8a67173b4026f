"""A family the LLM export cannot take is one line in the model author's words: the family and its class, the layer
type or the modeling code's own line, and what exports instead; never the export's wrapper classes, a ``<string>``
location or an option the command lacks. ``--verbose`` prints the chained cause."""

from __future__ import annotations

import re

import pytest
import torch

transformers = pytest.importorskip("transformers")

from tests.llm_models import tiny_tokenizer  # noqa: E402
from tpu_export.cli import _print_error, main  # noqa: E402
from tpu_export.converter.errors import ExportFailedError, UnsupportedModelError  # noqa: E402
from tpu_export.converter.llm import prepare_lm  # noqa: E402
from tpu_export.converter.llm_errors import capture_failure  # noqa: E402

SMALL = dict(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=8, max_position_embeddings=64, bos_token_id=1, eos_token_id=2,
             pad_token_id=0)
# never in a message a user reads: the export's own classes, exec'd code's location, convert's options
INTERNAL = re.compile(r"_CachesOnly|KVCacheLM|_StateLayer|<string>|strict_export|Traceback")

# families whose layers hold a recurrent state (refused by layer type, naming the kind of state)
RECURRENT = [
    # OLMo hybrid's gated delta rule is its own class (Qwen3-Next's exports: tests/test_llm_qwen3_next.py)
    ("OlmoHybrid", {"layer_types": ["linear_attention", "full_attention"], "linear_num_value_heads": 4,
                    "linear_num_key_heads": 2, "linear_key_head_dim": 8, "linear_value_head_dim": 8},
     r"^olmo_hybrid \(OlmoHybridForCausalLM\): its 'linear_attention' \(linear attention, whose state is "
     r"recurrent, not a KV cache\) layers have no export yet; models whose layers are all 'full_attention' or "),
    ("MiniMax", {"layer_types": ["linear_attention", "full_attention"]},
     r"^minimax \(MiniMaxForCausalLM\): its 'linear_attention' .* layers have no export yet"),
]


def _model(prefix, extra):
    torch.manual_seed(0)
    cfg = getattr(transformers, f"{prefix}Config")(**{**SMALL, **extra})
    cfg.architectures = [f"{prefix}ForCausalLM"]  # as a saved model directory's config.json says
    return getattr(transformers, f"{prefix}ForCausalLM")(cfg).eval()


@pytest.mark.parametrize("prefix, extra, message", RECURRENT, ids=[r[0] for r in RECURRENT])
def test_a_recurrent_layer_type_is_refused_naming_the_family_and_the_state(prefix, extra, message):
    with pytest.raises(UnsupportedModelError, match=message) as e:
        prepare_lm(_model(prefix, extra), prefill_lengths=(8,), cache_len=32)
    text = str(e.value)
    assert "\n" not in text and not INTERNAL.search(text) and text.endswith("(the families listed in "
                                                                           "docs/llm.md#families)"), text


def _failing_in_modeling_code():
    """An ExportFailedError as torch.export raises it, chained to an error raised inside transformers' modeling
    code (a real frame of modeling_llama.py, not a made-up traceback)."""
    from transformers.models.llama.modeling_llama import rotate_half

    try:
        try:
            rotate_half(None)
        except AttributeError as inner:
            raise ExportFailedError('torch.export failed on _CachesOnly: could not trace (torch says: TypeError) at '
                                    'File "<string>", line 1: . Fix: try strict_export=False.') from inner
    except ExportFailedError as e:
        return e


def test_a_failure_inside_the_modeling_code_names_the_family_and_its_line():
    import transformers.models.llama.modeling_llama as modeling

    model = _model("Llama", {})
    err = capture_failure(_failing_in_modeling_code(), model)
    text = str(err)
    line = next(i for i, src in enumerate(open(modeling.__file__).read().splitlines(), 1)
                if src.lstrip().startswith("x1 = x[..., : x.shape[-1] // 2]"))
    assert text.startswith("llama (LlamaForCausalLM) does not export yet: its modeling code fails under the KV-cache "
                           f"export in rotate_half (transformers/models/llama/modeling_llama.py:{line}): "
                           "AttributeError: 'NoneType' object has no attribute 'shape'; the families that export "
                           "are listed in docs/llm.md#families"), text
    assert "\n" not in text and not INTERNAL.search(text), text


def test_the_cli_prints_one_line_and_the_chained_cause_only_with_verbose(capsys):
    cause = _failing_in_modeling_code()
    try:
        raise capture_failure(cause, _model("Llama", {})) from cause  # as prepare_lm raises it
    except UnsupportedModelError as e:
        _print_error(e)
        quiet = capsys.readouterr().err
        _print_error(e, verbose=True)
        loud = capsys.readouterr().err
    assert quiet.count("\n") == 1 and quiet.startswith("tpu-export: error: llama (LlamaForCausalLM) does not export")
    assert loud.startswith(quiet) and "tpu-export: the cause (--verbose):" in loud
    assert "Traceback (most recent call last)" in loud and "modeling_llama.py" in loud and "AttributeError" in loud


@pytest.mark.slow
def test_convert_lm_on_a_recurrent_model_directory_is_one_line_and_writes_nothing(tmp_path, capsys):
    model = _model(*RECURRENT[0][:2])
    model.save_pretrained(tmp_path / "olmo_hybrid", safe_serialization=True)
    tiny_tokenizer().save_pretrained(tmp_path / "olmo_hybrid")
    capsys.readouterr()  # save_pretrained's own progress bar
    out = tmp_path / "out"
    assert main(["convert-lm", str(tmp_path / "olmo_hybrid"), "--target", "android", "-o", str(out), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and re.match(r"tpu-export: error: olmo_hybrid \(OlmoHybridForCausalLM\): its "
                                             r"'linear_attention'", err), err
    assert not INTERNAL.search(err) and not out.exists()


def test_a_family_that_exports_is_not_refused():
    # the same path on a family that works: no refusal, real shapes (guards against refusing everything)
    _, spec = prepare_lm(_model("Llama", {}), prefill_lengths=(8,), cache_len=32)
    assert spec.shape == (1, 2, 32, 8)
