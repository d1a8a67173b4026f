"""Atomic artifact writes over converter.atomic: stage the whole artifact next to the target,
fsync, then publish it in one step.

A failed save leaves the target as it was and removes its staging files; a killed one leaves the
old or the new artifact at the target, and the next save cleans what the kill left
(``converter.atomic.recover``).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import zipfile

from tpu_export.converter.atomic import discard, staging_dir, write_file
from tpu_export.converter.atomic import publish_dir as _publish_dir

__all__ = ["StagingDir", "publish_dir", "publish_zip"]


class StagingDir:
    """A temp directory next to ``target`` where files are written and hashed."""

    def __init__(self, target: str):
        self.root = staging_dir(target)
        self.files: dict[str, dict] = {}

    @contextlib.contextmanager
    def open(self, rel: str):
        full = os.path.join(self.root, rel)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        self.files[rel] = {"sha256": _sha256(full), "size": os.path.getsize(full)}

    def write(self, rel: str, data: bytes) -> None:
        with self.open(rel) as f:
            f.write(data)

    def cleanup(self):
        discard(self.root)


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def publish_dir(stage: StagingDir, target: str) -> None:
    """Put the staged directory at ``target``; an existing artifact there is replaced."""
    _publish_dir(stage.root, target)


def publish_zip(stage: StagingDir, target: str, order: list[str]) -> None:
    """Pack the staged files (uncompressed, so weights stay mappable) into ``target`` atomically."""

    def pack(f):
        with zipfile.ZipFile(f, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
            for rel in order:
                info = zipfile.ZipInfo(rel, date_time=(1980, 1, 1, 0, 0, 0))  # reproducible bytes
                info.compress_type = zipfile.ZIP_STORED
                info.external_attr = 0o644 << 16
                full = os.path.join(stage.root, rel)
                with open(full, "rb") as src, zf.open(info, "w", force_zip64=os.path.getsize(full) > 2**31) as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)

    write_file(target, pack)
