"""A boolean-mask selection that keeps one position per row becomes a gather of that position.

BART-style sequence classifiers (BART, mBART, PLBart, MVP, BigBird-Pegasus; mT5 and UMT5 too) pool the hidden
state at the last ``<eos>``: ``h[eos_mask, :].view(B, -1, H)[:, -1, :]``. The mask selection has a size known
only at run time, which neither backend lowers, but the model itself requires every row to hold the same number
of ``<eos>`` (transformers raises otherwise), and then the result is row b's hidden state at its last (or, with
``[:, 0, :]``, first) masked position: ``h[arange(B), argmax(...)]``, static shapes.

The rewrite applies to exactly ``select(view(index(h [B, S, H], [mask [B, S] bool]), [B, -1, H]), 1, i)`` with
i 0 or -1, the selection read by nothing else; any other boolean-mask index is left for the backend's op check
to name.
"""

from __future__ import annotations

import torch

from ..program import Program
from ._util import fake_mode_of, node_maker

__all__ = ["select_masked_rows"]

aten = torch.ops.aten


def select_masked_rows(prog: Program) -> None:
    for sig in prog.signatures.values():
        found = [m for m in (_match(n) for n in sig.graph.nodes) if m is not None]
        if not found:
            continue
        mode = fake_mode_of(sig)
        for select, index, h, mask, first in found:
            _rewrite(sig.graph, mode, select, h, mask, first)
            _drop_unread(sig.graph, index)


def _match(n):
    """(select, index, h, mask, first?) when ``n`` ends the pattern above, else None."""
    if n.op != "call_function" or n.target is not aten.select.int or len(n.args) != 3:
        return None
    view, dim, i = n.args
    if dim != 1 or i not in (0, -1) or not isinstance(view, torch.fx.Node) or len(view.users) != 1:
        return None
    if view.target not in (aten.view.default, aten.reshape.default, aten._unsafe_view.default):
        return None
    index = view.args[0]
    if not isinstance(index, torch.fx.Node) or index.target is not aten.index.Tensor:
        return None
    h, indices = index.args
    if len(indices) != 1 or not isinstance(indices[0], torch.fx.Node):
        return None
    mask = indices[0]
    hv, mv = h.meta.get("val"), mask.meta.get("val")
    if hv is None or mv is None or mv.dtype != torch.bool or hv.dim() != 3 or mv.dim() != 2:
        return None
    if tuple(mv.shape) != tuple(hv.shape[:2]) or list(view.args[1]) != [hv.shape[0], -1, hv.shape[2]]:
        return None
    if any(u is not view and u.target is not aten.sym_size.int for u in index.users):
        return None
    return n, index, h, mask, i == 0


def _rewrite(graph, mode, select, h, mask, first: bool) -> None:
    rows, width = h.meta["val"].shape[:2]

    call = node_maker(graph, mode, select)

    with graph.inserting_before(select):
        hits = call(aten._to_copy.default, mask, dtype=torch.int64)
        if not first:  # the last masked position scores highest: weight each position by its index + 1
            pos = call(aten.arange.start_step, 1, width + 1, 1, dtype=torch.int64)
            hits = call(aten.mul.Tensor, hits, pos)
        at = call(aten.argmax.default, hits, 1)  # argmax takes the first of equal scores
        batch = call(aten.arange.start_step, 0, rows, 1, dtype=torch.int64)
        out = call(aten.index.Tensor, h, [batch, at])
    select.replace_all_uses_with(out)
    graph.erase_node(select)


def _drop_unread(graph, index) -> None:
    """The selection and its view, once nothing but its own size reads remain (the model's run-time checks)."""
    view = next(iter(u for u in index.users if u.target is not aten.sym_size.int), None)
    if view is not None and not view.users:
        graph.erase_node(view)
    for u in list(index.users):
        if u.target is aten.sym_size.int and not u.users:
            graph.erase_node(u)
    if not index.users:
        graph.erase_node(index)
