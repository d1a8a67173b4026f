"""docs/zoo_sweep.md is what bench/zoo_sweep.py renders from its committed results file (regenerate with
`.venv/bin/python bench/zoo_sweep.py --table-only`)."""

import json

from bench.zoo_sweep import PAGE, RESULTS, render_page


def test_the_zoo_sweep_page_is_current():
    with open(RESULTS) as f:
        results = json.load(f)
    with open(PAGE) as f:
        assert f.read() == render_page(results), "stale: run .venv/bin/python bench/zoo_sweep.py --table-only"


def test_every_row_is_a_result_or_an_error():
    """A row either has both outputs' errors against eager or the error that stopped it; none is left half."""
    with open(RESULTS) as f:
        rows = {k: v for k, v in json.load(f).items() if not k.startswith("_")}
    assert rows
    for fam, r in rows.items():
        assert ("edge_rel_err" in r and "tpu_rel_err" in r) or r.get("error"), (fam, r)
