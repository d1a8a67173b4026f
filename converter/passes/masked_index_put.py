"""A write through one boolean mask, ``x[mask] = v``, becomes ``where(mask, v, x)``.

Gemma 3-style embeddings (T5Gemma 2) overwrite the rows of a special token with a learned vector:
``emb[input_ids == eoi_id] = eoi_embedding``. torch.export writes it as ``index_put(x, [mask], v)``, a write
whose number of rows is known only at run time, which neither backend lowers; but when ``v`` is one value for
every selected position (it broadcasts against a single selected row), the result is the elementwise select
``where(mask, v, x)`` (with ``accumulate``: ``where(mask, x + v, x)``, each position being selected once),
static shapes.

The rewrite applies to exactly ``index_put(x, [None] * lead + [mask], v, accumulate)``: one bool mask on the
dims after ``lead`` full slices with the shape of those dims of x, and ``v`` broadcasting to
``x.shape[:lead] + [1] + x.shape[lead + mask.dim():]`` (not one row per selected position); the sizes it
compares static. Any other boolean-mask write is left for the backend's op check to name.
"""

from __future__ import annotations

import torch

from ..program import Program
from ._util import fake_mode_of, node_maker

__all__ = ["where_masked_writes"]

aten = torch.ops.aten


def where_masked_writes(prog: Program) -> None:
    for sig in prog.signatures.values():
        found = [(n, m) for n in sig.graph.nodes if (m := _match(n)) is not None]
        if not found:
            continue
        mode = fake_mode_of(sig)
        for n, (x, mask, values, lead, accumulate) in found:
            _rewrite(sig.graph, mode, n, x, mask, values, lead, accumulate)


def _static(shape) -> bool:
    return all(isinstance(d, int) for d in shape)


def _match(n):
    """(x, mask, values, lead, accumulate) when ``n`` is the masked write above, else None."""
    if n.op != "call_function" or n.target is not aten.index_put.default:
        return None
    args = list(n.args) + [n.kwargs[k] for k in ("accumulate",) if k in n.kwargs]
    x, indices, values = args[:3]
    accumulate = args[3] if len(args) > 3 else False
    if not isinstance(indices, (list, tuple)) or not indices or not isinstance(values, torch.fx.Node):
        return None
    lead = len(indices) - 1
    mask = indices[-1]
    if any(i is not None for i in indices[:lead]) or not isinstance(mask, torch.fx.Node):
        return None
    xv, mv, vv = x.meta.get("val"), mask.meta.get("val"), values.meta.get("val")
    if xv is None or mv is None or vv is None or mv.dtype != torch.bool:
        return None
    if not (_static(xv.shape) and _static(mv.shape) and _static(vv.shape)):
        return None
    m = mv.dim()
    if tuple(mv.shape) != tuple(xv.shape[lead:lead + m]):
        return None
    one_row = list(xv.shape[:lead]) + [1] + list(xv.shape[lead + m:])  # what v must broadcast to
    if vv.dim() > len(one_row):
        return None
    for have, want in zip(reversed(vv.shape), reversed(one_row)):
        if have not in (1, want):
            return None
    return x, mask, values, lead, bool(accumulate)


def _rewrite(graph, mode, n, x, mask, values, lead: int, accumulate: bool) -> None:
    xv, mv, vv = x.meta["val"], mask.meta["val"], values.meta["val"]
    m, rest = mv.dim(), xv.dim() - lead - mv.dim()

    call = node_maker(graph, mode, n)

    with graph.inserting_before(n):
        full = [1] * (lead + 1 + rest - vv.dim()) + list(vv.shape)  # v's dims aligned with [*lead, row, *rest]
        v = values if vv.dtype == xv.dtype else call(aten._to_copy.default, values, dtype=xv.dtype)
        v = call(aten.view.default, v, full[:lead] + [1] * m + full[lead + 1:])
        cond = call(aten.view.default, mask, [1] * lead + list(mv.shape) + [1] * rest)
        if accumulate:
            v = call(aten.add.Tensor, x, v)
        out = call(aten.where.self, cond, v, x)
    n.replace_all_uses_with(out)
    graph.erase_node(n)
