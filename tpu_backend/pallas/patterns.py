"""Recognise RMSNorm and LayerNorm spelled out in core ATen, so they can take the fused kernel.

A model that calls F.rms_norm / F.layer_norm reaches the lowering as aten.rms_norm /
aten.layer_norm (kept whole by the converter). Many models spell the norm out instead
(Llama's ``x * rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w``); after decomposition that
is a small tree of mean/pow/add/rsqrt/mul nodes. The matchers here read the tree back as a
product of factors and check each one, so operand order, ``/ sqrt`` vs ``* rsqrt``,
``pow(x, 2)`` vs ``x * x``, ``var`` / ``var_mean`` vs the explicit mean of squares, and dtype
casts around the core all match. Normalisation is over the last dim only.

Pure torch.fx: no jax import.
"""

from __future__ import annotations

import dataclasses
import operator

import torch

from tpu_export.converter.registry import arguments

__all__ = ["NormMatch", "match_rms_norm", "match_layer_norm", "find_norm_patterns"]

aten = torch.ops.aten
Node = torch.fx.Node


@dataclasses.dataclass
class NormMatch:
    kind: str  # "rms_norm" | "layer_norm"
    end: Node  # the node whose value the fused kernel produces (cast to its dtype)
    nodes: list  # every node the kernel replaces, ``end`` included, in graph order
    x: Node  # the normalised input (the statistics are computed on this value)
    weight: Node | None
    bias: Node | None
    eps: float


def _is(n, *targets) -> bool:
    return isinstance(n, Node) and n.op == "call_function" and n.target in targets


def _is_cast(n) -> bool:
    # A dtype-only copy (x.float(), .type_as(x), .to(dtype)): transparent to the math.
    return _is(n, aten._to_copy.default) and set(n.kwargs) <= {"dtype", "layout", "device"}


def _strip_casts(n, seen: list):
    while _is_cast(n):
        seen.append(n)
        n = n.args[0]
    return n


def _ndim(n) -> int | None:
    val = n.meta.get("val") if isinstance(n, Node) else None
    return val.dim() if isinstance(val, torch.Tensor) else None


def _is_last_dim_reduce(n, x) -> bool:
    dims = arguments(n)["dim"]
    nd = _ndim(x)
    return dims is not None and len(dims) == 1 and nd is not None and dims[0] in (-1, nd - 1)


def _keepdim(n) -> bool:
    return bool(arguments(n)["keepdim"])


def _factors(n, out: list, inner: list, power: int = 1) -> None:
    """Flatten a mul/div/cast tree into (node, power) factors; interior nodes go to ``inner``."""
    if _is(n, aten.mul.Tensor) and all(isinstance(a, Node) for a in n.args[:2]):
        inner.append(n)
        _factors(n.args[0], out, inner, power)
        _factors(n.args[1], out, inner, power)
    elif _is(n, aten.div.Tensor) and all(isinstance(a, Node) for a in n.args[:2]):
        inner.append(n)
        _factors(n.args[0], out, inner, power)
        _factors(n.args[1], out, inner, -power)
    elif _is(n, aten.reciprocal.default):
        inner.append(n)
        _factors(n.args[0], out, inner, -power)
    elif _is_cast(n):
        inner.append(n)  # ``.float()`` / ``.type_as(x)`` around a factor: only rounding differs
        _factors(n.args[0], out, inner, power)
    else:
        out.append((n, power))


def _inv_std(n, power: int, nodes: list):
    """If (n ** power) is 1/sqrt(stat + eps), return (stat, eps)."""
    if _is(n, aten.rsqrt.default) and power == 1:
        inner = n.args[0]
    elif _is(n, aten.sqrt.default) and power == -1:
        inner = n.args[0]
    elif _is(n, aten.pow.Tensor_Scalar) and n.args[1] * power == -0.5:
        inner = n.args[0]
    else:
        return None
    if not _is(inner, aten.add.Tensor, aten.add.Scalar):
        return None
    a, b = inner.args[:2]
    stat, eps = (a, b) if isinstance(b, (int, float)) else (b, a)
    if not isinstance(eps, (int, float)) or not isinstance(stat, Node) or inner.kwargs.get("alpha", 1) != 1:
        return None
    nodes += [n, inner]
    return stat, float(eps)


def _square_of(n, nodes: list):
    """x for x*x or x**2, else None."""
    if _is(n, aten.pow.Tensor_Scalar) and n.args[1] == 2:
        nodes.append(n)
        return n.args[0]
    if _is(n, aten.mul.Tensor) and n.args[0] is n.args[1]:
        nodes.append(n)
        return n.args[0]
    return None


def _mean_of(n, nodes: list):
    """x for mean(x, [-1], keepdim=True), else None."""
    if _is(n, aten.mean.dim) and _is_last_dim_reduce(n, n.args[0]) and _keepdim(n):
        nodes.append(n)
        return n.args[0]
    return None


def _centred(n, nodes: list):
    """(x, mean node) for x - mean(x, -1, keepdim) (mean may come from var_mean), else None."""
    if not (_is(n, aten.sub.Tensor) and n.kwargs.get("alpha", 1) == 1 and isinstance(n.args[1], Node)):
        return None
    x, m = n.args[:2]
    sub_nodes = [n]
    if _mean_of(m, sub_nodes) is not None and sub_nodes[-1].args[0] is x:
        pass
    elif _is(m, operator.getitem) and m.args[1] == 1 and _is_var_mean(m.args[0], x):
        sub_nodes += [m, m.args[0]]
    else:
        return None
    nodes += sub_nodes
    return x, m


def _population(n) -> bool:
    """A var / var_mean node with correction 0 (the biased variance), keepdim."""
    return arguments(n)["correction"] == 0 and _keepdim(n)


