"""A Python number read from a tensor (``.item()``) that depends on no input becomes that number.

Reformer's axial position encodings cut their table to ``position_ids.max().item()``, with ``position_ids`` the
model's own ``arange``: torch.export writes ``_local_scalar_dense`` and sizes the cut, and what follows, by a
symbol it cannot know, which neither backend lowers. The number depends on constants only, so it is computed here
(the subgraph run eagerly on the weights), written into the ops that read it (the arithmetic on it folded as
well), and the values after it recomputed with static shapes.

Only an item whose tensor is computed from weights and constants alone is folded (no input, no random op); an
item of anything an input reaches stays, and the backend's op check names ``_local_scalar_dense``.
"""

from __future__ import annotations

import operator

import torch

from ..program import Program
from ._util import downstream_nodes, fake_mode_of, recompute_values, weight_of

__all__ = ["fold_constant_items"]

aten = torch.ops.aten
# Python arithmetic and comparisons torch.export writes on symbolic ints
_SCALAR_OPS = (operator.add, operator.sub, operator.mul, operator.floordiv, operator.mod, operator.neg,
               operator.ge, operator.gt, operator.le, operator.lt, operator.eq, operator.ne, operator.truediv)
_RANDOM = ("rand", "normal", "bernoulli", "uniform", "empty", "dropout")


def fold_constant_items(prog: Program) -> None:
    for sig in prog.signatures.values():
        items = [n for n in sig.graph.nodes if n.op == "call_function" and n.target is aten._local_scalar_dense.default]
        if not items:
            continue
        values: dict = {}
        folded = [n for n in items if _evaluate(prog, n, values)]
        if not folded:
            continue
        sig.graph.eliminate_dead_code()  # the run-time checks torch left on the items, read by nothing
        alive = set(sig.graph.nodes)
        folded = [n for n in folded if n in alive]
        if not folded or not _recomputable(sig.graph, folded):
            continue
        readers = _substitute(sig.graph, {n: values[n] for n in folded})
        sig.graph.eliminate_dead_code()  # the items and the arithmetic folded into numbers
        alive = set(sig.graph.nodes)
        starts = [n for n in readers if n in alive]
        if starts:
            recompute_values(sig.graph, fake_mode_of(sig), starts, include_starts=True)


def _evaluate(prog, node, values) -> bool:
    """Compute ``node`` from weights and constants into ``values``; False when an input or a random op reaches it."""
    needed, stack = set(), [node]
    while stack:  # the ancestors, each checked once
        n = stack.pop()
        if n in needed or n in values:
            continue
        if n.op == "placeholder" and weight_of(prog, n) is None:
            return False
        if n.op not in ("placeholder", "call_function") or any(k in str(n.target) for k in _RANDOM):
            return False
        needed.add(n)
        stack.extend(n.all_input_nodes)
    for n in node.graph.nodes:  # in graph order: inputs first
        if n not in needed:
            continue
        if n.op == "placeholder":
            values[n] = weight_of(prog, n)
            continue
        args, kwargs = torch.fx.node.map_arg((n.args, n.kwargs), values.__getitem__)
        values[n] = n.target(*args, **kwargs)
    return True


def _substitute(graph, known: dict) -> list:
    """Write the numbers into their readers, folding Python arithmetic on them; the readers left with a number
    as an argument are returned."""
    readers = []
    while known:
        node, value = known.popitem()
        def put(a, node=node, value=value):
            return value if a is node else a

        for u in list(node.users):
            u.args, u.kwargs = torch.fx.node.map_aggregate((u.args, u.kwargs), put)
            if u.target in _SCALAR_OPS and not u.all_input_nodes:
                known[u] = u.target(*u.args, **u.kwargs)
            else:
                readers.append(u)
    return readers


def _recomputable(graph, items) -> bool:
    """Once the items are numbers, every node after them computes its value from tensors and numbers: Python
    arithmetic on the items alone folds, anything reading another symbolic int (another item, which stays) stops
    the fold, checked before the graph is touched."""
    known = set(items)
    for n in downstream_nodes(graph, items):
        if n in known or n.op == "output":
            continue
        if n.op != "call_function":
            return False
        ins = n.all_input_nodes
        if n.target in _SCALAR_OPS and all(a in known for a in ins):
            known.add(n)
            continue
        if any(a not in known and not isinstance(a.meta.get("val"), (torch.Tensor, tuple, list)) for a in ins):
            return False
    return True
