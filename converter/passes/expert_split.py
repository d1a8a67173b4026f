"""Rows split into one piece per expert by counts read back from the graph (``.tolist()``) become masked sums.

JetMoE's experts (``JetMoeParallelExperts``) take the token rows sorted by expert and the number of rows per
expert as Python ints, ``expert_size = counts.tolist()``, then ``cat([linear(piece_i, W_i) for each piece of
rows.split(expert_size)])``. torch.export writes each count as ``_local_scalar_dense`` and the pieces with sizes
known only at run time, which neither backend lowers. Row r belongs to expert i exactly when
``start_i <= r < end_i`` (``end = cumsum(counts)``, ``start = end - counts``), so the concatenation is
``sum_i mask_i * linear(rows, W_i)`` with ``mask_i`` that comparison, over the static number of rows: the same
numbers, computing every expert on every row (as transformers' own dense expert implementations do).

The rewrite applies to exactly ``cat([linear(getitem(split_with_sizes(X [R, K], sizes, 0), i), W_i, b_i?)
for i in range(E)], 0)`` with R static, ``sizes[i]`` the item of ``counts[i]`` for one integer tensor
``counts`` [E], each piece and linear read once. Anything else stays, and the backend's op check names
``_local_scalar_dense``. The shapes downstream, which torch wrote in terms of the counts, are recomputed.
"""

from __future__ import annotations

import operator

import torch

from ..program import Program
from ._util import downstream_nodes, fake_mode_of, node_maker, recompute_values

__all__ = ["dense_expert_splits"]

aten = torch.ops.aten


def dense_expert_splits(prog: Program) -> None:
    for sig in prog.signatures.values():
        # in rounds: the rows of a split after a rewritten one (an MoE's second expert matmul) were sized by the
        # counts too, and are static only once the values after the first are recomputed
        while found := [m for m in (_match(n) for n in sig.graph.nodes) if m is not None]:
            sig.graph.eliminate_dead_code()  # the run-time checks torch left on the counts, read by nothing
            if not _downstream_recomputable(sig.graph, [m[0] for m in found]):
                break
            mode = fake_mode_of(sig)
            new = [_rewrite(sig.graph, mode, *m) for m in found]
            sig.graph.eliminate_dead_code()
            recompute_values(sig.graph, mode, new, wait=_pending)  # a pending split waits for its round


dense_expert_splits.writes = (aten.linear.default,)  # run_shared_passes skips it where linear is decomposed


def _count_index(size):
    """(counts, i) when ``size`` is the item of ``counts[i]`` (``squeeze(counts[i:i+1])`` or ``counts[i]``)."""
    if not isinstance(size, torch.fx.Node) or size.target is not aten._local_scalar_dense.default:
        return None
    t = size.args[0]
    if t.target is aten.squeeze.dims and t.args[1] in ([0], (0,)):
        t = t.args[0]
        if (t.target is aten.slice.Tensor and len(t.args) >= 4 and t.args[1] == 0 and isinstance(t.args[2], int)
                and t.args[3] == t.args[2] + 1 and (len(t.args) < 5 or t.args[4] == 1)):
            return t.args[0], t.args[2]
    elif t.target is aten.select.int and t.args[1] == 0:
        return t.args[0], t.args[2]
    return None


def _match(cat):
    """(cat, X, counts, [(W_i, b_i)]) when ``cat`` ends the pattern above, else None."""
    if cat.op != "call_function" or cat.target is not aten.cat.default:
        return None
    parts = cat.args[0]
    if (cat.args[1] if len(cat.args) > 1 else cat.kwargs.get("dim", 0)) != 0 or not parts:
        return None
    split, weights = None, []
    for i, lin in enumerate(parts):
        if not isinstance(lin, torch.fx.Node) or lin.target is not aten.linear.default or len(lin.users) != 1:
            return None
        piece = lin.args[0]
        if piece.target is not operator.getitem or len(piece.users) != 1 or piece.args[1] != i:
            return None
        split = piece.args[0] if split is None else split
        if piece.args[0] is not split:
            return None
        weights.append((lin.args[1], lin.args[2] if len(lin.args) > 2 else None))
    if split.target is not aten.split_with_sizes.default or (split.args[2] if len(split.args) > 2 else 0) != 0:
        return None
    x, sizes = split.args[0], split.args[1]
    xv = x.meta.get("val")
    if xv is None or xv.dim() != 2 or not isinstance(xv.shape[0], int) or len(sizes) != len(parts):
        return None
    found = [_count_index(s) for s in sizes]
    if any(f is None for f in found) or [f[1] for f in found] != list(range(len(parts))):
        return None
    counts = found[0][0]
    cv = counts.meta.get("val")
    if any(f[0] is not counts for f in found) or cv is None or cv.dtype.is_floating_point or cv.dim() != 1:
        return None
    if len(split.users) != len(parts):
        return None
    return cat, x, counts, weights


def _replaced(cat) -> set:
    """The nodes the rewrite of ``cat`` leaves unread: it, its linears, their pieces and the split."""
    lins = list(cat.args[0])
    pieces = [lin.args[0] for lin in lins]
    return {cat, *lins, *pieces, pieces[0].args[0]}


def _downstream_recomputable(graph, cats) -> bool:
    """Every node after the concatenations (but the ones rewritten) computes its value from tensors and constants
    (no shape it reads as a symbolic int, which would still name the counts)."""
    gone = set().union(*(_replaced(c) for c in cats))
    for n in downstream_nodes(graph, cats):
        if n in gone or n.op == "output" or _pending(n):
            continue
        if n.op != "call_function" or any(not isinstance(a.meta.get("val"), (torch.Tensor, tuple, list))
                                          for a in n.all_input_nodes):
            return False
    return True


def _rewrite(graph, mode, cat, x, counts, weights):
    rows = x.meta["val"].shape[0]

    call = node_maker(graph, mode, cat)

    with graph.inserting_before(cat):
        end = call(aten.cumsum.default, counts, 0)
        start = call(aten.sub.Tensor, end, counts)
        pos = call(aten.unsqueeze.default, call(aten.arange.start_step, 0, rows, 1, dtype=counts.meta["val"].dtype), 1)
        inside = call(aten.logical_and.default, call(aten.ge.Tensor, pos, start), call(aten.lt.Tensor, pos, end))
        dtype = cat.meta["val"].dtype
        mask = call(aten._to_copy.default, inside, dtype=dtype)  # [rows, experts]
        out = None
        for i, (w, b) in enumerate(weights):
            y = call(aten.linear.default, x, w) if b is None else call(aten.linear.default, x, w, b)
            y = call(aten.mul.Tensor, y, call(aten.slice.Tensor, mask, 1, i, i + 1))
            out = y if out is None else call(aten.add.Tensor, out, y)
    cat.replace_all_uses_with(out)
    graph.erase_node(cat)
    return out


def _pending(n) -> bool:
    """A split by counts read back as ints that a later round rewrites (its rows were sized by earlier counts)."""
    return n.op == "call_function" and n.target is aten.split_with_sizes.default and all(
        _count_index(s) is not None for s in n.args[1])
