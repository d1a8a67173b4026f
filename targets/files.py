"""Package files: every file lands complete or not at all, with the umask's mode (converter.atomic)."""

from __future__ import annotations

import os

from tpu_export.converter.atomic import write_file

__all__ = ["write_files", "artifact_size"]


def write_files(out_dir: str, files: dict[str, bytes]) -> dict[str, str]:
    """Write {file name: bytes} into ``out_dir``, each through a temp file renamed into place."""
    os.makedirs(out_dir, exist_ok=True)
    written = {}
    for fname, data in files.items():
        written[fname] = os.path.join(out_dir, fname)
        write_file(written[fname], data)
    return written


def artifact_size(path: str) -> int:
    """Bytes of an artifact: a file, or every file under a directory."""
    if os.path.isdir(path):
        return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)
    return os.path.getsize(path)
