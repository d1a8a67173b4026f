"""Imports every op module once (tpu_backend/lowering/ops_<family>.py for converter.registry's
OP_FAMILIES, the same split as the edge backend's), which registers its lowerings in JAX_LOWERINGS."""

from converter.registry import import_op_families

import_op_families(__package__)
