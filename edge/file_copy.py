"""Copying a large file into another one without a second copy in the page cache: ``copy_direct`` appends a file
written moments ago (still cached) to an open output by O_DIRECT, so the disk reads the blocks from the cache the
first write left instead of the kernel copying them into new cache pages (the .litertlm bundle's copy of a multi-GB
.tflite, edge/litertlm.py)."""

from __future__ import annotations

import os

__all__ = ["copy_direct"]

_BLOCK = 4096  # O_DIRECT's unit for offsets, lengths and addresses on common filesystems
# pieces in flight at once: one synchronous O_DIRECT write at a time leaves the disk idle between them (3.2 GB on
# this host's virtio disk: 2.9 s one 64 MiB piece at a time, 1.7 s four 16 MiB pieces at a time, 1.7 s eight of 8)
_PIECE = 16 << 20
_THREADS = 4


def _write_blocks(fd: int, view, m, lo: int, hi: int, at: int) -> None:
    """Write ``view[lo:hi]`` at ``at + lo`` of the O_DIRECT descriptor ``fd``, then unmap those pages of ``m``."""
    import contextlib
    import mmap

    pos = lo
    while pos < hi:
        piece = view[pos:hi]
        try:
            k = os.pwrite(fd, piece, at + pos)
        finally:
            piece.release()
        if k <= 0 or k % _BLOCK:
            raise OSError(f"an O_DIRECT write stopped after {pos - lo + max(k, 0)} of {hi - lo} bytes")
        pos += k
    # the write mapped those pages into this process: unmap them (they stay cached), or the whole file counts in
    # its resident size (0.75 -> 3.8 GB peak RSS for the 0.84 B Llama)
    with contextlib.suppress(OSError, ValueError):  # (ValueError: pages larger than 4 KiB)
        m.madvise(mmap.MADV_DONTNEED, lo, hi - lo)


def copy_direct(src: str, stream) -> int:
    """Append the file ``src`` to the binary file ``stream`` (left at its end); returns the bytes that went by
    O_DIRECT. Its whole 4 KiB blocks are written with O_DIRECT from a read-only map of ``src``, four 16 MiB pieces at
    a time: the disk reads them from the page cache the .tflite was just written into, where sendfile copies them
    into new cache pages first (the 3.2 GB .tflite of a 0.84 B Llama: 3-4.5 s of CPU and 6.4 s of wall by sendfile,
    under 0.5 s and 1.7 s so, on this host's ext4; the write_file's fsync then has nothing left to write). The tail,
    and everything where the stream's position is not block-aligned or the filesystem refuses O_DIRECT (tmpfs), goes
    through the stream as before."""
    import mmap
    import shutil
    from concurrent.futures import ThreadPoolExecutor

    stream.flush()
    at, n = stream.tell(), os.path.getsize(src)
    blocks = n - n % _BLOCK if at % _BLOCK == 0 else 0
    done = 0
    fd = -1
    if blocks:
        try:  # a second descriptor of the same file, for O_DIRECT (the stream's own is buffered)
            fd = os.open(f"/proc/self/fd/{stream.fileno()}", os.O_WRONLY | getattr(os, "O_DIRECT", 0) | os.O_CLOEXEC)
        except (OSError, AttributeError, ValueError):
            fd = -1
    if fd >= 0:
        try:
            with open(src, "rb") as f, mmap.mmap(f.fileno(), n, access=mmap.ACCESS_READ) as m:
                view = memoryview(m)
                try:
                    first = min(blocks, _PIECE)
                    try:
                        _write_blocks(fd, view, m, 0, first, at)
                        done = first
                    except OSError:
                        pass  # refused (EINVAL: no O_DIRECT here): the stream copies it all, over anything written
                    if done:
                        with ThreadPoolExecutor(_THREADS) as pool:  # os.pwrite lets go of the GIL
                            for job in [pool.submit(_write_blocks, fd, view, m, lo, min(blocks, lo + _PIECE), at)
                                        for lo in range(first, blocks, _PIECE)]:
                                job.result()
                        done = blocks
                finally:
                    view.release()
        finally:
            os.close(fd)
    stream.seek(at + done)
    stream.flush()
    with open(src, "rb") as f:
        pos = done
        try:  # as the builder copies: sendfile, which moves the stream's descriptor (its tell() asks the descriptor)
            while pos < n:
                k = os.sendfile(stream.fileno(), f.fileno(), pos, n - pos)
                if k <= 0:
                    break
                pos += k
        except OSError:
            stream.seek(at + pos)
        if pos < n:
            f.seek(pos)
            shutil.copyfileobj(f, stream, 1 << 20)
    return done
