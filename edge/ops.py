"""Imports every ops module so the EDGE table is complete, and re-exports it with the public
registration API (``lowering``, ``supported_if``: the contract of converter.registry).

The op files are split by converter.registry.OP_FAMILIES, like the TPU backend's: an op's edge
lowering is in edge/ops_<family>.py and its TPU lowering in tpu_backend/lowering/ops_<family>.py."""

from __future__ import annotations

from tpu_export.converter.registry import import_op_families

from .registry import EDGE, lowering, supported_if

__all__ = ["EDGE", "lowering", "supported_if"]

import_op_families(__package__)
