"""The benchmark pages: docs/bench/<name>.md for each comparison, and docs/benchmarks.md as their index, rendered from
bench/results/<name>.json. The bench scripts record each run there (``append_run``); history is the JSON's ``runs``
list, in the order the runs were made.

    python bench/render_pages.py           # rewrite every generated page
    python bench/render_pages.py --check   # exit 1 if a page differs from the rendering of its JSON

A results file::

    {"title": ..., "script": "bench/x.py", "about": "what is compared and how",
     "sets": {"real": "Real-size models", ...},          # optional: titles of the model sets, in page order
     "runs": [{"set": "real", "date": "2026-11-30", "command": "...", "machine": "...", "load": "...",
               "headline": "6.09x faster conversion (summed)", "notes": ["..."],
               "columns": [{"key": "model", "label": "model"}, {"key": "x", "label": "x faster", "fmt": ".2f",
                           "suffix": "x"}],
               "rows": [{"model": "resnet18", "x": 4.94}, ...]}]}

A cell is a number, a list of numbers (shown "a / b", e.g. ours / peer), text, or null (blank). A page shows, for each
set, the latest run's command, machine, date, load and table, then the earlier runs by date and headline.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "bench", "results")
DOCS = os.path.join(ROOT, "docs")

# the comparisons, in the index's order
COMPARISONS = ["edge_vs_litert_torch", "onnx_vs_onnx2tf", "edge_dynamic", "quant", "large", "large_lm", "llm_edge",
               "kv_layout", "llm_tpu", "pallas", "tpu_path", "tpu_sweep"]

# pages rendered by their own bench scripts, linked from the index
OTHER_PAGES = [
    ("LLMs against export_hf, every model", "llm_bench.md", "bench/llm.py --render"),
    ("TPU compile time against JAX-native models", "tpu_compile.md", "bench/tpu_compile.py --render"),
    ("Model-zoo sweep", "zoo_sweep.md", "bench/zoo_sweep.py"),
    ("Compatibility matrix", "compatibility.md", "bench/compat_matrix.py"),
    ("Serving over HTTP", "serve.md", "bench/serve.py"),
]

REQUIRED = ("command", "machine", "date", "columns", "rows", "headline")


def results_path(name: str) -> str:
    return os.path.join(RESULTS, f"{name}.json")


def page_path(name: str) -> str:
    return os.path.join(DOCS, "bench", f"{name}.md")


def load(name: str) -> dict:
    with open(results_path(name), encoding="utf-8") as f:
        return json.load(f)


def machine() -> str:
    """This host in words: CPU count, memory, OS and architecture."""
    mem = ""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            kb = int(next(line for line in f if line.startswith("MemTotal")).split()[1])
        mem = f", {kb / 2**20:.0f} GiB RAM"
    except (OSError, StopIteration, ValueError):
        pass
    return f"{os.cpu_count()} CPU cores{mem}, {platform.system()} {platform.machine()}"


def load_note() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.1f} / {five:.1f} / {fifteen:.1f} (1 / 5 / 15 min) when the results were written"


def command() -> str:
    """The command line that is running, as a user would type it from the repository root."""
    script = os.path.relpath(os.path.abspath(sys.argv[0]), ROOT)
    return " ".join([".venv/bin/python", script, *sys.argv[1:]])


def append_run(name: str, columns: list[dict], rows: list[dict], headline: str, set_name: str | None = None,
               notes: list[str] | None = None) -> dict:
    """Append a run (this process's command, this machine, today's UTC date, the load) to
    bench/results/<name>.json and re-render the pages. Returns the run recorded."""
    path = results_path(name)
    with open(path, encoding="utf-8") as f:
        results = json.load(f)
    run = {"date": time.strftime("%Y-%m-%d", time.gmtime()), "command": command(), "machine": machine(),
           "load": load_note(), "headline": headline, "columns": columns, "rows": rows}
    if set_name:
        run["set"] = set_name
    if notes:
        run["notes"] = notes
    results["runs"].append(run)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:  # written whole, then renamed: a killed run leaves the old file
        f.write(json.dumps(results, indent=1) + "\n")
    os.replace(tmp, path)
    write_all()
    print(f"recorded in {os.path.relpath(path, ROOT)}; pages re-rendered (python bench/render_pages.py)")
    return run


def _cell(value, col: dict) -> str:
    if value is None:
        return ""
    if isinstance(value, list):
        return " / ".join("-" if v is None else _cell(v, col) for v in value)
    if isinstance(value, bool) or isinstance(value, str):
        return " ".join(str(value).split()).replace("|", "\\|")
    fmt = col.get("fmt")
    text = format(value, fmt) if fmt else (str(value) if isinstance(value, int) else f"{value:g}")
    return text + col.get("suffix", "")


def table(run: dict) -> list[str]:
    cols = run["columns"]
    lines = ["| " + " | ".join(c["label"] for c in cols) + " |", "|" + "---|" * len(cols)]
    for row in run["rows"]:
        lines.append("| " + " | ".join(_cell(row.get(c["key"]), c) for c in cols) + " |")
    return lines


def _sets(results: dict) -> list[tuple[str, str, list[dict]]]:
    """(set key, title, its runs oldest first) in page order."""
    titles = dict(results.get("sets", {}))
    for run in results["runs"]:
        titles.setdefault(run.get("set", ""), "")
    return [(key, title, [r for r in results["runs"] if r.get("set", "") == key]) for key, title in titles.items()
            if any(r.get("set", "") == key for r in results["runs"])]


def render_page(name: str, results: dict) -> str:
    lines = [f"# {results['title']}", "",
             f"<!-- generated by bench/render_pages.py from bench/results/{name}.json; do not edit -->", ""]
    if results.get("about"):
        lines += [results["about"], ""]
    sets = _sets(results)
    for key, title, runs in sets:
        run = runs[-1]
        if len(sets) > 1 or title:
            lines += [f"## {title or key}", ""]
        lines += [f"**{run['headline']}**", "",
                  f"- Command: `{run['command']}`",
                  f"- Machine: {run['machine']}",
                  f"- Date: {run['date']}"]
        if run.get("load"):
            lines.append(f"- Load: {run['load']}")
        lines += [""] + table(run) + [""]
        for note in run.get("notes", []):
            lines += [note, ""]
    earlier = [(r, title) for key, title, runs in sets for r in runs[:-1]]
    if earlier:
        lines += ["## Earlier runs", "",
                  f"Their commands and tables are in bench/results/{name}.json.", ""]
        for r, title in sorted(earlier, key=lambda x: x[0]["date"], reverse=True):
            where = f", {title}" if len(sets) > 1 and title else ""
            lines.append(f"- {r['date']}{where}: {r['headline']}")
        lines.append("")
    return "\n".join(lines)


def render_index(all_results: dict[str, dict]) -> str:
    lines = ["# Benchmarks", "",
             "<!-- generated by bench/render_pages.py from bench/results/*.json; do not edit -->", "",
             "One page per comparison, each generated from the JSON its bench script writes: the command, the "
             "machine, the date", "and the table of the latest run, and the earlier runs. The figures are ratios "
             "measured side by side in one run", "on a shared 2-core host unless a page says otherwise; absolute "
             "times there mean little.", "",
             "## Comparisons", ""]
    for name, results in all_results.items():
        sets = _sets(results)
        run = sets[0][2][-1]
        lines.append(f"- [{results['title']}](bench/{name}.md): {run['headline']} ({run['date']})")
    lines += ["", "## Pages generated by their bench scripts", ""]
    for title, page, script in OTHER_PAGES:
        lines.append(f"- [{title}]({page}) (`{script}`)")
    lines.append("")
    return "\n".join(lines)


def rendered() -> dict[str, str]:
    """Every generated page's path -> its text, from the committed JSON."""
    all_results = {name: load(name) for name in COMPARISONS}
    pages = {page_path(name): render_page(name, results) for name, results in all_results.items()}
    pages[os.path.join(DOCS, "benchmarks.md")] = render_index(all_results)
    return pages


def stale() -> list[str]:
    out = []
    for path, text in rendered().items():
        try:
            with open(path, encoding="utf-8") as f:
                same = f.read() == text
        except FileNotFoundError:
            same = False
        if not same:
            out.append(os.path.relpath(path, ROOT))
    return out


def write_all() -> None:
    os.makedirs(os.path.join(DOCS, "bench"), exist_ok=True)
    for path, text in rendered().items():
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if a generated page is stale; write nothing")
    a = ap.parse_args(argv)
    if a.check:
        bad = stale()
        for path in bad:
            print(f"{path} is stale: run `python bench/render_pages.py`")
        return 1 if bad else 0
    write_all()
    return 0


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    sys.exit(main())
