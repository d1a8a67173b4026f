"""Algebraic clean-ups of the graph torch.export hands over, each a pass of its own.

- ``fold_multiply_by_zero_or_one``: ``x * c`` over a stored constant ``c`` of ones is ``x``; of zeros, a
  broadcast of ``c`` (the branch that computed ``x`` is then dead), and a sum with such a zero is the other
  operand. A frozen batch norm whose weight is 0 (a zero-initialised residual branch) then costs nothing. As
  TensorFlow's arithmetic optimizer does, this takes ``x * 0 = 0``, so an inf or NaN in ``x`` no longer
  reaches the output through that product.
- ``remove_noop_ops``: a pad by zero everywhere, a slice of a whole dim, a view or expand to the shape it
  already has, an identity permute (a window pad to a multiple the input already has, for one).
- ``drop_redundant_broadcasts``: an ``expand`` read by an op that broadcasts its operands itself, where the
  op's result is the same without it (``F.normalize``'s ``clamp_min(...).expand_as(x)`` before the division).

Each works on static shapes only: a dynamic dim is never compared, so no shape guard is added.
"""

from __future__ import annotations

import torch

from ..program import Program
from ._util import weight_of

__all__ = ["fold_multiply_by_zero_or_one", "remove_noop_ops", "drop_redundant_broadcasts"]

aten = torch.ops.aten

# binary ops that broadcast their tensor operands to one shape, elementwise
_BROADCASTING = frozenset({
    aten.add.Tensor, aten.sub.Tensor, aten.mul.Tensor, aten.div.Tensor, aten.rsub.Tensor, aten.maximum.default,
    aten.minimum.default, aten.pow.Tensor_Tensor, aten.where.self, aten.eq.Tensor, aten.ne.Tensor, aten.lt.Tensor,
    aten.le.Tensor, aten.gt.Tensor, aten.ge.Tensor, aten.logical_and.default, aten.logical_or.default,
    aten.atan2.default, aten.remainder.Tensor, aten.fmod.Tensor, aten.clamp.Tensor,
})


def _val(a):
    return a.meta.get("val") if isinstance(a, torch.fx.Node) else None


def _static_shape(a) -> tuple | None:
    v = _val(a)
    if not isinstance(v, torch.Tensor) or not all(isinstance(d, int) for d in v.shape):
        return None
    return tuple(v.shape)


def _same_tensor_type(a, b) -> bool:
    va, vb = _val(a), _val(b)
    shape = _static_shape(a)
    return (isinstance(va, torch.Tensor) and isinstance(vb, torch.Tensor) and shape is not None
            and shape == _static_shape(b) and va.dtype == vb.dtype)


def _replace(graph, node, by) -> None:
    node.replace_all_uses_with(by)
    graph.erase_node(node)


def _calls(sig):
    return [n for n in sig.graph.nodes if n.op == "call_function"]


# ---------------------------------------------------------------- x * 0, x * 1, x + 0

def _constant_fill(prog, node) -> float | None:
    """0.0 or 1.0 where ``node`` is a stored floating constant holding only that value (or an expand of one), or
    that number itself."""
    if isinstance(node, (int, float)) and not isinstance(node, bool):
        return float(node) if node in (0, 1) else None
    if isinstance(node, torch.fx.Node) and node.target is aten.expand.default:
        node = node.args[0]
    w = weight_of(prog, node)
    if w is None or not w.is_floating_point() or w.numel() == 0 or w.numel() > 1 << 20:
        return None
    for v in (0.0, 1.0):
        if bool((w == v).all()):
            return v
    return None


def _expand_to(graph, before, src, like) -> torch.fx.Node:
    with graph.inserting_before(before):
        e = graph.call_function(aten.expand.default, (src, list(_static_shape(like))))
    e.meta.update(before.meta)
    return e


def fold_multiply_by_zero_or_one(prog: Program) -> None:
    for sig in prog.signatures.values():
        g = sig.graph
        for n in _calls(sig):
            if n.target not in (aten.mul.Tensor, aten.add.Tensor) or n.kwargs or len(n.args) != 2:
                continue
            out = _static_shape(n)
            if out is None:
                continue
            for x, c in (n.args, n.args[::-1]):
                fill = _constant_fill(prog, c)
                if fill is None or not isinstance(x, torch.fx.Node):
                    continue
                if n.target is aten.mul.Tensor and fill == 1.0 and _same_tensor_type(x, n):
                    _replace(g, n, x)
                elif (n.target is aten.mul.Tensor and fill == 0.0 and isinstance(c, torch.fx.Node)
                      and _val(c).dtype == _val(n).dtype):
                    _replace(g, n, _expand_to(g, n, c.args[0] if c.target is aten.expand.default else c, n))
                elif n.target is aten.add.Tensor and fill == 0.0 and _val(x).dtype == _val(n).dtype:
                    _replace(g, n, x if _static_shape(x) == out else _expand_to(g, n, x, n))
                else:
                    continue
                break


# ---------------------------------------------------------------- ops that change nothing

def _is_noop(n) -> bool:
    t, a = n.target, n.args
    if not _same_tensor_type(a[0] if a else None, n):
        return False
    if t is aten.constant_pad_nd.default:
        return all(p == 0 for p in a[1])
    if t is aten.slice.Tensor:
        return len(a) < 5 or a[4] == 1  # the same shape at step 1: the whole dim
    if t in (aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.expand.default,
             aten.clone.default):
        return not n.kwargs
    if t is aten.permute.default:
        return list(a[1]) == list(range(len(a[1])))
    return False


def remove_noop_ops(prog: Program) -> None:
    for sig in prog.signatures.values():
        outputs = set(sig.output_nodes())
        for n in _calls(sig):
            src = n.args[0] if n.args else None
            # an output that would become an input read straight through keeps its op (a signature output
            # is a value the program computes)
            if n in outputs and isinstance(src, torch.fx.Node) and src.op == "placeholder":
                continue
            if _is_noop(n):
                _replace(sig.graph, n, src)


# ---------------------------------------------------------------- broadcasts an op would do itself

def drop_redundant_broadcasts(prog: Program) -> None:
    for sig in prog.signatures.values():
        for n in _calls(sig):
            if n.target is not aten.expand.default or not isinstance(n.args[0], torch.fx.Node):
                continue
            src = n.args[0]
            if _static_shape(src) is None or _val(src).dtype != _val(n).dtype:
                continue
            for user in list(n.users):
                if user.target in _BROADCASTING and _same_result(user, n, src):
                    user.replace_input_with(n, src)


def _same_result(user, expand, src) -> bool:
    """``user``'s result shape is unchanged when it reads ``src`` in place of ``expand``."""
    out = _static_shape(user)
    shapes = []
    for a in (*user.args, *user.kwargs.values()):
        if a is expand:
            a = src
        if isinstance(a, torch.fx.Node):
            s = _static_shape(a)
            if s is None:
                return False
            shapes.append(s)
    try:
        return out is not None and tuple(torch.broadcast_shapes(*shapes)) == out
    except RuntimeError:
        return False
