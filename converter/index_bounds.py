"""Which signature inputs are embedding ids, and how many rows their table has.

torch's embedding raises IndexError for an id outside [0, rows); a compiled gather does not
(XLA clamps, LiteRT reads whatever the index lands on), so the runtimes check such inputs on
the host. Only inputs whose every value reaches the embedding's indices are bounded: the walk
follows ops that keep all values unchanged (views, reshapes, copies, casts between int32 and
int64), never slices or arithmetic, so a bounded input fails exactly where torch would.
"""

from __future__ import annotations

import torch

__all__ = ["index_bounds"]

_aten = torch.ops.aten
# Ops whose output holds exactly the input's values (same multiset, maybe repeated or reordered).
_KEEPS_VALUES = {
    _aten.view.default, _aten.reshape.default, _aten._unsafe_view.default, _aten.unsqueeze.default,
    _aten.squeeze.default, _aten.squeeze.dim, _aten.squeeze.dims, _aten.flatten.using_ints,
    _aten.clone.default, _aten.alias.default, _aten.permute.default, _aten.transpose.int,
    _aten.expand.default, _aten.contiguous.default,
}
# A cast keeps values only between integer dtypes that hold every id a table can have.
_ID_DTYPES = {torch.int32, torch.int64}


def _rows(embedding: torch.fx.Node) -> int | None:
    w = embedding.args[0]
    val = w.meta.get("val") if isinstance(w, torch.fx.Node) else None
    n = val.shape[0] if isinstance(val, torch.Tensor) and val.dim() == 2 else None
    return n if isinstance(n, int) else None


def _keeps_values(node: torch.fx.Node, src: torch.fx.Node) -> bool:
    if node.target in _KEEPS_VALUES:
        return node.args[0] is src
    if node.target is _aten._to_copy.default:
        val = node.meta.get("val")
        return node.args[0] is src and isinstance(val, torch.Tensor) and val.dtype in _ID_DTYPES
    return False


def _bound_of(start: torch.fx.Node) -> int | None:
    """The smallest row count among the embeddings ``start`` feeds as indices, or None."""
    best = None
    todo, seen = [start], {start}
    while todo:
        node = todo.pop()
        for user in node.users:
            if user.target is _aten.embedding.default and len(user.args) > 1 and user.args[1] is node:
                rows = _rows(user)
                if rows is not None:
                    best = rows if best is None else min(best, rows)
            elif user not in seen and _keeps_values(user, node):
                seen.add(user)
                todo.append(user)
    return best


def index_bounds(input_nodes) -> list[int | None]:
    """Per integer input placeholder: the embedding row count it must stay under, else None."""
    out = []
    for node in input_nodes:
        val = node.meta.get("val")
        is_int = isinstance(val, torch.Tensor) and not val.is_floating_point() and val.dtype != torch.bool
        out.append(_bound_of(node) if is_int else None)
    return out
