"""Where an artifact's files live: a directory, or the same files in one uncompressed zip.

Both give the reader the same view: a listing, each file's bytes, a streaming sha256, and the
(descriptor, offset, length) of a file's bytes on disk so weights can be memory-mapped in place from the
very file that was checked.

An artifact may come from anyone, so a container trusts nothing in it:

- only regular files: no symlinks, FIFOs, devices or sockets anywhere inside a directory (the
  path the user names may itself be a symlink: it is their choice, not the file's);
- only stored (uncompressed) zip entries, unencrypted, whose central-directory sizes agree, as
  the writer writes them: a deflated entry is refused before a byte of it is inflated;
- a read never returns more than the size the caller expects: it reads at most one byte more,
  to see that the file grew, so memory is bounded by the manifest's sizes.

Zip entries are never extracted to disk, so entry names cannot escape anywhere. The file rule itself
(O_NOFOLLOW per component, non-blocking opens, bounded reads) is converter/untrusted.py's; this module words
its refusals for an artifact.
"""

from __future__ import annotations

import hashlib
import os
import stat
import struct
import zipfile

from tpu_export.converter.untrusted import Folder, UntrustedFileError, kind_of, open_regular, read_exact

from .errors import ArtifactCorruptError, ArtifactError

__all__ = ["open_container", "DirContainer", "ZipContainer"]

_CHUNK = 1 << 20
_MAX_ENTRIES = 10_000  # a real artifact holds a handful of files per signature and target
_MAX_DEPTH = 8  # directory levels inside an artifact (the writer makes two)