def _is_var_mean(n, x) -> bool:
    return (
        _is(n, aten.var_mean.correction)
        and n.args[0] is x
        and _is_last_dim_reduce(n, x)
        and _population(n)
    )


def _population_var_of(n, nodes: list):
    """x for the biased variance of x over the last dim (keepdim), in any spelling, else None."""
    if _is(n, aten.var.correction) and _is_last_dim_reduce(n, n.args[0]):
        if _population(n):
            nodes.append(n)
            return n.args[0]
        return None
    if _is(n, operator.getitem) and n.args[1] == 0 and _is(n.args[0], aten.var_mean.correction):
        if _is_var_mean(n.args[0], n.args[0].args[0]):
            nodes += [n, n.args[0]]
            return n.args[0].args[0]
        return None
    inner: list = []
    sq = _mean_of(n, inner)
    base = _square_of(sq, inner) if sq is not None else None
    centred = _centred(base, inner) if base is not None else None
    if centred is None:
        return None
    nodes += inner
    return centred[0]


def _is_channel_vector(n, x) -> bool:
    """n broadcasts along the last dim of x only (a [H] or [1, .., 1, H] weight)."""
    v = n.meta.get("val") if isinstance(n, Node) else None
    xv = x.meta.get("val")
    if not isinstance(v, torch.Tensor) or not isinstance(xv, torch.Tensor) or v.dim() == 0:
        return False
    return v.dim() <= xv.dim() and all(d == 1 for d in v.shape[:-1]) and v.shape[-1] == xv.shape[-1]


def _split_affine(end: Node, with_bias: bool):
    """end = core * weight (+ bias): returns (product node, bias, nodes)."""
    if with_bias and _is(end, aten.add.Tensor) and end.kwargs.get("alpha", 1) == 1:
        a, b = end.args[:2]
        for core, bias in ((a, b), (b, a)):
            if isinstance(bias, Node) and isinstance(core, Node) and _is(core, aten.mul.Tensor, aten.div.Tensor):
                return core, bias, [end]
    return end, None, []


def _match(end: Node, kind: str) -> NormMatch | None:
    if not isinstance(end, Node) or end.op != "call_function":
        return None
    product, bias, nodes = _split_affine(end, with_bias=kind == "layer_norm")
    factors, inner = [], []
    _factors(product, factors, inner)
    nodes += inner
    if len(factors) not in (2, 3):
        return None
    for i, (n, p) in enumerate(factors):
        stat_nodes: list = []
        found = _inv_std(n, p, stat_nodes)
        if found is None:
            continue
        stat, eps = found
        rest = [f for j, f in enumerate(factors) if j != i]
        if any(p != 1 for _, p in rest):
            return None
        match = _check_core(kind, stat, rest, stat_nodes)
        if match is None:
            return None
        x, weight, core_nodes = match
        if bias is not None and not _is_channel_vector(bias, x):
            return None
        operands = {x, weight, bias}
        all_nodes = [n for n in _in_graph_order(end, nodes + stat_nodes + core_nodes) if n not in operands]
        if not _only_used_inside(all_nodes, end):
            return None
        return NormMatch(kind, end, all_nodes, x, weight, bias, eps)
    return None


def _check_core(kind, stat, rest, nodes):
    """rest = [data factor, optional weight]; stat = mean of squares (rms) or variance (layer)."""
    stat_nodes: list = []
    if kind == "rms_norm":
        mean_in = _mean_of(stat, stat_nodes)
        sq_in = _square_of(mean_in, stat_nodes) if mean_in is not None else None
        if sq_in is None:
            return None
        casts: list = []
        x_base = _strip_casts(sq_in, [])
        for j, (cand, _) in enumerate(rest):
            if _strip_casts(cand, casts) is x_base:
                weight = rest[1 - j][0] if len(rest) == 2 else None
                break
        else:
            return None
        x = sq_in
    else:
        x = _population_var_of(stat, stat_nodes)
        if x is None:
            return None
        for j, (cand, _) in enumerate(rest):
            centred_nodes: list = []
            centred = _centred(cand, centred_nodes)
            if centred is not None and centred[0] is x:
                weight = rest[1 - j][0] if len(rest) == 2 else None
                casts = centred_nodes
                break
        else:
            return None
    if weight is not None and not _is_channel_vector(weight, x):
        return None
    nodes += stat_nodes + casts
    return x, weight, nodes


def _in_graph_order(end: Node, nodes: list) -> list:
    order = {n: i for i, n in enumerate(end.graph.nodes)}
    return sorted({id(n): n for n in nodes + [end]}.values(), key=order.__getitem__)


def _only_used_inside(nodes: list, end: Node) -> bool:
    inside = set(nodes)
    return all(u in inside for n in nodes if n is not end for u in n.users)


def match_rms_norm(node: Node) -> NormMatch | None:
    """``node`` is the last op of x * rsqrt(mean(x*x or x**2, -1, keepdim) + eps) [* weight]."""
    return _match(node, "rms_norm")


def match_layer_norm(node: Node) -> NormMatch | None:
    """``node`` is the last op of (x - mean) * rsqrt(var + eps) [* weight] [+ bias] (or / sqrt)."""
    return _match(node, "layer_norm")


def find_norm_patterns(graph: torch.fx.Graph) -> list[NormMatch]:
    """All non-overlapping spelled-out norms in ``graph``, each as large as it goes."""
    taken: set = set()
    found = []
    for node in reversed(list(graph.nodes)):
        if node in taken:
            continue
        m = match_layer_norm(node) or match_rms_norm(node)
        if m is not None and not taken.intersection(m.nodes):
            found.append(m)
            taken.update(m.nodes)
    return found[::-1]
