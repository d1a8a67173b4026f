"""Progress for the steps that take minutes (a TPU compile, a large export): a heartbeat that says the step
is still running and for how long, so a long conversion is never a silent one.

    with heartbeat(say, "tpu-v6e: AOT-compiling for 2x2 with libtpu"):
        bundle.compile_for(...)

``say`` is the caller's progress callback (the CLI prints each line to stderr; ``tpu_export.convert``'s
``progress=``); None says nothing. Lines come from a daemon thread every ``every`` seconds, then one line
with the step's total time when it ends. A callback with a ``beat(what, seconds)`` method takes the beats
itself (the CLI redraws one status line on a terminal instead of printing a line per beat).
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Callable

__all__ = ["heartbeat", "HEARTBEAT_S"]

HEARTBEAT_S = 10.0  # often enough that a waiting user sees movement, rare enough not to flood a log


@contextlib.contextmanager
def heartbeat(say: Callable[[str], None] | None, what: str, every: float | None = None):
    """Say ``what`` now, ``what: N s`` every ``every`` seconds while the block runs, and ``what: done in N s``
    (or ``failed after N s``) when it ends. ``every`` None: the callback's own ``every`` where it has one, else
    HEARTBEAT_S."""
    if every is None:
        every = getattr(say, "every", None) or HEARTBEAT_S
    if say is None:
        yield
        return
    t0 = time.monotonic()
    stop = threading.Event()
    take_beat = getattr(say, "beat", None)

    def beat():
        while not stop.wait(every):
            if callable(take_beat):
                take_beat(what, time.monotonic() - t0)
            else:
                say(f"{what}: {time.monotonic() - t0:.0f} s")

    say(what)
    thread = threading.Thread(target=beat, name="tpu-export-heartbeat", daemon=True)
    thread.start()
    ok = False
    try:
        yield
        ok = True
    finally:
        stop.set()
        thread.join()
        took = time.monotonic() - t0
        say(f"{what}: done in {took:.1f} s" if ok else f"{what}: failed after {took:.1f} s")
