"""Where an artifact's files live: a directory, or the same files in one uncompressed zip.

Both give the reader the same view: a listing, each file's bytes, a streaming sha256, and the
(path, offset, length) of a file's bytes on disk so weights can be memory-mapped in place.
Zip entries are never extracted to disk, so entry names cannot escape anywhere.
"""

from __future__ import annotations

import hashlib
import os
import struct
import zipfile

from .errors import ArtifactCorruptError, ArtifactError

__all__ = ["open_container", "DirContainer", "ZipContainer"]

_CHUNK = 1 << 20


def open_container(path):
    path = os.fspath(path)
    if os.path.isdir(path):
        return DirContainer(path)
    if not os.path.exists(path):
        raise ArtifactError(f"{path}: no such artifact (expected a directory or a .zip file)")
    if not zipfile.is_zipfile(path):
        raise ArtifactCorruptError(f"{path}: neither an artifact directory nor a readable zip file "
                                   "(truncated or not an artifact)")
    return ZipContainer(path)


class DirContainer:
    def __init__(self, root: str):
        self.root = root

    def listing(self) -> dict[str, int]:
        out = {}
        for d, _, files in os.walk(self.root):
            for f in files:
                full = os.path.join(d, f)
                out[os.path.relpath(full, self.root).replace(os.sep, "/")] = os.path.getsize(full)
        return out

    def read(self, rel: str, limit: int | None = None) -> bytes:
        with open(os.path.join(self.root, rel), "rb") as f:
            return f.read() if limit is None else f.read(limit)

    def sha256(self, rel: str) -> str:
        h = hashlib.sha256()
        with open(os.path.join(self.root, rel), "rb") as f:
            for chunk in iter(lambda: f.read(_CHUNK), b""):
                h.update(chunk)
        return h.hexdigest()

    def span(self, rel: str) -> tuple[str, int, int]:
        full = os.path.join(self.root, rel)
        return full, 0, os.path.getsize(full)

    def close(self):
        pass


class ZipContainer:
    def __init__(self, path: str):
        self.path = path
        try:
            self.zf = zipfile.ZipFile(path)
            infos = self.zf.infolist()
        except (zipfile.BadZipFile, OSError) as e:
            raise ArtifactCorruptError(f"{path}: unreadable zip ({e}); the file is truncated or corrupted") from None
        names = [i.filename for i in infos if not i.is_dir()]
        if len(names) != len(set(names)):
            raise ArtifactCorruptError(f"{path}: the zip lists an entry twice; refusing an ambiguous artifact")
        self.infos = {i.filename: i for i in infos if not i.is_dir()}

    def listing(self) -> dict[str, int]:
        return {n: i.file_size for n, i in self.infos.items()}

    def read(self, rel: str, limit: int | None = None) -> bytes:
        try:
            with self.zf.open(self.infos[rel]) as f:
                return f.read() if limit is None else f.read(limit)
        except (zipfile.BadZipFile, OSError, EOFError) as e:
            raise ArtifactCorruptError(f"{self.path}: {rel}: unreadable ({e}); truncated or corrupted") from None

    def sha256(self, rel: str) -> str:
        h = hashlib.sha256()
        try:
            with self.zf.open(self.infos[rel]) as f:
                for chunk in iter(lambda: f.read(_CHUNK), b""):
                    h.update(chunk)
        except (zipfile.BadZipFile, OSError, EOFError) as e:
            # zipfile checks each entry's CRC32 as it reads: a flipped byte often surfaces here.
            raise ArtifactCorruptError(f"{self.path}: {rel}: unreadable ({e}); truncated or corrupted") from None
        return h.hexdigest()

    def span(self, rel: str) -> tuple[str, int, int] | None:
        """(path, offset, length) of a stored (uncompressed) entry's bytes; None if compressed."""
        info = self.infos[rel]
        if info.compress_type != zipfile.ZIP_STORED:
            return None
        with open(self.path, "rb") as f:
            f.seek(info.header_offset)
            local = f.read(30)
        if len(local) < 30 or local[:4] != b"PK\x03\x04":
            raise ArtifactCorruptError(f"{self.path}: {rel}: bad local header; truncated or corrupted")
        name_len, extra_len = struct.unpack("<HH", local[26:30])
        return self.path, info.header_offset + 30 + name_len + extra_len, info.file_size

    def close(self):
        self.zf.close()
