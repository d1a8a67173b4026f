"""Versions of the software that writes or runs an artifact (read from package metadata,
without importing or initialising libtpu)."""

from __future__ import annotations

import functools
import importlib.metadata as md

__all__ = ["runtime_versions"]


def _version(dist: str):
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


@functools.lru_cache(maxsize=1)
def _cached() -> tuple:
    return tuple((k, _version(d)) for k, d in
                 (("tpu_export", "tpu-export"), ("jax", "jax"), ("jaxlib", "jaxlib"), ("libtpu", "libtpu")))


def runtime_versions() -> dict:
    return dict(_cached())
