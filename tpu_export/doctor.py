"""`tpu-export doctor`: the versions of the stack tpu-export runs on, and who answers ``import litert_torch``.

Versions come from the installed distributions' metadata, so nothing heavy is imported (no torch, no jax).
"""

from __future__ import annotations

import importlib.metadata
import os
import sys
import warnings

__all__ = ["DISTRIBUTIONS", "report", "run_doctor"]

# the distributions tpu-export's behaviour depends on, and those that may provide the name litert_torch
DISTRIBUTIONS = ("torch", "torch-tpu", "jax", "jaxlib", "libtpu", "ai-edge-litert", "ai-edge-quantizer",
                 "litert-lm-api", "litert-lm-builder", "litert-torch", "tpu-export-litert-torch")


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def report() -> tuple[list[tuple[str, str]], str | None]:
    """(rows of (name, what is installed), the one-line clash of two ``litert_torch`` providers or None)."""
    import tpu_export

    with warnings.catch_warnings():  # the clash is this report's last line, not a second warning
        warnings.simplefilter("ignore")
        from tpu_export.litert_torch import _dropin

    here = os.path.dirname(os.path.abspath(tpu_export.__file__))
    ours = f"{tpu_export.__version__} ({here})"
    recorded = _version("tpu-export")
    if recorded != tpu_export.__version__:
        ours += f"; installed metadata says {recorded}: reinstall tpu-export to refresh it"
    rows = [("tpu-export", ours), ("python", f"{sys.version.split()[0]} ({sys.executable})")]
    rows += [(dist, _version(dist)) for dist in DISTRIBUTIONS]
    path, owner = _dropin.resolution()
    if path is None:
        where = ("not importable (`pip install ./dropin` from a tpu-export checkout provides it; "
                 "`import tpu_export.litert_torch` always works)")
    else:
        where = f"{path} ({owner or 'from no installed distribution'})"
    rows.append(("import litert_torch", where))
    return rows, _dropin.clash_message()


def run_doctor() -> int:
    """Print the report; 1 when two distributions provide ``litert_torch``, else 0."""
    rows, clash = report()
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:{width}s}  {value}")
    if clash is None:
        return 0
    print(f"tpu-export: warning: {clash}", file=sys.stderr)
    return 1
