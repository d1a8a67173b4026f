"""The test tiers (tests/conftest.py): a test is `fast` exactly when it carries none of the tier markers, `-m fast`
selects those, and a run without -m still selects every test."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import FAST, tier_markers

TESTS = Path(__file__).resolve().parent


def test_each_collected_test_is_fast_or_in_a_tier_never_both(request):
    tiers = tier_markers(request.config)
    assert {"slow", "libtpu", "chromium", "engine", "subprocess", "zoo_selfcheck", "install"} <= tiers
    for item in request.session.items:
        marked = sorted(name for name in tiers if item.get_closest_marker(name) is not None)
        is_fast = item.get_closest_marker(FAST) is not None
        assert is_fast != bool(marked), f"{item.nodeid}: fast={is_fast}, tier markers {marked}"


SMALL_SUITE = {
    "conftest.py": "from tests.conftest import pytest_collection_modifyitems  # noqa: F401\n",
    "test_tier_rule_plain.py": """
        import pytest

        def test_plain():
            pass

        @pytest.mark.slow
        def test_slow():
            pass

        @pytest.mark.parametrize("n", [1, pytest.param(2, marks=pytest.mark.engine)])
        def test_param(n):
            pass

        @pytest.mark.skipif(False, reason="a marker that is no tier")
        def test_skipif():
            pass

        @pytest.mark.subprocess
        class TestChild:
            def test_in_class(self):
                pass
    """,
    "test_tier_rule_module.py": """
        import pytest

        pytestmark = [pytest.mark.libtpu, pytest.mark.filterwarnings("ignore")]

        def test_module_marked():
            pass
    """,
}


class _Selected:
    def __init__(self):
        self.ids: list[str] = []

    def pytest_collection_finish(self, session):
        self.ids = [item.nodeid.split("::", 1)[1] for item in session.items]


def _select(suite: Path, markers: list[str], *args: str) -> list[str]:
    selected = _Selected()
    ini = "[pytest]\naddopts = --strict-markers\nmarkers =\n" + "".join(f"    {line}\n" for line in markers)
    (suite / "pytest.ini").write_text(ini)
    rc = pytest.main([str(suite), "--collect-only", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                      "--import-mode=importlib", "--rootdir", str(suite), "-c", str(suite / "pytest.ini"), *args],
                     plugins=[selected])
    assert rc in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED), rc
    return sorted(selected.ids)


@pytest.mark.slow
def test_the_rule_on_a_small_suite(tmp_path, request):
    for name, text in SMALL_SUITE.items():
        (tmp_path / name).write_text(textwrap.dedent(text))
    markers = request.config.getini("markers")
    everything = ["TestChild::test_in_class", "test_module_marked", "test_param[1]", "test_param[2]",
                  "test_plain", "test_skipif", "test_slow"]
    assert _select(tmp_path, markers) == everything
    assert _select(tmp_path, markers, "-m", "fast") == ["test_param[1]", "test_plain", "test_skipif"]
    assert _select(tmp_path, markers, "-m", "not fast") == ["TestChild::test_in_class", "test_module_marked",
                                                            "test_param[2]", "test_slow"]


def _collected(*args: str) -> list[str]:
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                           str(TESTS), *args], capture_output=True, text=True, timeout=600, cwd=TESTS.parent)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return [line for line in done.stdout.splitlines() if "::" in line]


@pytest.mark.subprocess
@pytest.mark.slow
def test_the_fast_tier_covers_every_test_folder_and_the_default_run_keeps_the_rest():
    every, fast = _collected(), _collected("-m", FAST)
    assert set(fast) < set(every), "a run without -m must select every test, the fast tier only some"
    folders = {str(path.parent.relative_to(TESTS.parent)) for path in TESTS.rglob("test_*.py")}
    covered = {line.split("::", 1)[0].rsplit("/", 1)[0] for line in fast}
    assert folders <= covered, f"test folders without a fast test: {sorted(folders - covered)}"
