"""An exported signature's module with its platform fixed before an AOT compile.

A signature exported for several platforms (``tpu`` and ``cpu``) takes the platform's index as its first
argument and carries every platform's form of the ops that differ (each ``lax.platform_dependent`` becomes a
``stablehlo.case`` on that index). Compiled as is for one platform, the compiler receives both forms and the
index only as a call argument: it carries every branch through its early passes before it folds them (ResNet-18,
float32, one v5e chip: 116 s of compile CPU time against 88 s for the same program exported for the TPU alone).

``for_platform`` rewrites the module so that the index is the compile's own platform, a constant, and lets
MLIR's canonicalizer fold every ``case`` on it: what reaches the compiler is the program that platform runs,
nothing else. The calling convention is unchanged (the first argument stays, unused), so the compiled
executable is called exactly as one compiled from the original module.
"""

from __future__ import annotations

import dataclasses

__all__ = ["for_platform"]


def for_platform(exported, platform: str):
    """``exported`` with its module specialized to ``platform`` (one of ``exported.platforms``); ``exported``
    itself where it was exported for one platform only or for none that matches."""
    platforms = tuple(exported.platforms)
    if len(platforms) < 2 or platform not in platforms:
        return exported
    import numpy as np
    from jax._src.export import _export
    from jax._src.interpreters import mlir
    from jax._src.lib import _jax
    from jax._src.lib.mlir import ir, passmanager
    from jax._src.lib.mlir.dialects import hlo

    with mlir.make_ir_context(), ir.Location.unknown():
        module = _jax.mlir.deserialize_portable_artifact(exported.mlir_module_serialized)
        main = next(op for op in module.body.operations
                    if "sym_name" in op.attributes and op.attributes["sym_name"].value == "main")
        block = main.regions[0].blocks[0]
        with ir.InsertionPoint.at_block_begin(block):
            index = hlo.ConstantOp(ir.DenseElementsAttr.get(np.array(platforms.index(platform), np.int32)))
        block.arguments[0].replace_all_uses_with(index.result)
        passmanager.PassManager.parse("builtin.module(inline,canonicalize,symbol-dce)").run(module.operation)
        serialized = _export._module_to_bytecode(module)
    return dataclasses.replace(exported, mlir_module_serialized=serialized)
