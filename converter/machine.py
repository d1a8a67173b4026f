"""What this machine can give a conversion: the one reader of available memory (stdlib only)."""

from __future__ import annotations

import os

__all__ = ["mem_available", "memory_budget", "physical_memory"]


def mem_available() -> int | None:
    """Bytes of memory the kernel says can be given now without swapping (/proc/meminfo's MemAvailable), or
    None where that is not known (not Linux, or an unreadable /proc)."""
    try:
        with open("/proc/meminfo", "rb") as f:
            for line in f.read(1 << 16).splitlines():
                if line.startswith(b"MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def physical_memory() -> int | None:
    """Bytes of physical memory, or None where the system does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (OSError, ValueError, AttributeError):
        return None


def memory_budget() -> int:
    """MemAvailable, else the physical memory, else 16 GiB: a bound for sizes checked before allocating."""
    for bound in (mem_available(), physical_memory()):
        if bound is not None:
            return bound
    return 16 << 30
