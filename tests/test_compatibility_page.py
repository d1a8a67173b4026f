"""docs/compatibility.md and the README's stack table are the renderings of bench/results/compat_matrix.json
(bench/compat_matrix.py), and the results file records a real run of every stack the script defines."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _matrix():
    spec = importlib.util.spec_from_file_location("compat_matrix", ROOT / "bench" / "compat_matrix.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_page_is_the_rendering_of_the_results():
    matrix = _matrix()
    results = json.loads((ROOT / "bench" / "results" / "compat_matrix.json").read_text())
    assert (ROOT / "docs" / "compatibility.md").read_text() == matrix.render_page(results), (
        "docs/compatibility.md is stale: run `python bench/compat_matrix.py`")


def test_readme_table_is_the_rendering_of_the_results():
    matrix = _matrix()
    results = json.loads((ROOT / "bench" / "results" / "compat_matrix.json").read_text())
    readme = (ROOT / "README.md").read_text()
    assert matrix.README_MARKS[0] in readme and matrix.README_MARKS[1] in readme
    assert readme == matrix.readme_with_table(readme, results), (
        "README's stack table is stale: run `python bench/compat_matrix.py`")


def test_every_stack_was_run_with_the_versions_it_asks_for():
    matrix = _matrix()
    results = json.loads((ROOT / "bench" / "results" / "compat_matrix.json").read_text())
    rows = {row["stack"]: row for row in results["stacks"]}
    assert list(rows) == list(matrix.STACKS), "a stack of bench/compat_matrix.py has no recorded run"
    for name, row in rows.items():
        assert row["requested"] == matrix.STACKS[name]["pins"], name
        if not row["install_ok"]:
            continue
        for pin in row["requested"]:
            dist, want = pin.split("==")
            assert (row["installed"][dist] or "").split("+")[0] == want, (name, dist, row["installed"][dist])
        assert row["tests"]["passed"] > 0, f"{name}: the fast tier ran no test"
