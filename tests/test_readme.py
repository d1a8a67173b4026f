"""The README is for users: short, its two set-up commands are the ones CI runs, and its links resolve."""

import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _read(name: str) -> str:
    with open(os.path.join(ROOT, name), encoding="utf-8") as f:
        return f.read()


def _commands() -> list[str]:
    return [line for line in _read("README.md").splitlines() if line.startswith("python3 -m venv .venv && ")]


def test_readme_is_short_and_speaks_to_users():
    text = _read("README.md")
    assert len(text.splitlines()) <= 250
    assert not re.search(r"issue #?\d+|\(#\d+\)|\bgoals?\b", text, re.I)


def test_the_test_command_is_what_ci_runs():
    install, test = _commands()
    assert install.endswith("tpu-export demo")
    ci = [line for line in _read(".ci/run").splitlines() if line.startswith("python3 -m venv .venv && ")]
    assert ci == [test]


def test_every_relative_link_resolves():
    links = re.findall(r"\]\(([^)#\s]+)\)", _read("README.md"))
    local = [u for u in links if "://" not in u]
    assert local, "the README links to its docs"
    missing = [u for u in local if not os.path.exists(os.path.join(ROOT, u))]
    assert not missing, missing