def open_container(path):
    path = os.fspath(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise ArtifactError(f"{path}: no such artifact (expected a directory or a .zip file)") from None
    except OSError as e:
        raise ArtifactError(f"{path}: cannot read it ({e.strerror})") from None
    if stat.S_ISDIR(st.st_mode):
        return DirContainer(path)
    if not stat.S_ISREG(st.st_mode):
        raise ArtifactCorruptError(f"{path}: is {kind_of(st.st_mode)}, not an artifact directory or .zip file")
    return ZipContainer(path)


def _read_fd(fd: int, size: int, what: str) -> bytes:
    """Exactly ``size`` bytes from ``fd``; one byte more is read only to see that it grew."""
    try:
        return read_exact(fd, size, what)
    except UntrustedFileError as e:
        if e.reason != "changed":
            raise ArtifactError(f"{what}: {e.problem}") from None
        got = f"{e.got}{'+' if e.got > size else ''}"
        raise ArtifactCorruptError(f"{what}: read {got} bytes, the manifest records {size}: truncated or changed "
                                   "while being read") from None


class DirContainer:
    def __init__(self, root: str):
        self.root = root
        # Every later open is relative to this descriptor with O_NOFOLLOW at each step, so a
        # file swapped for a symlink after the listing is still never followed.
        try:
            self.folder = Folder(root)
        except UntrustedFileError as e:
            raise ArtifactError(f"{root}: cannot read it ({e.problem})") from None
        self.fd = self.folder.fd
        self._spans: list[int] = []

    def _bad(self, rel: str, mode: int) -> ArtifactCorruptError:
        return ArtifactCorruptError(f"{self.root}: {rel} is {kind_of(mode)}; an artifact holds only regular "
                                    "files (copy the real file in its place)")

    def listing(self) -> dict[str, int]:
        out: dict[str, int] = {}
        todo = [("", self.fd, 0)]
        try:
            while todo:
                prefix, dfd, depth = todo.pop()
                try:
                    with os.scandir(dfd) as it:
                        entries = [(e.name, e.stat(follow_symlinks=False)) for e in it]
                except OSError as e:
                    raise ArtifactError(f"{self.root}: {prefix or '.'}: cannot list it ({e.strerror})") from None
                finally:
                    if dfd != self.fd:
                        os.close(dfd)
                for name, st in entries:
                    rel = prefix + name
                    if len(out) + len(todo) > _MAX_ENTRIES:
                        raise ArtifactCorruptError(f"{self.root}: more than {_MAX_ENTRIES} files; not an artifact")
                    if stat.S_ISREG(st.st_mode):
                        out[rel] = st.st_size
                    elif stat.S_ISDIR(st.st_mode) and depth < _MAX_DEPTH:
                        todo.append((rel + "/", self._open_dir(rel), depth + 1))
                    elif stat.S_ISDIR(st.st_mode):
                        raise ArtifactCorruptError(f"{self.root}: {rel} is nested more than {_MAX_DEPTH} levels deep")
                    else:
                        raise self._bad(rel, st.st_mode)
        finally:
            for _, dfd, _ in todo:
                os.close(dfd)
        return out

    def _open_dir(self, rel: str) -> int:
        return self._open(rel, os.O_DIRECTORY)

    def _open(self, rel: str, flags: int = 0) -> int:
        # O_NONBLOCK (the shared rule): opening a FIFO never waits for a writer (it is refused just after);
        # no symlink is followed, even one that stays inside: an artifact holds only what its writer wrote
        try:
            return self.folder.open_path(rel, flags, follow_inside=False)
        except UntrustedFileError as e:
            why = "it is a symlink" if e.reason == "symlink" else e.problem
            raise ArtifactCorruptError(f"{self.root}: {rel}: cannot open it ({why}); an artifact holds "
                                       "only regular files") from None

    def _open_file(self, rel: str, size: int) -> int:
        fd = self._open(rel)
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size != size:
            os.close(fd)
            if not stat.S_ISREG(st.st_mode):
                raise self._bad(rel, st.st_mode)
            raise ArtifactCorruptError(f"{self.root}: {rel} is {st.st_size} bytes, the manifest records {size}: "
                                       "truncated or corrupted")
        os.set_blocking(fd, True)
        return fd

    def read(self, rel: str, size: int) -> bytes:
        fd = self._open_file(rel, size)
        try:
            return _read_fd(fd, size, f"{self.root}: {rel}")  # a read error is already an ArtifactError there
        finally:
            os.close(fd)

    def sha256(self, rel: str, size: int) -> str:
        h, got = hashlib.sha256(), 0
        fd = self._open_file(rel, size)
        try:
            while got <= size:
                b = os.read(fd, min(_CHUNK, size + 1 - got))
                if not b:
                    break
                h.update(b)
                got += len(b)
        except OSError as e:
            raise ArtifactError(f"{self.root}: {rel}: cannot read it ({e.strerror})") from None
        finally:
            os.close(fd)
        if got != size:
            raise ArtifactCorruptError(f"{self.root}: {rel}: read {got} bytes, the manifest records {size}: "
                                       "truncated or changed while being read")
        return h.hexdigest()

    def span(self, rel: str) -> tuple[int, int, int]:
        """(descriptor, offset, length) of ``rel``: opened without following any symlink and checked to be a
        regular file. Read and map through this descriptor, never by name, so a file swapped in after the check
        is never seen; the container owns it and closes it in ``close``."""
        fd = self._open(rel)
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            raise self._bad(rel, st.st_mode)
        os.set_blocking(fd, True)
        self._spans.append(fd)
        return fd, 0, st.st_size

    def close(self):
        while self._spans:
            os.close(self._spans.pop())
        self.folder.close()
        self.fd = None


class ZipContainer:
    def __init__(self, path: str):
        self.path = path
        try:
            fd, size = open_regular(path, what="the zip")
        except UntrustedFileError as e:
            if e.reason == "not_regular":  # swapped since open_container looked
                raise ArtifactCorruptError(f"{path}: is {kind_of(e.mode)}, not a .zip file") from None
            raise ArtifactError(f"{path}: cannot read it ({e.problem})") from None
        self.file = os.fdopen(fd, "rb")
        self.size = size
        try:
            self.zf = zipfile.ZipFile(self.file)
            infos = self.zf.infolist()
        except Exception as e:  # noqa: BLE001 - zipfile raises many types on a malformed archive
            self.file.close()
            raise ArtifactCorruptError(f"{path}: neither an artifact directory nor a readable zip file ({e}); "
                                       "truncated or corrupted") from None
        try:
            self.infos = self._check(infos)
        except BaseException:
            self.close()
            raise

    def _check(self, infos) -> dict:
        if len(infos) > _MAX_ENTRIES:
            raise ArtifactCorruptError(f"{self.path}: the zip lists {len(infos)} entries; not an artifact")
        names = [i.filename for i in infos if not i.is_dir()]
        if len(names) != len(set(names)):
            raise ArtifactCorruptError(f"{self.path}: the zip lists an entry twice; refusing an ambiguous artifact")
        out = {}
        for i in infos:
            if i.is_dir():
                continue
            where = f"{self.path}: {i.filename}"
            if i.compress_type != zipfile.ZIP_STORED:
                raise ArtifactCorruptError(f"{where} is compressed (zip method {i.compress_type}); artifacts store "
                                           "every entry uncompressed, as tpu-export writes them. Re-zip with "
                                           "`zip -0` or save the artifact with tpu-export")
            if i.flag_bits & 0x1:
                raise ArtifactCorruptError(f"{where} is encrypted; artifacts are never encrypted")
            if i.compress_size != i.file_size or not 0 <= i.header_offset <= self.size - 30 - i.file_size:
                raise ArtifactCorruptError(f"{where}: its recorded sizes ({i.compress_size} stored, {i.file_size} "
                                           f"bytes) do not fit the {self.size}-byte zip; truncated or corrupted")
            out[i.filename] = i
        return out

    def listing(self) -> dict[str, int]:
        return {n: i.file_size for n, i in self.infos.items()}

    def _check_size(self, rel: str, size: int):
        info = self.infos[rel]
        if info.file_size != size:
            raise ArtifactCorruptError(f"{self.path}: {rel} is {info.file_size} bytes, the manifest records {size}: "
                                       "truncated or corrupted")
        return info

    def read(self, rel: str, size: int) -> bytes:
        info = self._check_size(rel, size)
        try:
            with self.zf.open(info) as f:
                data = f.read(size + 1)
        except Exception as e:  # noqa: BLE001 - zipfile's checks (local header, CRC) raise several types
            raise ArtifactCorruptError(f"{self.path}: {rel}: unreadable ({e}); truncated or corrupted") from None
        if len(data) != size:
            raise ArtifactCorruptError(f"{self.path}: {rel}: read {len(data)} bytes, the manifest records {size}: "
                                       "truncated or corrupted")
        return data

    def sha256(self, rel: str, size: int) -> str:
        info = self._check_size(rel, size)
        h = hashlib.sha256()
        try:
            with self.zf.open(info) as f:
                for chunk in iter(lambda: f.read(_CHUNK), b""):
                    h.update(chunk)
        except Exception as e:  # noqa: BLE001 - zipfile checks each entry's CRC32 as it reads
            raise ArtifactCorruptError(f"{self.path}: {rel}: unreadable ({e}); truncated or corrupted") from None
        return h.hexdigest()

    def span(self, rel: str) -> tuple[int, int, int]:
        """(descriptor, offset, length) of a stored entry's bytes, checked to lie inside the file: the zip's own
        open descriptor, owned by the container (read and map through it, never by name)."""
        info = self.infos[rel]
        self.file.seek(info.header_offset)
        local = self.file.read(30)
        if len(local) < 30 or local[:4] != b"PK\x03\x04":
            raise ArtifactCorruptError(f"{self.path}: {rel}: bad local header; truncated or corrupted")
        name_len, extra_len = struct.unpack("<HH", local[26:30])
        start = info.header_offset + 30 + name_len + extra_len
        if start + info.file_size > self.size:
            raise ArtifactCorruptError(f"{self.path}: {rel}: its bytes run past the end of the zip; truncated")
        return self.file.fileno(), start, info.file_size

    def close(self):
        if getattr(self, "zf", None) is not None:
            self.zf.close()
        self.file.close()
