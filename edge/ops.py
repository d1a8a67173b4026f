"""Imports every ops module so the EDGE table is complete, and re-exports it."""

from __future__ import annotations

from . import ops_conv, ops_elementwise, ops_math, ops_nn, ops_reduce, ops_shape  # noqa: F401 - registration
from . import ops_grid_sample, ops_more_math, ops_more_nn, ops_pool3d  # noqa: F401 - registration
from . import ops_scatter, ops_scatter_reduce  # noqa: F401 - registration
from .registry import EDGE

__all__ = ["EDGE"]
