"""The one atomic writer: every file and directory we publish lands whole, or not at all.

- ``write_file(path, data)``: a uniquely named temp file in the same folder, created with the umask's
  mode (not mkstemp's 0600), fsync, rename into place, fsync the folder. A full disk (or quota) is a
  one-line ``DiskFullError`` naming ``path``, with the temp file removed.
- ``staging_dir(target)``: a uniquely named folder beside ``target`` (``.<name>.tmp-<pid>-*``)
  to build a directory in; ``publish_dir(stage, target)`` puts it at ``target``.
- A directory publish swaps the two names in one step (Linux ``renameat2(RENAME_EXCHANGE)``), so a
  kill at any instant leaves the old or the new directory at ``target``. Where the exchange is not
  available it moves the old one aside first (``.<name>.old-<pid>-*``); a kill between the two
  renames then leaves no ``target``, and the next ``recover(target)`` (every publish runs it first)
  puts the old one back. Leftover staging folders of dead processes are removed the same way;
  those of live processes are left alone, so two conversions into one folder never collide.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import re
import secrets
import shutil

__all__ = ["DiskFullError", "write_file", "staging_dir", "publish_dir", "recover", "discard", "fsync_dir"]

_FULL = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)}


class DiskFullError(OSError):
    """The filesystem ran out of space (or quota) while a file was written; nothing is left at its path."""

    def __init__(self, path: str, err: int):
        what = "the disk quota is exceeded" if err != errno.ENOSPC else "no space left on the device"
        super().__init__(err, f"{path}: {what} while writing it; nothing was written there. Fix: free space on "
                              f"the filesystem of {os.path.dirname(path) or '.'} or write elsewhere")
        self.path = path

    def __str__(self) -> str:
        return self.strerror

_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems refuse fsync on a directory; the rename is still atomic
    finally:
        os.close(fd)


def _tag(target: str, kind: str) -> str:
    return f".{os.path.basename(target)}.{kind}-{os.getpid()}-"


def _fresh(parent: str, prefix: str, create):
    """``create(path)`` at a new, unique ``parent/prefix<random>``; (path, what create returned).

    Files and folders are created with mode 0o666 / 0o777 and the kernel applies the umask: no
    os.umask set-and-restore, which would change the mode of files other threads create meanwhile."""
    while True:
        path = os.path.join(parent, prefix + secrets.token_hex(4))
        try:
            return path, create(path)
        except FileExistsError:
            continue


def _new_file(path: str) -> int:
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)


def write_file(path, data) -> str:
    """Write ``data`` (bytes, or a callable taking the open binary file) to ``path`` atomically."""
    path = os.path.abspath(os.fspath(path))
    folder = os.path.dirname(path)
    tmp, fd = _fresh(folder, _tag(path, "tmp"), _new_file)
    try:
        with os.fdopen(fd, "wb") as f:
            if callable(data):
                data(f)
            else:
                f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        if isinstance(e, OSError) and e.errno in _FULL and not isinstance(e, DiskFullError):
            raise DiskFullError(path, e.errno) from None
        raise
    fsync_dir(folder)
    return path


def staging_dir(target) -> str:
    """A fresh folder beside ``target`` (same filesystem, so publishing is a rename)."""
    target = os.path.abspath(os.fspath(target))
    parent = os.path.dirname(target)
    os.makedirs(parent, exist_ok=True)
    recover(target)
    root, _ = _fresh(parent, _tag(target, "tmp"), lambda p: os.mkdir(p, 0o777))
    return root


def discard(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            os.remove(path)


def _exchange(a: str, b: str) -> bool:
    """Swap two existing paths atomically; False where the OS or filesystem cannot."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV):
        return False
    raise OSError(err, os.strerror(err), b)


def publish_dir(stage: str, target, *, keep_old: bool = False) -> str | None:
    """Put the staged folder at ``target``, replacing what is there; ``stage`` is consumed.

    The replaced content is deleted, or with ``keep_old`` moved to the returned path (None when
    nothing was there) so that a caller publishing several folders can put it back."""
    target = os.path.abspath(os.fspath(target))
    for d, _, _ in os.walk(stage):
        fsync_dir(d)
    recover(target)
    parent = os.path.dirname(target)
    old = None
    if not os.path.lexists(target):
        os.rename(stage, target)
    elif _exchange(stage, target):
        old = stage  # now holds the replaced content
    else:
        old, _ = _fresh(parent, _tag(target, "old"), lambda p: os.mkdir(p, 0o777))
        os.rmdir(old)
        os.rename(target, old)
        try:
            os.rename(stage, target)
        except BaseException:
            os.rename(old, target)
            raise
    fsync_dir(parent)
    if old is not None and not keep_old:
        discard(old)
        return None
    return old


_LEFTOVER = re.compile(r"\.(?P<name>.+)\.(?P<kind>tmp|old)-(?P<pid>\d+)-[^/]*$")


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def recover(target) -> None:
    """Undo what a killed publish of ``target`` left behind (see the module doc)."""
    target = os.path.abspath(os.fspath(target))
    parent, base = os.path.split(target)
    try:
        names = os.listdir(parent)
    except OSError:
        return
    olds, tmps = [], []
    for n in names:
        m = _LEFTOVER.match(n)
        if m is None or m.group("name") != base or _alive(int(m.group("pid"))):
            continue
        (olds if m.group("kind") == "old" else tmps).append(os.path.join(parent, n))
    if olds and not os.path.lexists(target):
        # killed between the two renames: the newest aside copy is the artifact that was there
        olds.sort(key=os.path.getmtime)
        os.rename(olds.pop(), target)
    for p in olds + tmps:
        discard(p)
