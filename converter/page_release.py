"""Pages of our own weight maps given back once read: ``release_pages(tensor)``.

converter.safetensors_weights maps a model directory's shards (``map_safetensors``) and lazy_weights a spool
(``materialize``) privately; a weight read from such a map pages in and would stay resident (RssFile) for the
process's life. The TPU artifact reads every weight twice after lowering (the program's fingerprint, then
weights.safetensors); each read releases the pages it is done with, so the process holds about one tensor of
weights at a time.
"""

from __future__ import annotations

import mmap
import os

import numpy as np
import torch

__all__ = ["release_pages", "release_span"]

_PAGE = mmap.PAGESIZE
_PM_PRESENT, _PM_SWAPPED, _PM_FILE = 1 << 63, 1 << 62, 1 << 61  # /proc/<pid>/pagemap entry bits
_MADV_PAGEOUT = getattr(mmap, "MADV_PAGEOUT", 21)  # Linux >= 5.4; Python's mmap names it only from 3.13 on


def release_pages(tensor) -> bool:
    """Give back the pages of one of OUR private maps (a spool, a mapped safetensors shard) that ``tensor``'s bytes
    lie in, once they have been read: they leave this process's RSS and are read from the file again if used.
    Returns True when released; False, touching nothing, for anything else (a user's tensor, a folded weight in
    anonymous memory) and for a range where any map page was ever written.

    Why it is safe: the maps are private (ACCESS_COPY), so writing a parameter in place (``p.add_(1)``) copies
    that page into anonymous memory, and MADV_DONTNEED on it would silently bring back the file's old bytes. So
    before any madvise the range's pages are looked up in /proc/self/pagemap, and the release is refused if any
    is resident but not a file page (copied on write) or swapped out (only anonymous pages swap): only
    never-written file pages are dropped. Where pagemap cannot be read, MADV_PAGEOUT is asked instead: it
    reclaims clean file pages and never discards data (an anonymous page stays, or goes to swap). Boundary pages
    shared with a neighbouring tensor are checked (and released) with it. Meant for the one thread reading the
    weights (the fingerprint's hash, the artifact's weight loop): a write racing with the check is not seen."""
    from .lazy_weights import spool_holding

    addr, n = _extent(tensor)
    sp = spool_holding(addr, n)
    return sp is not None and sp.release(addr, n)


def release_span(sp, lo: int, hi: int) -> bool:
    """Release bytes [lo, hi) (page-aligned ``lo``) of the map of spool ``sp`` under the rule above; True when
    released, False (nothing touched) when a page of it was ever written or madvise is not available."""
    clean = _never_written(sp.base + lo, hi - lo)
    if clean is False:
        return False
    try:
        sp.map.madvise(mmap.MADV_DONTNEED if clean else _MADV_PAGEOUT, lo, hi - lo)
    except (OSError, ValueError):  # no madvise here: the pages go with the map
        return False
    return True


def _extent(t) -> tuple[int, int]:
    """(first byte's address, bytes spanned) of a CPU tensor (strided views included), an ndarray or a memoryview."""
    if isinstance(t, memoryview):
        t = np.frombuffer(t, np.uint8) if t.nbytes else None
    if isinstance(t, np.ndarray):
        return (t.__array_interface__["data"][0], t.nbytes) if t.nbytes and t.flags.c_contiguous else (0, 0)
    if not isinstance(t, torch.Tensor) or t.is_meta or t.device.type != "cpu" or not t.numel():
        return 0, 0
    if any(s < 0 for s in t.stride()):
        return 0, 0
    span = 1 + sum((d - 1) * s for d, s in zip(t.shape, t.stride()))
    return t.data_ptr(), span * t.element_size()


def _never_written(addr: int, nbytes: int) -> bool | None:
    """Whether every page of [addr, addr + nbytes) (page-aligned) is a file page or not resident: never copied
    on write. None when /proc/self/pagemap cannot be read (not Linux, a kernel without it)."""
    pages = -(-nbytes // _PAGE)
    try:
        fd = os.open("/proc/self/pagemap", os.O_RDONLY)
    except OSError:
        return None
    try:
        chunk = 1 << 16  # pages per read: 512 KiB of entries
        for first in range(0, pages, chunk):
            k = min(chunk, pages - first)
            raw = os.pread(fd, 8 * k, (addr // _PAGE + first) * 8)
            if len(raw) != 8 * k:
                return None
            v = np.frombuffer(raw, "<u8")
            present, swapped, file = ((v & np.uint64(bit)) != 0 for bit in (_PM_PRESENT, _PM_SWAPPED, _PM_FILE))
            if (swapped | (present & ~file)).any():
                return False
        return True
    except OSError:
        return None
    finally:
        os.close(fd)
