"""docs/benchmarks.md and docs/bench/*.md are the renderings of bench/results/<comparison>.json
(bench/render_pages.py), and every recorded run says how, where and when it was measured."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def pages():
    spec = importlib.util.spec_from_file_location("render_pages", ROOT / "bench" / "render_pages.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_page_is_the_rendering_of_its_results(pages):
    for path, text in pages.rendered().items():
        assert Path(path).read_text(encoding="utf-8") == text, (
            f"{os.path.relpath(path, ROOT)} is stale: run `python bench/render_pages.py`")


def test_no_page_under_docs_bench_is_left_over(pages):
    expected = {f"{name}.md" for name in pages.COMPARISONS}
    assert {p.name for p in (ROOT / "docs" / "bench").glob("*.md")} == expected


def test_every_run_says_command_machine_date_and_rows(pages):
    for name in pages.COMPARISONS:
        results = json.loads((ROOT / "bench" / "results" / f"{name}.json").read_text())
        assert results["title"] and results["runs"], name
        for i, run in enumerate(results["runs"]):
            for key in pages.REQUIRED:
                assert run.get(key), f"{name}.json run {i} has no {key}"
            assert len(run["date"]) == 10 and run["date"][4] == "-", (name, i, run["date"])
            keys = [c["key"] for c in run["columns"]]
            assert len(set(keys)) == len(keys), (name, i)
            for row in run["rows"]:
                assert set(row) <= set(keys), (name, i, set(row) - set(keys))
            if run.get("set"):
                assert run["set"] in results.get("sets", {}), (name, i, run["set"])


def test_cells_render_numbers_lists_and_text(pages):
    col = {"key": "x", "label": "x", "fmt": ".2f", "suffix": "x"}
    assert pages._cell(4.938, col) == "4.94x"
    assert pages._cell([529, 927], {"key": "r"}) == "529 / 927"
    assert pages._cell(None, col) == ""
    assert pages._cell("does not run | at all", col) == "does not run \\| at all"
    assert pages._cell(1.2e-06, {"key": "e", "fmt": ".1e"}) == "1.2e-06"


def test_the_index_links_every_comparison_and_the_other_generated_pages(pages):
    index = (ROOT / "docs" / "benchmarks.md").read_text()
    for name in pages.COMPARISONS:
        assert f"(bench/{name}.md)" in index, name
    for _, page, _ in pages.OTHER_PAGES:
        assert f"]({page})" in index and (ROOT / "docs" / page).is_file(), page
