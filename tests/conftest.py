"""Suite-wide set-up: libtpu on this TPU-less host must coexist across xdist workers, and the test tiers.

Tiers: every test that carries none of the markers pyproject.toml registers for what is slow or needs a real
component (slow, libtpu, chromium, engine, subprocess, zoo_selfcheck, install) gets `fast`, so `pytest -m fast`
is the editing loop. A run without -m selects everything, so nothing marked is hidden from CI.
"""

import os

import pytest

from tpu_export.tpu_backend.aot import prepare_cpu_host

prepare_cpu_host()  # sets ALLOW_MULTIPLE_LIBTPU_LOAD etc. only where no TPU is attached
# The AOT compile cache is on by default in the user's cache folder: tests compile afresh and write nothing
# there; those that test the cache name their own folder (or unset this).
os.environ.setdefault("TPU_EXPORT_AOT_CACHE", "none")

FAST = "fast"


def tier_markers(config: pytest.Config) -> frozenset[str]:
    """The registered markers that take a test out of the fast tier: every line of pyproject's `markers` but
    `fast` itself (one list, so a marker registered there is a tier without a second edit here)."""
    names = (line.split(":", 1)[0].strip() for line in config.getini("markers"))
    return frozenset(name for name in names if name and name != FAST)


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects: it must see the `fast` this adds
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    tiers = tier_markers(config)
    for item in items:
        if all(item.get_closest_marker(name) is None for name in tiers):
            item.add_marker(FAST)
