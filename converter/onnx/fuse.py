"""Node patterns the importer folds into one op after constant folding: GELU written out as arithmetic.

Opsets before 20 have no Gelu op, so torch's exporters write ``F.gelu`` as its formula, and a backend that
lowers it node by node runs six or more kernels where one GELU would do (LiteRT has a GELU builtin; the TPU
backend lowers ``aten.gelu`` to one fused expression). The forms matched are the exporters' actual ones:

- exact: ``x * 0.5 * (1 + Erf(x / sqrt2))`` — TorchScript (opset 17): ``Mul(Mul(x, Add(Erf(Div(x, c)), 1)),
  0.5)``; dynamo (opset 18): ``Mul(x, Mul(0.5, Add(Erf(Div(x, c)), 1)))``; ``Mul(x, 1/sqrt2)`` for the Div and
  any order of the three factors and of commutative operands also match;
- tanh: ``x * 0.5 * (1 + Tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))`` with ``x^3`` as ``Pow(x, 3)`` (dynamo) or
  ``Mul(x, Mul(x, x))`` (TorchScript).

Constants are checked by value (0-d, to float32 precision), and a pattern is folded only when each value
inside it has no consumer outside it and is no graph output, so nothing else in the graph changes. The folded
node runs com.microsoft::Gelu / FastGelu's op function (``F.gelu``) under the root node's name.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np

__all__ = ["fuse_gelu", "fuse_linear", "FUSED_PATTERNS"]

FUSED_PATTERNS = [  # for docs/onnx_ops.md
    ("exact GELU", "x * 0.5 * (1 + Erf(x / sqrt(2)))  (Div by sqrt(2) or Mul by 1/sqrt(2); any factor order)",
     "com.microsoft::Gelu (aten.gelu)"),
    ("tanh GELU", "x * 0.5 * (1 + Tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))  (x^3 as Pow(x, 3) or x * x * x)",
     "com.microsoft::FastGelu (aten.gelu, approximate='tanh')"),
    ("linear layer", "Add(MatMul(x, W), b)  (W a 2-D initializer read by this MatMul only, b a 1-D initializer)",
     "Gemm(x, W', b, transB=1) (aten.linear; W stored transposed, [out, in], under its name)"),
]


class _Graph:
    """Producers and consumer counts of the runtime nodes, and the constants, for matching."""

    def __init__(self, graph, outputs):
        self.nodes = graph.nodes
        self.consts = graph.consts
        self.producer = {o: i for i, n in enumerate(self.nodes) for o in n[4] if o}
        self.uses = Counter(x for n in self.nodes for x in n[3] if x)
        self.uses.update(outputs)  # a graph output has a consumer outside every pattern

    def node(self, value, op_type):
        """(index, input names) of the default-domain node of ``op_type`` producing ``value``, else None."""
        i = self.producer.get(value)
        if i is None:
            return None
        spec, ctx, _, names, outs = self.nodes[i]
        if spec.domain != "" or ctx.op_type != op_type or len([o for o in outs if o]) != 1:
            return None
        return i, names

    def scalar(self, value, want: float) -> bool:
        v = self.consts.get(value) if value not in self.producer else None
        # 0-d only (what both exporters write): a [1]-shaped factor would make a 0-d x's result 1-d
        if not isinstance(v, np.ndarray) or v.ndim != 0 or v.dtype.kind != "f":
            return False
        return math.isclose(float(v.reshape(())), want, rel_tol=1e-6, abs_tol=0.0)


def _operands(g, value, op_type):
    """Both orders of a commutative node's two inputs: [(index, a, b), (index, b, a)], or []."""
    hit = g.node(value, op_type)
    if hit is None or len(hit[1]) != 2:
        return []
    i, (a, b) = hit
    return [(i, a, b), (i, b, a)]


def _erf_branch(g, a):
    """x and the nodes of ``1 + Erf(x / sqrt2)`` given its value ``a``, else None."""
    for i_add, t, one in _operands(g, a, "Add"):
        if not g.scalar(one, 1.0):
            continue
        erf = g.node(t, "Erf")
        if erf is None:
            continue
        d = erf[1][0]
        div = g.node(d, "Div")
        if div is not None and g.scalar(div[1][1], math.sqrt(2.0)):
            return div[1][0], [i_add, erf[0], div[0]]
        for i_mul, x, c in _operands(g, d, "Mul"):
            if g.scalar(c, 1 / math.sqrt(2.0)):
                return x, [i_add, erf[0], i_mul]
    return None


def _cube_of(g, v, x):
    """The nodes computing ``x^3`` as ``v``, else None."""
    p = g.node(v, "Pow")
    if p is not None and p[1][0] == x and g.scalar(p[1][1], 3.0):
        return [p[0]]
    for i, a, b in _operands(g, v, "Mul"):
        if a == x:
            for j, c, d in _operands(g, b, "Mul"):
                if c == x and d == x:
                    return [i, j]
    return None


def _tanh_branch(g, a):
    """x and the nodes of ``1 + Tanh(sqrt(2/pi) * (x + 0.044715 * x^3))`` given ``a``, else None."""
    for i_add, t, one in _operands(g, a, "Add"):
        th = g.node(t, "Tanh") if g.scalar(one, 1.0) else None
        if th is None:
            continue
        for i_scale, s, c in _operands(g, th[1][0], "Mul"):
            if not g.scalar(c, math.sqrt(2.0 / math.pi)):
                continue
            for i_sum, x, k in _operands(g, s, "Add"):
                for i_k, cube, c3 in _operands(g, k, "Mul"):
                    nodes = _cube_of(g, cube, x) if g.scalar(c3, 0.044715) else None
                    if nodes is not None:
                        return x, [i_add, th[0], i_scale, i_sum, i_k, *nodes]
    return None


