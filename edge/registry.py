"""The edge backend's lowering table: ATen overload -> function emitting LiteRT builtins.

A lowering is ``fn(lw, *args, **kwargs) -> Val | tuple[Val, ...]``: ``lw`` is the
subgraph lowerer (edge.lower.Lowerer), the arguments are the node's, with fx nodes replaced
by their lowered values. ``@supported_if(pred)`` adds a per-node condition (checked with
the support check, before anything is written), for ops lowered only in some forms.
"""

from __future__ import annotations

from converter.registry import LoweringRegistry

__all__ = ["EDGE", "lowering", "supported_if", "node_supported"]

EDGE = LoweringRegistry("edge")
lowering = EDGE.lowering


def supported_if(pred):
    """Mark a lowering as handling only nodes for which ``pred(node)`` is true."""

    def mark(fn):
        fn.edge_supports = pred
        return fn

    return mark


def node_supported(node) -> bool:
    fn = EDGE.get(node.target)
    if fn is None:
        return False
    pred = getattr(fn, "edge_supports", None)
    if pred is None:
        return True
    try:
        return bool(pred(node))
    except Exception:  # noqa: BLE001 - a predicate that cannot decide rejects
        return False
