"""Evaluate subgraphs that read only weights and constants; their results become weights.

A folded value is kept only when it is no bigger than what it was computed from (plus 64 KiB):
folding ``permute(weight)`` is free, but folding ``full([2048, 2048])`` would bloat the file
with a value the runtime can make in microseconds. The same policy (``NEVER_FOLD``, ``fold_fits``)
decides what a backend folds while lowering (edge/lower.py).
"""

from __future__ import annotations

import operator

import torch

from .._torch_compat import is_op_overload
from ..interpret import call_narrowed
from ..program import Program
from ._util import add_weight, weight_of

__all__ = ["fold_constants", "NEVER_FOLD", "fold_fits"]

FOLD_GROWTH_BYTES = 64 * 1024
# ops whose result is not a function of their inputs (random, uninitialized) or only exists in training
NEVER_FOLD = ("rand", "normal", "bernoulli", "uniform", "empty", "dropout")


def fold_fits(out_bytes: int, in_bytes: int) -> bool:
    """Whether a folded result of ``out_bytes`` computed from constants of ``in_bytes`` is worth storing."""
    return out_bytes <= in_bytes + FOLD_GROWTH_BYTES


def _foldable_target(t) -> bool:
    if t is operator.getitem:
        return True
    if not is_op_overload(t):
        return False  # sym ops (sym_size, operator.mul on SymInts) stay
    return not any(k in t.name() for k in NEVER_FOLD)


def fold_constants(prog: Program) -> None:
    for sig in prog.signatures.values():
        values: dict = {}  # node -> real value
        cost: dict = {}  # node -> bytes of the weights it was computed from
        for n in sig.graph.nodes:
            if n.op == "placeholder":
                w = weight_of(prog, n)
                if w is not None:
                    values[n] = w
                    cost[n] = w.numel() * w.element_size()
                continue
            if n.op != "call_function" or not _foldable_target(n.target):
                continue
            inputs = n.all_input_nodes
            if not all(i in values for i in inputs):
                continue
            if any(isinstance(s, torch.SymInt) for s in getattr(n.meta.get("val"), "shape", ())):
                continue
            args, kwargs = torch.fx.node.map_arg((n.args, n.kwargs), values.__getitem__)
            try:
                # under the 32-bit policy, computed exactly as the narrowed graph would (arange's
                # default int64 becomes int32, as the node's meta value already says)
                values[n] = n.target(*args, **kwargs) if prog.enable_x64 else call_narrowed(n.target, args, kwargs)
            except Exception:  # noqa: BLE001 - leave it to the backend
                continue
            cost[n] = sum(cost[i] for i in inputs)
        # Replace the frontier: folded nodes read by nodes that were not folded.
        for n in list(values):
            if n.op == "placeholder" or not isinstance(values[n], torch.Tensor):
                continue
            if all(u in values for u in n.users):
                continue
            out = values[n]
            if not fold_fits(out.numel() * out.element_size(), cost[n]):
                continue
            new = add_weight(prog, sig, f"{_scope(n)}{n.name}_folded", out.detach().clone().contiguous())
            new.meta["stack_trace"] = n.meta.get("stack_trace")
            n.replace_all_uses_with(new)
        sig.graph.eliminate_dead_code()


def _scope(n) -> str:
    stack = n.meta.get("nn_module_stack") or {}
    if stack:
        path = list(stack.values())[-1][0]
        if path:
            return f"{path}."
    return ""
