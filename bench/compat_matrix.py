"""The compatibility matrix: installs tpu-export (not editable) into one fresh virtual environment per stack of
torch / jax / libtpu (/ torch-tpu) and runs the fast test tier against that installed copy.

    python bench/compat_matrix.py                      # every stack, one after another
    python bench/compat_matrix.py --stack torch2.14.1  # one stack (the others keep their recorded rows)
    python bench/compat_matrix.py --install-only       # build the environments, run no tests

The environments live under --cache (default /tmp/tpu-export-compat/<stack>), outside the repository, and are
reused while their installed versions match the stack. Results go to bench/results/compat_matrix.json and the
table page docs/compatibility.md (render_page; tests/test_compatibility_page.py checks the two agree).

How the installed copy is the one tested: the project is copied (tracked and untracked-but-not-ignored files) to
<cache>/src and installed from there with `pip install 'src[test]' torch==...`; pytest then runs in the repository
with `python -P` (the working directory is not put on sys.path) and with the repository appended to sys.path by a
.pth file, after site-packages, so `tpu_export` imports from site-packages and `tests` from the repository. Each run
checks where `tpu_export.converter` was imported from before it counts.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

__all__ = ["STACKS", "render_page", "render_readme_table", "readme_with_table", "run_stack", "main"]

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results" / "compat_matrix.json"
PAGE = REPO / "docs" / "compatibility.md"
DISTS = ("torch", "torchvision", "jax", "jaxlib", "libtpu", "torch-tpu", "ultralytics", "tpu-export", "numpy")

# Each stack: the requirements pinned on pip's command line next to the project's own `[test]` extra.
STACKS: dict[str, dict] = {
    "torch2.13.0-libtpu0.0.42": {
        "describe": "torch 2.13.0 (CPU build) + jax 0.10.2 + libtpu 0.0.42",
        "pins": ["torch==2.13.0", "jax==0.10.2", "jaxlib==0.10.2", "libtpu==0.0.42.1"],
    },
    "torch2.14.1-libtpu0.0.51": {
        "describe": "torch 2.14.1 (CUDA build, run on CPU) + torchvision 0.29.1 + jax 0.10.2 + libtpu 0.0.51",
        # torchvision: the detection tests run here (no torchvision build loads on the 2.13 stack), their slow
        # ones too (whole torchvision detectors, ultralytics YOLO built from its yaml)
        "pins": ["torch==2.14.1", "torchvision==0.29.1", "jax==0.10.2", "jaxlib==0.10.2", "libtpu==0.0.51",
                 "ultralytics==8.4.190"],
        "slow_files": ["tests/test_detection.py", "tests/test_detection_postprocess.py"],
    },
    "torch2.14.1-libtpu0.0.51-torch_tpu0.2.0": {
        "describe": "torch 2.14.1 + jax 0.10.2 + libtpu 0.0.51 + torch-tpu 0.2.0 (autoloaded through torch's "
                    "backend entry point)",
        "pins": ["torch==2.14.1", "jax==0.10.2", "jaxlib==0.10.2", "libtpu==0.0.51", "torch-tpu==0.2.0"],
    },
}
# tests/test_compatibility_page.py checks this script's own output, which a run is still writing: left out.
FAST_TIER = ["-m", "fast", "-n", "2", "-q", "-p", "no:cacheprovider", "-o", "pythonpath=", "--import-mode=importlib",
             "--ignore=tests/test_compatibility_page.py"]
# The AOT compiles for TPU topologies with the stack's libtpu, in this process (tests that start children put the
# repository first on their PYTHONPATH, so their children would not import the installed copy).
LIBTPU_TIER = [*FAST_TIER[:1], "libtpu and not subprocess", *FAST_TIER[2:]]
# A stack's "slow_files": the tests only that stack can run, whole (their slow tests are outside both tiers above).
SLOW_TIER = [*FAST_TIER[:1], "slow and not subprocess", *FAST_TIER[2:]]


def _run(cmd: list[str], log: Path, timeout: float, env: dict | None = None, cwd: Path | None = None) -> int:
    with log.open("a") as out:
        out.write(f"$ {' '.join(cmd)}\n")
        out.flush()
        try:
            done = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, timeout=timeout, env=env, cwd=cwd)
            return done.returncode
        except subprocess.TimeoutExpired:
            out.write(f"timed out after {timeout:.0f} s\n")
            return 124


def _copy_project(dest: Path) -> None:
    """The working tree as git sees it (no .venv, no node_modules, no build outputs), so pip builds from a copy and
    never writes build/ or egg-info into the repository another process may be building in."""
    files = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=REPO, check=True,
                           capture_output=True).stdout.decode().split("\0")
    if dest.exists():
        shutil.rmtree(dest)
    for name in filter(None, files):
        src = REPO / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)


def _versions(python: Path) -> dict[str, str | None]:
    code = ("import json, importlib.metadata as m\nout = {}\nfor d in %r:\n    try: out[d] = m.version(d)\n"
            "    except m.PackageNotFoundError: out[d] = None\nprint(json.dumps(out))") % (DISTS,)
    done = subprocess.run([str(python), "-c", code], capture_output=True, text=True)
    return json.loads(done.stdout) if done.returncode == 0 else {}


def _matches(versions: dict, pins: list[str]) -> bool:
    for pin in pins:
        name, want = pin.split("==")
        have = versions.get(name) or ""
        if have.split("+")[0] != want:
            return False
    return bool(versions.get("tpu-export"))


def _install(env_dir: Path, pins: list[str], log: Path, reuse: bool) -> tuple[bool, float, dict]:
    python = env_dir / "bin" / "python"
    src = env_dir.parent / (env_dir.name + "-src")
    start = time.monotonic()
    _copy_project(src)
    if reuse and python.exists() and _matches(_versions(python), pins):
        # The stack is there: only the project itself is rebuilt from the current working tree.
        rc = _run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall", str(src)], log, 900)
    else:
        if env_dir.exists():
            shutil.rmtree(env_dir)
        subprocess.run([sys.executable, "-m", "venv", str(env_dir)], check=True)
        rc = _run([str(python), "-m", "pip", "install", "-q", f"{src}[test]", *pins], log, timeout=3600)
    # The tests (not shipped) import as `tests.*` from the repository, after site-packages on sys.path (written on
    # every run: an editable install's own .pth handling may have dropped it from a reused environment).
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    Path(site, "zz_tpu_export_repo_tests.pth").write_text(f"{REPO}\n")
    return rc == 0, time.monotonic() - start, _versions(python)


def _imports_installed_copy(python: Path, env_dir: Path) -> str | None:
    """None when tpu_export comes from the environment and tests from the repository; otherwise what is wrong."""
    code = "import tpu_export.converter as c, tests; print(c.__file__); print(tests.__file__)"
    done = subprocess.run([str(python), "-P", "-c", code], capture_output=True, text=True, cwd=REPO)
    if done.returncode != 0:
        return done.stderr.strip().splitlines()[-1]
    converter, tests = done.stdout.split()
    if not converter.startswith(str(env_dir)):
        return f"tpu_export.converter imported from {converter}, not from {env_dir}"
    if not tests.startswith(str(REPO / "tests")):
        return f"tests imported from {tests}, not from {REPO / 'tests'}"
    return None


def _children_cpu() -> float:
    """User + system CPU seconds of the finished child processes (pytest and its xdist workers)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _counts(junit: Path) -> dict:
    counts: dict = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0, "failing": []}
    if not junit.exists():
        return counts
    root = ET.parse(junit).getroot()
    for suite in root.iter("testsuite"):
        tests, failed, errors, skipped = (int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped"))
        counts["failed"] += failed
        counts["errors"] += errors
        counts["skipped"] += skipped
        counts["passed"] += tests - failed - errors - skipped
    for case in root.iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            parts = case.get("classname", "").split(".")
            cls = [] if (REPO / ("/".join(parts) + ".py")).exists() else parts[-1:]  # a test class's last part
            module = "/".join(parts[:len(parts) - len(cls)])
            counts["failing"].append("::".join([f"{module}.py", *cls, case.get("name", "")]))
    counts["failing"].sort()
    return counts


def _pytest(env_dir: Path, args: list[str], log: Path) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        junit = Path(tmp) / "junit.xml"
        env = {**os.environ, "PYTHONSAFEPATH": "1"}
        start, cpu = time.monotonic(), _children_cpu()
        rc = _run([str(env_dir / "bin" / "python"), "-P", "-m", "pytest", *args, f"--junitxml={junit}"], log,
                  timeout=3600, env=env, cwd=REPO)
        return {**_counts(junit), "exit_code": rc, "seconds": round(time.monotonic() - start, 1),
                "cpu_seconds": round(_children_cpu() - cpu, 1)}


def run_stack(name: str, cache: Path, reuse: bool = True, install_only: bool = False) -> dict:
    """Installs one stack and runs the fast tier in it; returns its row of the results file."""
    stack = STACKS[name]
    env_dir = cache / name
    cache.mkdir(parents=True, exist_ok=True)
    log = cache / f"{name}.log"
    log.write_text("")
    ok, install_s, versions = _install(env_dir, stack["pins"], log, reuse)
    python_version = subprocess.run([str(env_dir / "bin" / "python"), "-c", "import platform; print(platform."
                                     "python_version())"], capture_output=True, text=True).stdout.strip()
    row = {"stack": name, "describe": stack["describe"], "requested": stack["pins"], "installed": versions,
           "python": python_version,
           "install_ok": ok and _matches(versions, stack["pins"]), "install_seconds": round(install_s, 1)}
    if not row["install_ok"] or install_only:
        return row
    wrong = _imports_installed_copy(env_dir / "bin" / "python", env_dir)
    if wrong:
        row.update(install_ok=False, install_error=wrong)
        return row
    row["tests"] = _pytest(env_dir, [*FAST_TIER, "--durations=40"], log)
    row["tests_libtpu"] = _pytest(env_dir, LIBTPU_TIER, log)
    if stack.get("slow_files"):
        row["tests_slow"] = _pytest(env_dir, [*SLOW_TIER, *stack["slow_files"]], log)
        row["slow_files"] = stack["slow_files"]
    row["command"] = "pytest " + " ".join(FAST_TIER)
    return row


def _passed_failed(tests: dict | None) -> str:
    return f"{tests['passed']} / {tests['failed'] + tests['errors']}" if tests else "-"


def _cell(row: dict, key: str) -> str:
    return row["installed"].get(key) or "-"


def render_page(results: dict) -> str:
    """docs/compatibility.md from the results file: one row per stack, then what lies beyond the tested range."""
    lines = [
        "# Compatibility",
        "",
        "Generated by `python bench/compat_matrix.py` from `bench/results/compat_matrix.json`; do not edit by hand.",
        "Each stack is a fresh virtual environment with tpu-export installed from its wheel (not editable), and the",
        f"fast test tier run against that installed copy: `{results['command']}`; then the libtpu tier (AOT",
        "compiles for TPU topologies with that stack's libtpu) with `-m \"libtpu and not subprocess\"`.",
        "`seconds` is the fast tier's wall-clock time on a 2-core machine that other work shares; `CPU s` is the",
        "user + system CPU time of pytest and its workers, the figure that load does not change much.",
        "",
        "| stack | torch | jax / jaxlib | libtpu | torch-tpu | install | passed | failed | skipped | seconds | CPU s "
        "| libtpu tier passed / failed |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in results["stacks"]:
        tests = row.get("tests", {})
        failed = tests.get("failed", 0) + tests.get("errors", 0) if tests else "-"
        lines.append(
            f"| {row['describe']} | {_cell(row, 'torch')} | {_cell(row, 'jax')} / {_cell(row, 'jaxlib')} "
            f"| {_cell(row, 'libtpu')} | {_cell(row, 'torch-tpu')} | {'ok' if row['install_ok'] else 'failed'} "
            f"| {tests.get('passed', '-')} | {failed} | {tests.get('skipped', '-')} | {tests.get('seconds', '-')} "
            f"| {tests.get('cpu_seconds', '-')} | {_passed_failed(row.get('tests_libtpu'))} |")
    for row in results["stacks"]:
        if row.get("tests_slow"):
            lines += ["", f"{row['describe']}: the slow tests of {', '.join(row['slow_files'])} (`-m \"slow and not "
                          f"subprocess\"`): {_passed_failed(row['tests_slow'])} passed / failed, "
                          f"{row['tests_slow'].get('skipped', 0)} skipped."]
    tiers = ("tests", "tests_libtpu", "tests_slow")
    failing = [(row["describe"], [i for tier in tiers for i in row.get(tier, {}).get("failing", [])])
               for row in results["stacks"]]
    if any(ids for _, ids in failing):
        lines += ["", "Failing in these runs:", ""]
        lines += [f"- {describe}: {', '.join(f'`{i}`' for i in ids)}" for describe, ids in failing if ids]
    lines += [
        "",
        "## The ranges in pyproject.toml",
        "",
        "- torch `>=2.13,<2.16`: 2.13.0 and 2.14.1 are tested above. A fresh environment picks the newest torch the",
        "  indexes offer; to stay on the CPU build, name it: `pip install -e '.[test]' torch==2.13.0`.",
        "- jax and jaxlib `>=0.10.2,<0.11`: 0.10.2 is tested. jax 0.11 and later require Python 3.12 or newer, and",
        "  this platform has Python 3.11 only, so they are not tested: with them the StableHLO export",
        "  (`jax.export`) and the libtpu pairing below would need a new test run before the cap moves.",
        "- libtpu `>=0.0.42,<0.0.52` (the `tpu` extra): 0.0.42.1 and 0.0.51 are tested with jax 0.10.2; 0.0.52",
        "  (the newest) is untested here and left out until it is.",
        "- transformers `>=5.24,<5.26`: the LLM path runs transformers' own modeling code, so each release is checked",
        "  by the family tests before the cap moves. 5.24.0 and 5.25.0 are tested (5.25 changed how Falcon's new",
        "  decoder architecture hands its KV heads to the cache; both ways export).",
        "- torch-tpu 0.2.0 (torch `>=2.11,<=2.15`, libtpu `>=0.0.50`) installs next to `tpu-export[tpu]`:",
        "  `pip install 'tpu-export[tpu]' torch-tpu` resolves to libtpu 0.0.51.",
        "",
        "## Past jax 0.10.2",
        "",
        "jax 0.11 and later need Python 3.12, which this platform does not have, so the cap stays until a stack with",
        "them runs here. What tpu-export uses that moves between jax releases, to check first when it is lifted:",
        "",
        "- `jax.export`: an artifact records the jax version and its serialization; the loader's version window",
        "  (`tpu_backend/artifact/versions.py`) decides what it opens, and the golden artifacts under",
        "  `tests/tpu/golden/` (written by 0.10.2) must keep loading.",
        "- Pallas on TPU: `jax.experimental.pallas` and `pallas.tpu` (block specs, grid specs, compiler parameters)",
        "  and the attention kernels jax ships under `jax.experimental.pallas.ops.tpu` (splash, flash), whose",
        "  signatures change between releases.",
        "- The libtpu pairing: each jax release names its libtpu (`jax[tpu]`); the `tpu` extra's range moves with",
        "  it, and `jax.experimental.topologies.get_topology_desc` (AOT compiles on a host without a TPU) with it.",
        "- Private jax names, three uses in `tpu_backend/`: `jax._src.core`, `jax._src.lib.xla_client` and",
        "  `jax._src.config`; and `jax.experimental.mesh_utils` for sharded artifacts.",
        "",
    ]
    return "\n".join(lines)


README = REPO / "README.md"
README_MARKS = ("<!-- compat-table: generated by bench/compat_matrix.py -->", "<!-- /compat-table -->")


def render_readme_table(results: dict) -> str:
    """The README's short table of the tested stacks (the page has the full one)."""
    lines = ["| stack | install | fast tier passed / failed | libtpu tier passed / failed |", "|---|---|---|---|"]
    for row in results["stacks"]:
        lines.append(f"| {row['describe']} | {'ok' if row['install_ok'] else 'failed'} "
                     f"| {_passed_failed(row.get('tests'))} | {_passed_failed(row.get('tests_libtpu'))} |")
    return "\n".join(lines) + "\n"


def readme_with_table(readme: str, results: dict) -> str:
    """``readme`` with the block between README_MARKS replaced by render_readme_table(results)."""
    start, end = README_MARKS
    head, _, rest = readme.partition(start + "\n")
    _, _, tail = rest.partition(end)
    return f"{head}{start}\n{render_readme_table(results)}{end}{tail}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stack", action="append", choices=sorted(STACKS), help="run only this stack (repeatable)")
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "tpu-export-compat")
    parser.add_argument("--fresh", action="store_true", help="rebuild the environments even when they match")
    parser.add_argument("--install-only", action="store_true", help="build the environments, run no tests")
    args = parser.parse_args(argv)
    previous = json.loads(RESULTS.read_text()) if RESULTS.exists() else {"stacks": []}
    rows = {row["stack"]: row for row in previous["stacks"]}
    for name in args.stack or list(STACKS):
        row = run_stack(name, args.cache, reuse=not args.fresh, install_only=args.install_only)
        print(json.dumps(row), flush=True)
        if not args.install_only:
            rows[name] = row
    if args.install_only:
        return 0
    results = {"command": "pytest " + " ".join(FAST_TIER), "stacks": [rows[n] for n in STACKS if n in rows]}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    PAGE.write_text(render_page(results))
    README.write_text(readme_with_table(README.read_text(), results))
    bad = [r["stack"] for r in results["stacks"] if not r["install_ok"] or r.get("tests", {}).get("exit_code")
           or r.get("tests_slow", {}).get("exit_code")]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
