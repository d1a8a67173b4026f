"""The one rule for reading a file a user hands us (a model directory's files, a shard index's shards, ONNX
external data, an artifact's files, a .tflite): nothing in it is trusted, not even what kind of file it is.

- regular files only: a FIFO, a device, a socket or a directory is refused (``/dev/zero`` never ends, a FIFO
  never answers); every open is ``O_NONBLOCK``, so a FIFO is refused at once instead of waiting for a writer;
- inside a folder (``root=``, or a ``Folder``) a file is opened relative to the folder's descriptor one path
  component at a time with ``O_NOFOLLOW``: a symlink is followed only when its target stays inside the folder
  (checked on the real path, then opened without following anything), a name with ``..`` or an absolute path is
  refused, and a component swapped for a symlink after the check is refused too. The path the user names
  itself may be a symlink: that is their choice, not the file's;
- the size is checked (``fstat``) against a cap before a byte is read, and a read returns at most the size
  seen (one byte more is asked for only to see that the file grew).

Every refusal is an ``UntrustedFileError``: one line, the file, what is wrong, the fix. ``reason`` says which
rule it broke, for callers that word it in their own error class. The caps are ``LIMITS``; each can be raised
for one process with the environment variable ``TPU_EXPORT_MAX_<NAME>_BYTES`` (``limit``).
"""

from __future__ import annotations

import errno
import json
import os
import stat

__all__ = ["LIMITS", "UntrustedFileError", "Folder", "kind_of", "limit", "open_regular", "read_bytes",
           "pread_exact", "pread_into", "read_exact", "read_json", "read_text"]

_CHUNK = 1 << 20
_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)

# the largest file of each kind a real model comes near, with room to spare
LIMITS = {
    "json": 64 << 20,  # config.json, generation_config.json, tokenizer_config.json, an index, special tokens
    "tokenizer": 512 << 20,  # tokenizer.json (the largest vocabularies are ~30 MB)
    "template": 4 << 20,  # chat_template.jinja
    "safetensors_header": 100 << 20,  # the safetensors format's own cap
    "fold": 1 << 30,  # one constant an ONNX graph folds at build time
}

