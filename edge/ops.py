"""Imports every ops module so the EDGE table is complete, and re-exports it."""

from __future__ import annotations

from . import ops_conv, ops_elementwise, ops_math, ops_nn, ops_reduce, ops_shape  # noqa: F401 - registration
from .registry import EDGE

__all__ = ["EDGE"]
