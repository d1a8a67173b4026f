"""docs/tpu_compile.md and the README's compile table are the renderings of bench/results/tpu_compile.json
(bench/tpu_compile.py), and the results hold a run of both sides for every model, slice and dtype the bench
defines, with the figures the comparison needs."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("tpu_compile", ROOT / "bench" / "tpu_compile.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def results():
    return json.loads((ROOT / "bench" / "results" / "tpu_compile.json").read_text())


def test_page_is_the_rendering_of_the_results(bench, results):
    assert (ROOT / "docs" / "tpu_compile.md").read_text() == bench.render_page(results), (
        "docs/tpu_compile.md is stale: run `python bench/tpu_compile.py --render`")


def test_readme_table_is_the_rendering_of_the_results(bench, results):
    readme = (ROOT / "README.md").read_text()
    assert bench.README_MARKS[0] in readme and bench.README_MARKS[1] in readme
    assert readme == bench.readme_with_table(readme, results), (
        "README's compile table is stale: run `python bench/tpu_compile.py --render`")


def test_every_model_and_dtype_was_measured_on_both_sides(bench, results):
    """One v6e chip for every model and dtype; every other row recorded is complete too."""
    have = {(r["model"], f"{r['target']}:{r['topology']}", r["dtype"]): r for r in results["rows"]}
    for model in bench.MODELS:
        for dtype in ("float32", "bfloat16"):
            assert (model, "tpu-v6e:1x1", dtype) in have, f"no run of {model} tpu-v6e:1x1 {dtype}"
    for key, row in have.items():
        s = row["summary"]
        assert "ours" in s and "ref" in s and s["ratio"]["compile_cpu"] > 0, (key, s)
        assert s["ours"]["flops"] and s["ref"]["flops"], key
        assert row["precision"] == ("highest" if row["dtype"] == "float32" else "default"), key


def test_op_counts_read_stablehlo_text(bench):
    text = ('%0 = stablehlo.convolution(%a, %b) : x\n%1 = "stablehlo.case"(%i) ({ stablehlo.return %0 }\n'
            "%2 = stablehlo.dot_general %x, %y\n")
    counts = bench.op_counts(text)
    assert counts["convolution"] == 1 and counts["case"] == 1 and counts["dot_general"] == 1
    assert counts["total"] == 4 and counts["transpose"] == 0
