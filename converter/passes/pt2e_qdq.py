"""Fold a PT2E-quantized graph's quantize / dequantize pairs into annotations on a float graph.

``convert_pt2e`` (torchao, or torch.ao before it) leaves ``quantized_decomposed`` ops around every value its
quantizer observed: ``dequantize(quantize(x, s, zp))`` on activations, the same (or a ``dequantize`` of a
stored int8 tensor) on weights. The backends want the float graph and the ranges: this pass removes each pair
and records what it meant.

- A weight's pair becomes one float weight holding exactly the dequantized values (on the int8 grid), its
  placeholder annotated ``meta["pt2e_qparams"]`` (per-channel scales and axis, or one scale): the edge stores it
  int8 with those scales, the TPU backend as int8 + scales.
- An activation's pair is dropped (its readers read ``x`` again) and ``x``'s node is annotated with the scale
  and zero point the observer chose: the edge runs the ops between annotated values as int8 kernels.
- A value read at two ranges (one reader's dequantize fed to another quantize) gets, for the second range, a
  copy of its own (``clone``, ``meta["pt2e_requant"]``): a requantize on the edge, a second rounding on the TPU.
- A dynamic pair (``choose_qparams`` then quantize / dequantize by its result) is dropped with no annotation:
  LiteRT's dynamic-range kernels pick the ranges as they run.

The graph is left computing the float model with fake-quantized weights; every op of the namespaces
``quantized_decomposed`` / ``torchao`` that is not one of these patterns is refused by name.
"""

from __future__ import annotations

import dataclasses
import operator

import torch

from ..program import Program
from ._util import add_weight, weight_of

__all__ = ["fold_pt2e_qdq", "QParams", "PT2E_META", "REQUANT_META"]

PT2E_META = "pt2e_qparams"
REQUANT_META = "pt2e_requant"  # a copy of a quantized value at a second range (a clone the backends keep)
_NAMESPACES = ("quantized_decomposed", "torchao")


@dataclasses.dataclass(frozen=True)
class QParams:
    """How a value is stored as integers: ``real = (q - zero_point) * scale``.

    ``scale`` / ``zero_point``: floats / ints for a per-tensor value, tuples (one per slice along ``axis``)
    for a per-channel weight; ``qmin`` / ``qmax`` / ``dtype`` ("int8", "uint8", "int16"): the integer range."""

    scale: float | tuple
    zero_point: int | tuple
    qmin: int
    qmax: int
    dtype: str
    axis: int | None = None

    @property
    def per_channel(self) -> bool:
        return self.axis is not None


class Pt2eGraphError(ValueError):
    """A quantize / dequantize op in a pattern the converter does not fold (named, with the fix)."""


def _kind(n) -> str | None:
    if n.op != "call_function" or not hasattr(n.target, "name"):
        return None
    try:
        ns, name = n.target.name().split("::", 1)
    except (AttributeError, ValueError):
        return None
    return name.split(".")[0] if ns in _NAMESPACES else None


def _scalar(prog, v) -> float | int:
    t = weight_of(prog, v) if isinstance(v, torch.fx.Node) else v
    if isinstance(t, torch.Tensor):
        return t.reshape(-1)[0].item()
    return v


def _dtype_name(d) -> str:
    return str(d).replace("torch.", "")


def _params(prog, dq) -> QParams:
    """QParams of a dequantize node from its arguments (scale, zero point, [axis], qmin, qmax, dtype)."""
    kind = _kind(dq)
    a = list(dq.args) + [dq.kwargs[k] for k in ("quant_min", "quant_max", "dtype") if k in dq.kwargs]
    if kind == "dequantize_per_channel":
        scale, zp = weight_of(prog, a[1]), weight_of(prog, a[2])
        if scale is None or zp is None:
            raise Pt2eGraphError(f"{dq.name}: dequantize_per_channel with computed scales; only stored per-channel "
                                 "scales (convert_pt2e's) are supported")
        return QParams(tuple(float(s) for s in scale.reshape(-1).tolist()),
                       tuple(int(z) for z in zp.reshape(-1).tolist()), int(a[4]), int(a[5]), _dtype_name(a[6]),
                       axis=int(a[3]))
    return QParams(float(_scalar(prog, a[1])), int(_scalar(prog, a[2])), int(_scalar(prog, a[3])),
                   int(_scalar(prog, a[4])), _dtype_name(a[5]))


def _is_dynamic(q) -> bool:
    """A quantize whose scale is computed in the graph (choose_qparams), not stored."""
    if len(q.args) < 2:
        return False
    s = q.args[1]
    if not isinstance(s, torch.fx.Node):
        return False
    src = s.args[0] if s.target is operator.getitem else s
    return isinstance(src, torch.fx.Node) and (_kind(src) or "").startswith("choose_qparams")


