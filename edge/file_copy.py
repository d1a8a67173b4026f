"""Copying a large file into another one without a second copy in the page cache: ``copy_direct`` appends a file
written moments ago (still cached) to an open output by O_DIRECT, so the disk reads the blocks from the cache the
first write left instead of the kernel copying them into new cache pages (the .litertlm bundle's copy of a multi-GB
.tflite, edge/litertlm.py)."""

from __future__ import annotations

import os

__all__ = ["copy_direct"]

_BLOCK = 4096  # O_DIRECT's unit for offsets, lengths and addresses on common filesystems


def copy_direct(src: str, stream) -> int:
    """Append the file ``src`` to the binary file ``stream`` (left at its end); returns the bytes that went by
    O_DIRECT. Its whole 4 KiB blocks are written with O_DIRECT from a read-only map of ``src``: the disk reads them
    from the page cache the .tflite was just written into, where sendfile copies them into new cache pages first
    (the 3.2 GB .tflite of a 0.84 B Llama: 3-4.5 s of CPU and 6.4 s of wall by sendfile, 0.5 s and 3.1 s so, on this
    host's ext4; the write_file's fsync then has nothing left to write). The tail, and everything where the stream's
    position is not block-aligned or the filesystem refuses O_DIRECT (tmpfs), goes through the stream as before."""
    import contextlib
    import mmap
    import shutil

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
                    while done < blocks:
                        piece = view[done:min(blocks, done + (64 << 20))]
                        try:
                            k = os.pwrite(fd, piece, at + done)
                        except OSError:
                            if done:
                                raise
                            break  # refused at once (EINVAL: no O_DIRECT here): the stream copies it all
                        finally:
                            piece.release()
                        if k <= 0 or k % _BLOCK:
                            raise OSError(f"O_DIRECT write of {src} into the bundle stopped at {done + k} bytes")
                        # the write mapped those pages into this process: unmap them (they stay cached), or the
                        # whole file counts in its resident size (0.75 -> 3.8 GB peak RSS for the 0.84 B Llama)
                        with contextlib.suppress(OSError, ValueError):  # (ValueError: pages past 4 KiB)
                            m.madvise(mmap.MADV_DONTNEED, done, k)
                        done += k
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
