"""libtpu on a host with no TPU attached: the environment it needs before jax starts.

jax initialises every installed PJRT plugin on its first backend use (the first array, export or
compile), libtpu included. On a CPU-only host libtpu then prints "could not determine TPU worker
hostnames / accelerator type" errors and keeps ``/tmp/libtpu_lockfile`` until the process exits,
which makes a second jax process unable to describe a TPU slice. Well-formed answers set before
that first backend use keep it quiet and shareable; nothing runs on a TPU here, so their values
only have to parse. Every tpu_backend entry point that can start jax (export, AOT compile, load)
calls :func:`prepare_cpu_host` first, so library users need not; importing changes nothing.
"""

from __future__ import annotations

import contextlib
import functools
import glob
import os

__all__ = ["prepare_cpu_host", "tpu_attached", "x64_scope"]

_GOOGLE_PCI_VENDOR = "0x1ae0"


@functools.lru_cache(maxsize=1)
def tpu_attached() -> bool:
    """A Google PCI device (a TPU chip) is on this host's bus."""
    for vendor in glob.glob("/sys/bus/pci/devices/*/vendor"):
        try:
            with open(vendor) as f:
                if f.read().strip() == _GOOGLE_PCI_VENDOR:
                    return True
        except OSError:
            continue
    return False


def prepare_cpu_host() -> None:
    """On a host with no TPU attached, set (if unset) the libtpu variables that make TPU AOT
    compiles work beside other jax processes and keep libtpu from printing its start-up errors.
    Idempotent and cheap; a TPU host is left untouched. It only helps before jax's backends start
    (a process that already used jax has printed them): entry points call it first thing."""
    if tpu_attached():
        return
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
    os.environ.setdefault("TPU_ACCELERATOR_TYPE", "v6e-4")


def x64_scope(enabled: bool):
    """jax's 64-bit mode for the duration of a block (never switched on globally); here, not in export.py, so the
    compile worker, which must not import torch, shares it."""
    if not enabled:
        return contextlib.nullcontext()
    import jax

    return jax.enable_x64(True)