def _constant(prog, node, depth: int = 0):
    """The value of ``node`` when it is a weight or computed from weights alone (a transposed or scaled weight
    that the quantizer observed as the weight), else None."""
    w = weight_of(prog, node)
    if w is not None or not isinstance(node, torch.fx.Node) or node.op != "call_function" or depth > 8:
        return w
    if _kind(node) or not hasattr(node.target, "name"):
        return None
    args = []
    for a in node.args:
        if isinstance(a, torch.fx.Node):
            a = _constant(prog, a, depth + 1)
            if a is None:
                return None
        elif isinstance(a, (list, tuple)) and any(isinstance(x, torch.fx.Node) for x in a):
            return None
        args.append(a)
    if any(isinstance(v, torch.fx.Node) for v in node.kwargs.values()):
        return None
    try:
        with torch.no_grad():
            out = node.target(*args, **node.kwargs)
    except Exception:  # noqa: BLE001 - not computable from the weights alone: the caller treats it as an activation
        return None
    return out if isinstance(out, torch.Tensor) else None


def _run(node, args):
    """Evaluate quantize / dequantize ``node`` on real tensors (its own op: bit-exact with torch's model)."""
    with torch.no_grad():
        return node.target(*args, **node.kwargs)


def _real_args(prog, node, first):
    return [first] + [weight_of(prog, a) if isinstance(a, torch.fx.Node) else a for a in node.args[1:]]


def fold_pt2e_qdq(prog: Program) -> None:
    """Fold every PT2E quantize / dequantize pair of ``prog`` (see the module docstring); a graph without them
    is left as it is. Each signature's ``graph_module.meta["pt2e"]`` counts what was folded."""
    for sig in prog.signatures.values():
        graph = sig.graph
        dqs = [n for n in graph.nodes if (_kind(n) or "").startswith("dequantize")]
        if not dqs and not any(_kind(n) for n in graph.nodes):
            continue
        stats = {"weights": 0, "activations": 0, "dynamic": 0, "requantized": 0}
        for dq in dqs:
            _fold_one(prog, sig, dq, stats)
        for n in reversed(list(graph.nodes)):  # the quantizes and choose_qparams left unread
            if n.users or not (_kind(n) or n.target is operator.getitem):
                continue
            if n.target is operator.getitem and not (isinstance(n.args[0], torch.fx.Node) and _kind(n.args[0])):
                continue
            graph.erase_node(n)
        left = sorted({f"{n.target.name()} ({n.name})" for n in graph.nodes if _kind(n)})
        if left:
            raise Pt2eGraphError(f"signature {sig.name!r}: quantization ops the converter does not fold: "
                                 f"{', '.join(left)}; the converter takes convert_pt2e's quantize/dequantize pairs "
                                 "(per-tensor activations, per-tensor or per-channel weights)")
        sig.graph_module.meta["pt2e"] = stats


def _fold_one(prog, sig, dq, stats) -> None:
    src = dq.args[0]
    kind = _kind(src) if isinstance(src, torch.fx.Node) else None
    stored = weight_of(prog, src)
    if kind is not None and kind.startswith("quantize") and _is_dynamic(src):
        dq.replace_all_uses_with(src.args[0])
        sig.graph.erase_node(dq)
        stats["dynamic"] += 1
        return
    qp = _params(prog, dq)
    if stored is not None:  # fold_quantize=True: the weight is stored as integers
        x_node, real = src, _run(dq, _real_args(prog, dq, stored))
    elif kind in ("quantize_per_tensor", "quantize_per_channel"):
        x_node = src.args[0]
        w = _constant(prog, x_node)
        real = None if w is None else _run(dq, _real_args(prog, dq, _run(src, _real_args(prog, src, w))))
    else:
        raise Pt2eGraphError(f"{dq.name}: {dq.target.name()} reads {getattr(src, 'name', src)!r}, not a quantize "
                             "op or a stored weight; export the module that convert_pt2e returned, unchanged")
    if real is not None:  # a weight: one float weight on the int8 grid, annotated
        name = x_node.meta.get("weight_name", x_node.name)
        node = add_weight(prog, sig, f"{name}.pt2e", real.to(torch.float32).contiguous())
        node.meta[PT2E_META] = qp
        dq.replace_all_uses_with(node)
        sig.graph.erase_node(dq)
        stats["weights"] += 1
        return
    if qp.per_channel:
        raise Pt2eGraphError(f"{dq.name}: a per-channel quantized activation; LiteRT's int8 activations are "
                             "per tensor (use a per-tensor activation spec)")
    have = x_node.meta.get(PT2E_META)
    if have is not None and have != qp:
        # the value read again at another range (a sigmoid's fixed output range requantized for a mul's input): a
        # copy of its own carries the second range (the edge requantizes int8 to int8, the TPU rounds it again)
        with sig.graph.inserting_before(dq):
            copy = sig.graph.call_function(torch.ops.aten.clone.default, (x_node,),
                                           {"memory_format": torch.contiguous_format})
        copy.meta["val"] = x_node.meta.get("val")
        copy.meta[PT2E_META] = qp
        copy.meta[REQUANT_META] = True
        dq.replace_all_uses_with(copy)
        stats["requantized"] += 1
    else:
        x_node.meta[PT2E_META] = qp
        dq.replace_all_uses_with(x_node)
    sig.graph.erase_node(dq)
    stats["activations"] += 1