def _match(g, root: int):
    """(x, approximate, the pattern's nodes but the root) for a GELU ending at Mul node ``root``, else None."""
    spec, ctx, _, names, outs = g.nodes[root]
    if spec.domain != "" or ctx.op_type != "Mul" or len(names) != 2:
        return None
    for inner, other in ((names[0], names[1]), (names[1], names[0])):
        for i_inner, p, q in _operands(g, inner, "Mul"):
            # the three factors {other, p, q}: 0.5, the (1 + f(x)) branch, x, in any order
            for half, branch, x in ((other, p, q), (other, q, p), (p, other, q), (p, q, other)):
                if not g.scalar(half, 0.5):
                    continue
                for approximate, fn in (("none", _erf_branch), ("tanh", _tanh_branch)):
                    hit = fn(g, branch)
                    if hit is not None and hit[0] == x:
                        return x, approximate, [i_inner, *hit[1]]
    return None


def fuse_gelu(graph, outputs: list, table) -> int:
    """Replace each GELU pattern among ``graph.nodes`` by one node; returns how many were folded."""
    from .graph import NodeContext

    g = _Graph(graph, outputs)
    drop: set[int] = set()
    replace: dict[int, tuple] = {}
    for root in range(len(g.nodes)):
        hit = _match(g, root)
        if hit is None:
            continue
        x, approximate, inner = hit
        values = [o for i in inner for o in g.nodes[i][4] if o]
        if set(inner) & (drop | {root}) or any(g.uses[v] != 1 for v in values):
            continue  # a value inside the pattern is used elsewhere: folding it would change that consumer
        ctx = g.nodes[root][1]
        if approximate == "none":
            spec, op_type = table.lookup("com.microsoft", "Gelu", 1), "Gelu"
        else:
            spec, op_type = table.lookup("com.microsoft", "FastGelu", 1), "FastGelu"
        fused = NodeContext(ctx.name, op_type, 1, 1, ctx.out_types, ctx.out_shapes)
        replace[root] = (spec, fused, {}, [x], list(g.nodes[root][4]))
        drop.update(inner)
    graph.nodes = [replace.get(i, n) for i, n in enumerate(g.nodes) if i not in drop]
    return len(replace)


def fuse_linear(graph, outputs: list, table) -> int:
    """Replace ``Add(MatMul(x, W), b)`` with constant 2-D ``W`` and 1-D ``b`` by one Gemm(transB=1) node, which
    runs as ``F.linear``: torch's exporters write ``nn.Linear`` on 3-D inputs that way, and a backend sees a
    linear layer in ``aten.linear`` (the edge folds a bias and a preceding norm's affine into one
    FULLY_CONNECTED) where ``matmul + add`` leaves an ADD per layer and the norm's MUL/ADD. ``W`` is stored
    transposed ([out, in], torch's layout) under its name, so only a W no other node reads is taken."""
    from .graph import NodeContext

    g = _Graph(graph, outputs)
    drop: set[int] = set()
    replace: dict[int, tuple] = {}
    for i_add, (spec, ctx, _, names, outs) in enumerate(g.nodes):
        if spec.domain != "" or ctx.op_type != "Add" or len(names) != 2:
            continue
        for y, b in ((names[0], names[1]), (names[1], names[0])):
            mm = g.node(y, "MatMul")
            if mm is None or mm[0] in drop or g.uses[y] != 1:
                continue
            x, w = mm[1]
            wv, bv = g.consts.get(w) if w not in g.producer else None, g.consts.get(b) if b not in g.producer else None
            if not (isinstance(wv, np.ndarray) and isinstance(bv, np.ndarray) and wv.ndim == 2 and bv.ndim == 1
                    and wv.dtype.kind == "f" and bv.dtype == wv.dtype and bv.shape[0] == wv.shape[1]
                    and g.uses[w] == 1 and x not in g.consts):
                continue
            graph.consts[w] = _transposed(wv)
            if graph.release is not None:
                graph.release(wv)  # its pages in the file's map are no longer needed
            mm_ctx = g.nodes[mm[0]][1]
            fused = NodeContext(ctx.name, "Gemm", mm_ctx.opset, 1, ctx.out_types, ctx.out_shapes)
            attrs = {"alpha": 1.0, "beta": 1.0, "transA": 0, "transB": 1}
            replace[i_add] = (table.lookup("", "Gemm", mm_ctx.opset), fused, attrs, [x, w, b], list(outs))
            drop.add(mm[0])
            break
    graph.nodes = [replace.get(i, n) for i, n in enumerate(g.nodes) if i not in drop]
    return len(replace)


def _transposed(w: np.ndarray) -> np.ndarray:
    """``w.T`` as a new C-contiguous array, copied 16 source rows at a time: numpy's whole-array transposed copy
    strides through the source a column at a time (0.22 s for bert-base's 72 weights, 340 MB; this, 0.12 s)."""
    out = np.empty(w.shape[::-1], w.dtype)
    for i in range(0, w.shape[0], 16):
        out[:, i:i + 16] = w[i:i + 16].T
    return out
