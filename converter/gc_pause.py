"""Pause Python's cyclic garbage collector for the length of a conversion.

A conversion allocates a few hundred thousand objects (torch.export's tracer, fake tensors, FX
graphs) on top of the millions torch and its tracer import; each full collection the allocations
trigger walks all of them, which costs 0.3-0.5 s per conversion here (20-25% of it). Reference
counting still frees everything acyclic; cyclic garbage waits until the block ends and the
collector resumes on its own schedule. The previous state is restored even on error, and nested
pauses are no-ops.
"""

from __future__ import annotations

import contextlib
import gc

__all__ = ["gc_paused"]


@contextlib.contextmanager
def gc_paused():
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
