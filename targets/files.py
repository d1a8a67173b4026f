"""Atomic file writes for packages: every file lands complete or not at all."""

from __future__ import annotations

import os
import tempfile

__all__ = ["write_files"]


def write_files(out_dir: str, files: dict[str, bytes]) -> dict[str, str]:
    """Write {file name: bytes} into ``out_dir``; each through a temp file renamed into place."""
    os.makedirs(out_dir, exist_ok=True)
    written = {}
    tmps = []
    try:
        for fname, data in files.items():
            fd, tmp = tempfile.mkstemp(dir=out_dir, prefix=f".{fname}.", suffix=".tmp")
            tmps.append(tmp)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        for (fname, _), tmp in zip(files.items(), tmps):
            path = os.path.join(out_dir, fname)
            os.replace(tmp, path)
            written[fname] = path
    finally:
        for tmp in tmps:
            if os.path.exists(tmp):
                os.unlink(tmp)
    return written
