"""The edge backend's lowering table: op -> function emitting LiteRT builtins.

The contract is converter.registry's, the same as the TPU backend's: a lowering is
``fn(lw, *args) -> Val | tuple[Val, ...]`` with the op's schema arguments in schema order
(defaults filled, fx nodes replaced by their lowered values), ``lw`` the subgraph lowerer
(edge.lower.Lowerer); ``@supported_if(pred)`` for nodes a lowering takes only in some forms.
"""

from __future__ import annotations

from tpu_export.converter.registry import LoweringRegistry, supported_if

__all__ = ["EDGE", "lowering", "supported_if"]

EDGE = LoweringRegistry("edge")
"""The LiteRT backend's lowering table (op -> lowering)."""

lowering = EDGE.lowering
"""``@edge.lowering(*ops, override=False)``: register a LiteRT lowering for ops (a ``torch.library`` custom op, or
an ATen op with ``override=True``). It is ``LoweringRegistry.lowering`` of the edge table: the same contract as the
TPU backend's ``tpu_backend.lowering.lowering``. The lowering is called as ``fn(lw, *args)`` with ``lw`` the
subgraph lowerer, which emits LiteRT builtins: ``lw.op(name, inputs, shape, dtype, perm, options)``,
``lw.tensor(value)``, ``lw.const(array)``, ``lw.options(kind, ...)``."""
