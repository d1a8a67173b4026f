"""docs/llm_bench.md is the rendering of bench/results/llm.json (bench/llm.py --render), and the renderer keeps
what a row says: a peer's refusal as its one-line error beside ours' figures, a decode figure that came from our
.tflite loop marked as no engine run and never divided by an engine's."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def page():
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        yield importlib.import_module("_llm_page")
    finally:
        sys.path.remove(str(ROOT / "bench"))


@pytest.fixture(scope="module")
def results():
    return json.loads((ROOT / "bench" / "results" / "llm.json").read_text())


def test_page_is_the_rendering_of_the_results(page, results):
    assert (ROOT / "docs" / "llm_bench.md").read_text(encoding="utf-8") == page.render_page(results), (
        "docs/llm_bench.md is stale: run `.venv/bin/python bench/llm.py --render`")


def test_every_row_names_its_run_and_a_failed_side_one_line(results):
    for r in results["rows"]:
        key = (r["model"], r["quant"])
        assert r.get("date") and r.get("command", "").startswith("bench/llm.py"), key
        for side in ("ours", "peer"):
            err = r[side].get("error")
            assert err is None or (err and "\n" not in err and "Traceback" not in err), (key, side, err)
        if "error" in r["peer"]:
            assert r["ours"].get("wall_s") and r["ours"].get("size_mb"), key  # ours' own figures stay


def _side(wall, decode, runtime=None):
    engine = {"decode_ms": decode, "prefill_ms": 100.0, **({"runtime": runtime} if runtime else {})}
    return {"wall_s": wall, "cpu_s": wall, "peak_rss_mb": 1000.0, "size_mb": 400.0, "engine": engine, "agree": 1.0}


def test_ratios_goals_and_what_is_not_comparable(page):
    both = {"model": "llama", "quant": "float", "date": "2026-01-01", "command": "bench/llm.py --models llama",
            "ours": _side(10.0, 27.0), "peer": _side(40.0, 30.0)}
    loop = {"model": "lfm2", "quant": "float", "date": "2026-01-01", "command": "bench/llm.py --models lfm2",
            "ours": _side(10.0, 5.0, "tflite loop"), "peer": {"error": "ValueError: unsupported model type lfm2"}}
    text = page.render_page({"rows": [loop, both]})
    assert text.index("## llama, float") < text.index("## lfm2, float")  # the bench's model order
    assert "| conversion wall s | 10.0 | 40.0 | 0.25 | <= 1/3 | yes |" in text
    assert "| decode ms / token | 27.00 | 30.00 | 0.90 | <= 0.90 | yes |" in text
    assert "failed to convert: `ValueError: unsupported model type lfm2`" in text
    assert "| decode ms / token ¹ | 5.00 | — | — | <= 0.90 |  |" in text
    assert "No engine run for ours" in text
    assert "| lfm2 | float | — | — | — | — | no engine run (ours) |" in text


def test_a_row_of_an_older_run_renders(page):
    """Rows written before the date and command were recorded (and peer figures from an earlier run)."""
    old = {"model": "gemma3", "quant": "dynamic_int8", "ours": _side(50.0, 24.0),
           "peer": {"wall_s": 200.0, "cpu_s": 60.0, "peak_rss_mb": 2800.0, "size_mb": 97.7, "readme": True}}
    text = page.render_page({"rows": [old]})
    assert "recorded no command or date" in text and "from an earlier run of this script" in text
    assert "| gemma3 | dynamic_int8 | 0.25 | 0.83 | 0.36 | 4.09 | — |" in text
