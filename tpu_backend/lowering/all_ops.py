"""Imports every op module once (tpu_backend/lowering/ops_<family>.py for converter.registry's
OP_FAMILIES, the same split as the edge backend's), which registers its lowerings in JAX_LOWERINGS,
and re-exports the table with the public registration API (the contract of converter.registry)."""

from tpu_export.converter.registry import import_op_families

from .registry import JAX_LOWERINGS, lowering, supported_if

__all__ = ["JAX_LOWERINGS", "lowering", "supported_if"]

import_op_families(__package__)
