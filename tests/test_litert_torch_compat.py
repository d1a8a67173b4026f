"""litert-torch 0.10-style calls against tpu_export.litert_torch: every row of tests/write_litert_torch_compat_doc.py
works, or is refused with a NotImplementedError naming what it asked for; docs/litert_torch_compat.md is current.
Beside the rows: what enable_debug writes, config.show_progress, and quant_recipes through export_hf."""

from __future__ import annotations

import os

import pytest
import torch

from tests.write_litert_torch_compat_doc import DOCS, REFUSED, ROWS, WORKS, expected_doc, run_row
from tpu_export import litert_torch


def _id(row) -> str:
    return f"{row.area}:{row.code[:60]}"


@pytest.mark.parametrize("i", range(len(ROWS)), ids=[_id(r) for r in ROWS])
def test_call(i):
    row = ROWS[i]
    outcome, msg = run_row(i)
    assert outcome == row.outcome, msg
    if row.outcome == REFUSED:
        assert row.name in msg, msg
        assert len(msg.splitlines()) == 1  # one line, with the alternative


def test_rows_cover_every_item():
    areas = {r.area for r in ROWS}
    assert areas >= {"package", "config", "convert", "flags", "quant_recipes", "hlfb", "debug", "generative"}
    assert len(ROWS) >= 30 and {r.outcome for r in ROWS} == {WORKS, REFUSED}


def test_the_readme_summary_is_current():
    from tests.write_litert_torch_compat_doc import README, readme_with_block

    with open(README, encoding="utf-8") as f:
        readme = f.read()
    assert readme == readme_with_block(readme), "README's drop-in summary is stale: run " \
                                                "`python -m tests.write_litert_torch_compat_doc`"


@pytest.mark.slow
def test_the_page_is_current():
    with open(DOCS, encoding="utf-8") as f:
        current = f.read()
    assert current == expected_doc(), "docs/litert_torch_compat.md is stale: run " \
                                      "`python -m tests.write_litert_torch_compat_doc`"


def test_enable_debug_writes_each_stage_and_the_model(tmp_path):
    from tpu_export.litert_torch import hlfb

    class M(torch.nn.Module):
        def forward(self, x):
            b = hlfb.StableHLOCompositeBuilder("test_compat.debug_demo")
            return b.mark_outputs(torch.sin(b.mark_inputs(x))) * 2

    x = torch.randn(3, 4)
    model = litert_torch.convert(M().eval(), (x,), enable_debug=True, debug_dir=str(tmp_path))
    torch.testing.assert_close(model(x), torch.sin(x) * 2, atol=1e-6, rtol=0)
    files = sorted(os.listdir(tmp_path))
    assert {"serving_default.exported.txt", "serving_default.decomposed.txt", "model.tflite"} <= set(files)
    stages = [f for f in files if f[:2].isdigit()]
    assert stages[0] == "01_program.txt" and stages[-1].endswith("_composites.txt") and len(stages) >= 8
    exported = (tmp_path / "serving_default.exported.txt").read_text()
    assert "tpu_export_hlfb.mark_tensor" in exported and "sin" in exported
    # the last stage: the marks are gone (this composite has no lowering: op by op)
    assert "mark_tensor" not in (tmp_path / stages[-1]).read_text()
    assert litert_torch.load(str(tmp_path / "model.tflite"))(x).shape == (3, 4)


def test_enable_debug_needs_a_folder():
    with pytest.raises(ValueError, match="enable_debug=True needs debug_dir"):
        litert_torch.convert(torch.nn.ReLU(), (torch.ones(2),), enable_debug=True)


def test_an_unknown_keyword_is_a_type_error():
    with pytest.raises(TypeError, match="unexpected keyword argument 'not_an_option'"):
        litert_torch.convert(torch.nn.ReLU(), (torch.ones(2),), not_an_option=1)


def test_show_progress_prints_the_steps(monkeypatch, capsys):
    monkeypatch.setenv("LITERT_TORCH_SHOW_PROGRESS", "1")
    assert litert_torch.config.show_progress
    m = torch.nn.Linear(4, 4).eval()
    litert_torch.convert(m, (torch.ones(1, 4),), lightweight_conversion=True)
    assert capsys.readouterr().out.strip(), "show_progress printed nothing"


@pytest.mark.slow
def test_quant_recipes_in_export_hf_give_the_named_recipes_file(tmp_path):
    pytest.importorskip("transformers")
    from tests.llm_models import save_model_dir
    from tpu_export.litert_torch.generative import export_hf
    from tpu_export.litert_torch.generative.quantize import quant_recipes

    model_dir = save_model_dir("qwen3", tmp_path / "hf")
    files = {}
    for tag, recipe in (("recipe", quant_recipes.full_weight_only_recipe()), ("name", "weight_only_wi8_afp32")):
        out = tmp_path / tag
        export_hf.export(model=str(model_dir), output_dir=str(out), prefill_lengths=[8], cache_length=32,
                         quantization_recipe=recipe, keep_temporary_files=True, bundle_litert_lm=False)
        files[tag] = (out / "model.tflite").read_bytes()
    assert files["recipe"] == files["name"]