_KINDS = ((stat.S_ISLNK, "a symlink"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory"))


class UntrustedFileError(ValueError):
    """A user's file broke the rule. ``reason``: missing, escapes, symlink, not_regular, too_large, unreadable,
    changed or malformed; ``path`` the file as named."""

    def __init__(self, path: str, problem: str, fix: str, *, reason: str, mode: int | None = None):
        self.path, self.problem, self.fix, self.reason, self.mode = path, problem, fix, reason, mode
        super().__init__(f"{path}: {problem}. Fix: {fix}")


def kind_of(mode: int) -> str:
    """'a FIFO', 'a symlink', ... for a st_mode that is not a regular file's."""
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def limit(name: str) -> int:
    """The cap ``LIMITS[name]``, or ``$TPU_EXPORT_MAX_<NAME>_BYTES`` where set (a positive integer)."""
    env = f"TPU_EXPORT_MAX_{name.upper()}_BYTES"
    v = os.environ.get(env)
    if v is None:
        return LIMITS[name]
    try:
        n = int(v)
    except ValueError:
        n = 0
    if n <= 0:
        raise ValueError(f"{env}={v!r} is not a positive number of bytes; unset it or give one (e.g. {LIMITS[name]})")
    return n


def _env_of(cap_name: str | None) -> str:
    return f"; or raise the cap with TPU_EXPORT_MAX_{cap_name.upper()}_BYTES" if cap_name else ""


def _subject(what: str | None) -> str:
    """'the shard ' before 'is a FIFO'; nothing where the message's path already says which file."""
    return f"{what} " if what else ""


def _not_regular(path: str, mode: int, what: str) -> UntrustedFileError:
    return UntrustedFileError(path, f"{_subject(what)}is {kind_of(mode)}, not a regular file", "put the real file "
                              "there (a FIFO or device never ends or never answers; it is never read)",
                              reason="not_regular", mode=mode)


def _regular_fd(fd: int, path: str, what: str, max_bytes: int | None, cap_name: str | None) -> int:
    """``fd`` checked to be a regular file within ``max_bytes``, made blocking again; closed on refusal."""
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _not_regular(path, st.st_mode, what)
        if max_bytes is not None and st.st_size > max_bytes:
            raise UntrustedFileError(path, f"{_subject(what)}is {st.st_size} bytes, more than the {max_bytes} this "
                                     "tool reads for it", f"check it is the right file{_env_of(cap_name)}",
                                     reason="too_large")
        os.set_blocking(fd, True)
        return fd
    except BaseException:
        os.close(fd)
        raise


def _split(rel: str, shown: str) -> list[str]:
    parts = rel.split("/")
    if not rel or os.path.isabs(rel) or any(p in ("", ".", "..") for p in parts) or "\\" in rel or "\0" in rel:
        raise UntrustedFileError(shown, f"the name {rel!r} is not a plain path inside the folder (an absolute path, "
                                 "'..', or an empty part)", "name a file inside the folder, e.g. 'model.safetensors'",
                                 reason="escapes")
    return parts


class Folder:
    """A folder the user gave, read from relative to its descriptor (see the module doc). A context manager."""

    def __init__(self, path, *, what: str = "the folder"):
        self.path = os.fspath(path)
        try:
            self.real = os.path.realpath(self.path)
            self.fd = os.open(self.real, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
        except FileNotFoundError:
            raise UntrustedFileError(self.path, f"{what} does not exist", "give an existing directory",
                                     reason="missing") from None
        except OSError as e:
            raise UntrustedFileError(self.path, f"{what} cannot be opened as a directory ({e.strerror})",
                                     "give a readable directory", reason="unreadable") from None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def shown(self, rel: str) -> str:
        return os.path.join(self.path, rel)

    def lstat(self, rel: str):
        """The entry's own stat (a symlink is not followed), or None when there is none."""
        parts = _split(rel, self.shown(rel))
        try:
            if len(parts) == 1:
                return os.stat(parts[0], dir_fd=self.fd, follow_symlinks=False)
            fd = self.open_path("/".join(parts[:-1]), os.O_DIRECTORY)
            try:
                return os.stat(parts[-1], dir_fd=fd, follow_symlinks=False)
            finally:
                os.close(fd)
        except FileNotFoundError:
            return None
        except UntrustedFileError as e:
            if e.reason == "missing":
                return None
            raise

    def exists(self, rel: str) -> bool:
        return self.lstat(rel) is not None

    def _inside(self, rel: str) -> str:
        """``rel`` with a symlink among its components resolved, refused unless the target stays inside."""
        real = os.path.realpath(os.path.join(self.real, rel))
        if os.path.commonpath([self.real, real]) != self.real or real == self.real:
            raise UntrustedFileError(self.shown(rel), f"is a symlink to {real}, outside the folder {self.path}",
                                     "copy the real file into the folder in place of the link (a model directory "
                                     "is read only from inside itself)", reason="escapes")
        return os.path.relpath(real, self.real)

    def open_path(self, rel: str, flags: int = 0, *, follow_inside: bool = True) -> int:
        """A descriptor of ``rel`` (O_NOFOLLOW at every component from the folder's descriptor, non-blocking).
        ``follow_inside``: a symlink whose target stays inside the folder is opened at its target; False: any
        symlink is refused."""
        shown = self.shown(rel)
        parts = _split(rel, shown)
        try:
            return self._walk(parts, flags)
        except OSError as e:
            if e.errno == errno.ENOENT:
                raise UntrustedFileError(shown, "no such file", "put the file there, or fix the name that points "
                                         "to it", reason="missing") from None
            if e.errno not in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
                raise UntrustedFileError(shown, f"cannot be opened ({e.strerror})", "make it readable",
                                         reason="unreadable") from None
        if not follow_inside:
            raise UntrustedFileError(shown, "is a symlink (or a path through one)", "copy the real file in its "
                                     "place", reason="symlink")
        target = self._inside(rel)
        try:
            return self._walk(target.split("/"), flags)
        except OSError as e:  # the target changed since it was resolved, or is itself unreadable
            why = "it changed while being opened" if e.errno in (errno.ELOOP, errno.ENOTDIR) else e.strerror
            raise UntrustedFileError(shown, f"cannot be opened ({why})", "copy the real file in its place",
                                     reason="symlink" if e.errno == errno.ELOOP else "unreadable") from None

    def _walk(self, parts: list[str], flags: int) -> int:
        dfd = self.fd
        try:
            for i, part in enumerate(parts):
                f = _FLAGS | (flags if i == len(parts) - 1 else os.O_DIRECTORY)
                fd = os.open(part, f, dir_fd=dfd)
                if dfd != self.fd:
                    os.close(dfd)
                dfd = fd
            return dfd
        except BaseException:
            if dfd != self.fd:
                os.close(dfd)
            raise

    def open(self, rel: str, *, what: str | None = None, max_bytes: int | None = None,
             cap_name: str | None = None, follow_inside: bool = True) -> tuple[int, int]:
        """(blocking descriptor, size) of the regular file ``rel`` within ``max_bytes``; the caller closes it."""
        fd = self.open_path(rel, follow_inside=follow_inside)
        fd = _regular_fd(fd, self.shown(rel), what, max_bytes, cap_name)
        return fd, os.fstat(fd).st_size

    def read_bytes(self, rel: str, *, max_bytes: int, cap_name: str | None = None, what: str | None = None) -> bytes:
        fd, size = self.open(rel, what=what, max_bytes=max_bytes, cap_name=cap_name)
        try:
            return read_exact(fd, size, self.shown(rel))
        finally:
            os.close(fd)

    def read_text(self, rel: str, *, max_bytes: int, cap_name: str | None = None, what: str | None = None) -> str:
        return _decode(self.read_bytes(rel, max_bytes=max_bytes, cap_name=cap_name, what=what), self.shown(rel))

    def read_json(self, rel: str, *, max_bytes: int | None = None, what: str | None = None):
        cap = "json" if max_bytes is None else None
        text = self.read_text(rel, max_bytes=limit("json") if max_bytes is None else max_bytes, cap_name=cap,
                              what=what)
        return _parse_json(text, self.shown(rel))


def read_exact(fd: int, size: int, path: str) -> bytes:
    """Exactly ``size`` bytes from ``fd``; one byte more is asked for only to see that the file grew."""
    parts, left = [], size + 1
    try:
        while left:
            b = os.read(fd, min(left, _CHUNK))
            if not b:
                break
            parts.append(b)
            left -= len(b)
    except OSError as e:
        raise UntrustedFileError(path, f"cannot be read ({e.strerror})", "make it readable",
                                 reason="unreadable") from None
    data = b"".join(parts)
    if len(data) != size:
        err = UntrustedFileError(path, f"read {len(data)}{'+' if len(data) > size else ''} bytes where {size} "
                                 "were expected: truncated or changed while being read", "leave the file alone "
                                 "while it is read", reason="changed")
        err.got = len(data)
        raise err
    return data


# Linux moves at most this many bytes in one read or pread call (a 2.8 GB tensor takes two)
_MAX_IO = 0x7FFFF000


def pread_into(fd: int, buf, offset: int) -> int:
    """Fill ``buf`` (a writable buffer) from ``fd`` at ``offset``, in as many preadv calls as its size needs;
    returns the bytes read, less than ``len(buf)`` only at the end of the file."""
    view, got = memoryview(buf).cast("B"), 0
    while got < len(view):
        n = os.preadv(fd, [view[got:got + _MAX_IO]], offset + got)
        if n == 0:
            break
        got += n
    return got


def pread_exact(fd: int, offset: int, length: int) -> bytes:
    """``length`` bytes of ``fd`` at ``offset`` (fewer only at the end of the file), past the per-call cap too."""
    if length <= _MAX_IO:
        return os.pread(fd, length, offset) if length else b""
    buf = bytearray(length)
    return bytes(memoryview(buf)[:pread_into(fd, buf, offset)])


def open_regular(path, *, root=None, what: str = "the file", max_bytes: int | None = None,
                 cap_name: str | None = None) -> tuple[int, int]:
    """(blocking descriptor, size) of a regular file, non-blocking while opened and checked. ``root``: ``path``
    is a name inside that folder (the Folder rule); without it ``path`` is the user's own name for the file."""
    if root is not None:
        with Folder(root) as d:
            return d.open(os.fspath(path), what=what, max_bytes=max_bytes, cap_name=cap_name)
    path = os.fspath(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise UntrustedFileError(path, f"{what}: no such file", "give the path of an existing file",
                                 reason="missing") from None
    except OSError as e:
        raise UntrustedFileError(path, f"{what} cannot be opened ({e.strerror})", "make it readable",
                                 reason="unreadable") from None
    fd = _regular_fd(fd, path, what, max_bytes, cap_name)
    return fd, os.fstat(fd).st_size


def read_bytes(path, *, max_bytes: int, root=None, what: str = "the file", cap_name: str | None = None) -> bytes:
    """The bytes of a regular file of at most ``max_bytes`` (see open_regular)."""
    fd, size = open_regular(path, root=root, what=what, max_bytes=max_bytes, cap_name=cap_name)
    try:
        return read_exact(fd, size, os.fspath(path) if root is None else os.path.join(os.fspath(root), path))
    finally:
        os.close(fd)


def _decode(data: bytes, path: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UntrustedFileError(path, f"is not UTF-8 text (byte {e.start})", "save it as UTF-8",
                                 reason="malformed") from None


def _parse_json(text: str, path: str):
    try:
        return json.loads(text)
    except ValueError as e:
        raise UntrustedFileError(path, f"is not valid JSON ({e})", "fix or regenerate the file",
                                 reason="malformed") from None
    except RecursionError:
        raise UntrustedFileError(path, "is JSON nested too deeply", "fix or regenerate the file",
                                 reason="malformed") from None


def read_text(path, *, max_bytes: int, root=None, what: str = "the file", cap_name: str | None = None) -> str:
    shown = os.fspath(path) if root is None else os.path.join(os.fspath(root), path)
    return _decode(read_bytes(path, max_bytes=max_bytes, root=root, what=what, cap_name=cap_name), shown)


def read_json(path, *, max_bytes: int | None = None, root=None, what: str = "the file"):
    """A JSON file's value, at most ``max_bytes`` (default: the ``json`` cap)."""
    shown = os.fspath(path) if root is None else os.path.join(os.fspath(root), path)
    cap = "json" if max_bytes is None else None
    text = read_text(path, max_bytes=limit("json") if max_bytes is None else max_bytes, root=root, what=what,
                     cap_name=cap)
    return _parse_json(text, shown)
