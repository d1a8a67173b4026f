"""Atomic writes: stage the whole artifact next to the target, fsync, then rename into place.

A failed or interrupted save leaves the target as it was (and no half-written staging files:
they are removed on any exception; a killed process can leave only a hidden ``.<name>.tmp-*``
sibling, never a partial artifact under the target name).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
import zipfile

__all__ = ["StagingDir", "publish_dir", "publish_zip"]


class StagingDir:
    """A temp directory next to ``target`` where files are written and hashed."""

    def __init__(self, target: str):
        parent = os.path.dirname(os.path.abspath(target)) or "."
        os.makedirs(parent, exist_ok=True)
        self.root = tempfile.mkdtemp(prefix=f".{os.path.basename(target)}.tmp-", dir=parent)
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
        shutil.rmtree(self.root, ignore_errors=True)


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def publish_dir(stage: StagingDir, target: str) -> None:
    """Rename the staged directory to ``target``; an existing artifact there is replaced."""
    os.chmod(stage.root, 0o777 & ~_umask())  # mkdtemp made it private
    for d, _, _ in os.walk(stage.root):
        _fsync_dir(d)
    target = os.path.abspath(target)
    old = None
    if os.path.lexists(target):
        old = tempfile.mkdtemp(prefix=f".{os.path.basename(target)}.old-", dir=os.path.dirname(target))
        os.rmdir(old)
        os.rename(target, old)
    try:
        os.rename(stage.root, target)
    except BaseException:
        if old is not None:
            os.rename(old, target)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True) if os.path.isdir(old) else os.remove(old)
    _fsync_dir(os.path.dirname(target))


def publish_zip(stage: StagingDir, target: str, order: list[str]) -> None:
    """Pack the staged files (uncompressed, so weights stay mappable) into ``target`` atomically."""
    target = os.path.abspath(target)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(target)}.tmp-", dir=os.path.dirname(target))
    os.close(fd)
    try:
        with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
            for rel in order:
                info = zipfile.ZipInfo(rel, date_time=(1980, 1, 1, 0, 0, 0))  # reproducible bytes
                info.compress_type = zipfile.ZIP_STORED
                info.external_attr = 0o644 << 16
                full = os.path.join(stage.root, rel)
                with open(full, "rb") as src, zf.open(info, "w", force_zip64=os.path.getsize(full) > 2**31) as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp made it private
        os.replace(tmp, target)
        _fsync_dir(os.path.dirname(target))
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise
