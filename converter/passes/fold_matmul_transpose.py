"""A hand-written ``x @ W.t() (+ b)`` over a weight becomes ``aten.linear(x, W, b)``.

torch.export keeps ``nn.Linear`` as ``aten.linear``, but ``x @ self.W.t()`` captures as
``permute(W, [1, 0])`` read by ``matmul`` (or ``mm``, ``addmm``, ``bmm`` over an ``expand``). Left
alone, constant folding stores the transposed weight as a new weight, and both backends then run a
plain matmul over it: XLA:CPU's dot over the [K, N] copy was 1.5x slower than linear's dot over the
weight as stored (4096x9216 at batch 1), the edge file holds FULLY_CONNECTED plus a separate ADD for
the bias, and conversion transposes the weight twice (fold, then back to FULLY_CONNECTED's [N, K]).
A weight also read elsewhere (a tied embedding) is not duplicated: linear reads W itself.

Only a transpose of a 2-D weight whose sole reader is the matmul is rewritten; a transposed
activation, or a transposed weight something else also reads, stays as it is.
"""

from __future__ import annotations

import torch

from ..program import Program
from ._util import weight_of

__all__ = ["fold_matmul_transpose"]

aten = torch.ops.aten


def fold_matmul_transpose(prog: Program) -> None:
    for sig in prog.signatures.values():
        for n in [n for n in sig.graph.nodes if n.op == "call_function" and n.target in _MATMULS]:
            _fold_one(prog, sig.graph, n)


fold_matmul_transpose.writes = (aten.linear.default,)  # run_shared_passes skips it where linear is decomposed


def _fold_one(prog, graph, mm) -> bool:
    if mm.target is aten.addmm.default:
        bias, x, rhs = mm.args[:3]
        if mm.kwargs.get("beta", 1) != 1 or mm.kwargs.get("alpha", 1) != 1:
            return False
    else:
        bias, (x, rhs) = None, mm.args[:2]
    expand = None
    if mm.target is aten.bmm.default:
        # bmm(x, W.t().expand(B, K, N)): the same product as linear over x's last dim
        if not _is(rhs, aten.expand.default) or len(rhs.users) != 1:
            return False
        expand, rhs = rhs, rhs.args[0]
    w_node = _transposed_weight(prog, rhs)
    if w_node is None or len(rhs.users) != 1 or not isinstance(x, torch.fx.Node):
        return False
    w, xv, out = w_node.meta["val"], x.meta.get("val"), mm.meta.get("val")
    if xv is None or out is None or xv.dtype != w.dtype or out.dtype != w.dtype:
        return False
    rank = {aten.mm.default: (2,), aten.addmm.default: (2,), aten.bmm.default: (3,)}.get(mm.target, (1, 2, 3, 4, 5, 6))
    if xv.dim() not in rank or _dims(out.shape) != _dims(xv.shape[:-1]) + _dims(w.shape[:1]):
        return False  # matmul broadcasting a batched x against it, or a shape this rewrite would change
    if bias is not None and not _is_bias(prog, bias, w):
        return False
    with graph.inserting_before(mm):
        lin = graph.call_function(aten.linear.default, (x, w_node) if bias is None else (x, w_node, bias))
    lin.meta.update(mm.meta)
    mm.replace_all_uses_with(lin)
    for dead in (mm, expand, rhs):
        if dead is not None:
            graph.erase_node(dead)
    if bias is None:
        _fold_bias(prog, graph, lin)
    return True


def _fold_bias(prog, graph, lin) -> None:
    """linear(x, W) + b, where the add is the product's only reader -> linear(x, W, b)."""
    if len(lin.users) != 1:
        return
    add = next(iter(lin.users))
    if not _is(add, aten.add.Tensor) or add.kwargs.get("alpha", 1) != 1 or len(add.args) != 2:
        return
    other = add.args[1] if add.args[0] is lin else add.args[0]
    if other is lin or not _is_bias(prog, other, lin.args[1].meta["val"]):
        return
    av, lv = add.meta.get("val"), lin.meta["val"]
    if av is None or _dims(av.shape) != _dims(lv.shape) or av.dtype != lv.dtype:
        return
    lin.args = (lin.args[0], lin.args[1], other)
    add.replace_all_uses_with(lin)
    graph.erase_node(add)


def _is_bias(prog, node, w) -> bool:
    b = weight_of(prog, node)
    return b is not None and b.dim() == 1 and b.shape[0] == w.shape[0] and b.dtype == w.dtype


def _transposed_weight(prog, node):
    """W when ``node`` is the 2-D transpose of a weight W (t, permute [1, 0], transpose 0/1)."""
    if not isinstance(node, torch.fx.Node) or node.op != "call_function" or not node.args:
        return None
    src = node.args[0]
    w = weight_of(prog, src)
    if w is None or w.dim() != 2:
        return None
    if node.target is aten.t.default:
        return src
    if node.target is aten.permute.default and [d % 2 for d in node.args[1]] == [1, 0]:
        return src
    if node.target is aten.transpose.int and {d % 2 for d in node.args[1:3]} == {0, 1}:
        return src
    return None


def _dims(shape) -> list[str]:
    # by name: comparing symbolic sizes (a dynamic batch) with == would ask the shape environment for a guard
    return [str(d) for d in shape]


def _is(node, target) -> bool:
    return isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target is target


_MATMULS = (aten.mm.default, aten.matmul.default, aten.addmm.default, aten.bmm.default)
