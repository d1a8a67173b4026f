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
lowering = EDGE.lowering
