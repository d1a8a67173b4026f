"""Keep Python's cyclic garbage collector out of the way for the length of a conversion.

A conversion allocates a few hundred thousand objects (torch.export's tracer, fake tensors, FX
graphs) on top of the millions torch imports; each full collection the allocations trigger walks
all of them: 0.3-0.5 s per conversion here (20-25% of it). So the collector is paused, and
reference counting still frees everything acyclic.

When the collector resumes, its first young collection walks every object made during the pause.
Most of those (~270 K of ~300 K for a BERT encoder) are torch.export's tracer, imported on the
first conversion of a process: modules, classes and functions that live as long as the process.
They are imported inside the pause and then, with everything older, moved to the collector's
permanent generation (``gc.freeze``) until the conversion ends (``gc.unfreeze`` returns them to
the oldest generation), so that walk covers only what the conversion itself left: 0.1 s less.
Cyclic garbage made before or during the conversion is collected as usual afterwards.

The previous state is restored even on error; nested pauses are no-ops; a process that froze
objects itself (``gc.get_freeze_count() > 0``) keeps its freeze and gets the plain pause.
"""

from __future__ import annotations

import contextlib
import gc

__all__ = ["gc_paused"]


@contextlib.contextmanager
def gc_paused():
    was_enabled = gc.isenabled()
    gc.disable()
    froze = False
    try:
        if was_enabled and gc.get_freeze_count() == 0:
            from ._torch_compat import preload_export_tracer

            preload_export_tracer()  # imported once per process, so it is frozen with the rest
            gc.freeze()
            froze = True
        yield
    finally:
        if froze:
            gc.unfreeze()
        if was_enabled:
            gc.enable()
