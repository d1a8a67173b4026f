"""Build time of the ONNX importer: check every node has an op function, parse and check attributes, fold
what constants alone determine (Constant nodes, shape arithmetic, Shape of shapes ONNX inference knows),
and keep the rest as the nodes the module runs. ``run_node`` is the one way an op function is called, at
build time and while tracing."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from .common import NoFold
from .load import OnnxImportError
from .registry import REQUIRED, load_ops

__all__ = ["UnsupportedOnnxOpsError", "NodeContext", "build_graph", "run_node", "to_torch",
           "OnnxGraph"]


class UnsupportedOnnxOpsError(OnnxImportError):
    """Nodes whose (domain, op_type, opset) the importer has no function for; all listed at once."""

    def __init__(self, where: str, missing: list[tuple[str, str, str, int]]):
        self.missing = missing
        kinds = sorted({(d, o, v) for _, o, d, v in missing})
        parts = [f"{where}: {len(missing)} node(s) of {len(kinds)} ONNX op(s) cannot be imported (nothing was built):"]
        for d, o, v in kinds:
            names = [n for n, oo, dd, vv in missing if (oo, dd, vv) == (o, d, v)]
            more = f" (+{len(names) - 5} more)" if len(names) > 5 else ""
            parts.append(f"  {d or 'ai.onnx'}::{o} opset {v}  x{len(names)}: {', '.join(names[:5])}{more}")
        parts.append("Fix: see docs/onnx_ops.md for the ops and opsets imported; re-export the model with those ops, "
                     "or convert it with onnx.version_converter to an opset in 13..21.")
        super().__init__("\n".join(parts))




@dataclasses.dataclass
class NodeContext:
    """What an op function knows of its node besides inputs and attributes."""

    name: str
    op_type: str
    opset: int
    n_out: int
    out_types: list  # ONNX element types of the outputs where inference knows them, else None
    out_shapes: list  # ints/None per dim where inference knows them, else None
    call: object = None  # the node's labelled caller (_node_call)

    def fail(self, msg: str):
        raise OnnxImportError(f"node {self.name!r} ({self.op_type}): {msg}")


def _attrs(ctx: NodeContext, spec, node) -> dict:
    from onnx import helper

    out = {}
    for a in node.attribute:
        if a.name not in spec.attrs:
            ctx.fail(f"attribute {a.name!r} is not supported (the importer takes {sorted(spec.attrs) or 'none'})")
        if a.ref_attr_name:
            ctx.fail(f"attribute {a.name!r} refers to a function attribute; only top-level graphs are imported")
        v = helper.get_attribute_value(a)
        if isinstance(v, bytes):
            v = v.decode()
        elif isinstance(v, list):
            v = [x.decode() if isinstance(x, bytes) else x for x in v]
        default = spec.attrs[a.name]
        if default is not REQUIRED and default is not None and not _same_kind(v, default):
            ctx.fail(f"attribute {a.name!r} is {v!r}, expected a {type(default).__name__}")
        out[a.name] = v
    for k, d in spec.attrs.items():
        if k not in out:
            if d is REQUIRED:
                ctx.fail(f"required attribute {k!r} is missing")
            out[k] = d
    return out


def _same_kind(v, default) -> bool:
    if isinstance(default, bool) or isinstance(default, int):
        return isinstance(v, int)
    if isinstance(default, float):
        return isinstance(v, (int, float))
    return isinstance(v, type(default))


def to_torch(v):
    if isinstance(v, np.ndarray):
        if v.dtype == object:
            return torch.tensor([int(x) if not isinstance(x, torch.SymInt) else x for x in v.reshape(-1)],
                                dtype=torch.int64).reshape(v.shape)
        # a copy where numpy's array is read-only or strided (np.ascontiguousarray would make 0-d arrays 1-d)
        return torch.from_numpy(v if v.flags.writeable and v.flags.c_contiguous else np.array(v, order="C"))
    return v


def _to_numpy(v):
    if isinstance(v, torch.Tensor):
        if v.dtype == torch.bfloat16:
            return v  # numpy has no bfloat16: keep a (real, eager) tensor
        return v.detach().numpy()
    return v


def _as_array(v):
    """A fold's result as an array: numpy gives bare scalars (a SymInt among them) for 0-d results."""
    if isinstance(v, np.ndarray) and v.dtype == object and all(isinstance(x, (int, np.integer)) for x in v.flat):
        return v.astype(np.int64)  # shape arithmetic that no longer involves a dynamic dim
    if isinstance(v, (np.ndarray, torch.Tensor)):
        return v
    if isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        out = np.empty((), dtype=object)
        out[()] = v
        return out
    return np.asarray(v)


def _as_list(v):
    return v if isinstance(v, (list, tuple)) else [v]


class OnnxGraph:
    """The build-time result: folded constants, the nodes left to run, the signature."""

    def __init__(self):
        self.consts: dict[str, np.ndarray] = {}
        self.nodes: list = []  # (spec, ctx, attrs, input names, output names)
        self.release = None  # release(view): a weight read from the file's map was copied (wire.MappedWeights)


def _static_shape(vi) -> list | None:
    t = vi.type.tensor_type
    if not t.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim]


def run_node(spec, ctx, attrs, inputs):
    """Call an op function on its inputs: numpy for static slots, tensors elsewhere. All inputs known and
    a numpy fold defined: the fold runs instead (shape arithmetic, SymInts included)."""
    present = [x for x in inputs if x is not None]
    if spec.fold is not None and all(isinstance(x, np.ndarray) for x in present):
        try:
            return [_as_array(v) for v in _as_list(spec.fold(ctx, *inputs, **attrs))]
        except NoFold:
            pass  # a result shaped by a dynamic dim: a tensor, made by the op's torch function
    args = []
    for i, x in enumerate(inputs):
        if i in spec.maybe_static:
            args.append(x)
        elif i in spec.static:
            if isinstance(x, torch.Tensor):
                ctx.fail(f"input {i} is computed at run time, but the importer needs it known when the model is "
                         "built. Fix: give the model's dynamic dims a size (dim_sizes={...}) or fold it with onnxsim")
            args.append(x)
        else:
            args.append(to_torch(x))
    return _as_list(spec.fn(ctx, *args, **attrs))


def build_graph(proto, inferred, where: str, opset: int, mapped=None) -> OnnxGraph:
    """The graph's constants folded and its runtime nodes listed. ``mapped``: the weights left in the file's
    map (converter/onnx/wire.py), read from there and copied once, when the build is done."""
    from onnx import numpy_helper

    table = load_ops()
    g = proto.graph
    opsets = {(o.domain or ""): o.version for o in proto.opset_import}
    missing = []
    for i, node in enumerate(g.node):
        dom = "" if node.domain in ("", "ai.onnx") else node.domain
        ver = opsets.get(dom, 1)
        if table.lookup(dom, node.op_type, ver) is None:
            missing.append((node.name or f"#{i}", node.op_type, dom, ver))
    if missing:
        raise UnsupportedOnnxOpsError(where, missing)

    shapes, types = {}, {}
    for vi in list(inferred.graph.value_info) + list(inferred.graph.output) + list(inferred.graph.input):
        shapes[vi.name] = _static_shape(vi)
        types[vi.name] = vi.type.tensor_type.elem_type or None
    out = OnnxGraph()
    out.release = mapped.release if mapped is not None else None
    for i, t in enumerate(g.initializer):
        out.consts[t.name] = mapped.array(i, t, where) if mapped is not None and i in mapped else \
            numpy_helper.to_array(t)
    for i, node in enumerate(g.node):
        dom = "" if node.domain in ("", "ai.onnx") else node.domain
        spec = table.lookup(dom, node.op_type, opsets.get(dom, 1))
        ctx = NodeContext(node.name or f"#{i}", node.op_type, opsets.get(dom, 1), len(node.output),
                          [types.get(o) for o in node.output], [shapes.get(o) for o in node.output])
        attrs = _attrs(ctx, spec, node)
        names = list(node.input)
        known = [n == "" or n in out.consts for n in names]
        folded = None
        if node.op_type == "Shape" and dom == "" and names[0] not in out.consts:
            s = shapes.get(names[0])
            if s is not None and all(d is not None and d > 0 for d in s):
                folded = [_shape_slice(np.asarray(s, dtype=np.int64), attrs)]
        elif all(known):
            vals = [out.consts[n] if n else None for n in names]
            cap = _fold_cap(vals)
            _check_fold(ctx, [_planned_bytes(s, t) for s, t in zip(ctx.out_shapes, ctx.out_types)]
                        + [_shaped_by_input(node.op_type, vals)], cap)
            try:
                with torch.no_grad():
                    folded = [_to_numpy(v) for v in run_node(spec, ctx, attrs, vals)]
            except OnnxImportError:
                raise
            except Exception as e:  # noqa: BLE001 - an op function's error names its node
                ctx.fail(f"{type(e).__name__}: {' '.join(str(e).split())[:300]}")
            _check_fold(ctx, [getattr(v, "nbytes", 0) for v in folded], cap)
        if folded is not None:
            for o, v in zip(node.output, folded):
                if o:
                    out.consts[o] = v
        else:
            out.nodes.append((spec, ctx, attrs, names, list(node.output)))
    from .fuse import fuse_gelu, fuse_linear

    # after folding, so that the patterns' constants (Constant nodes, initializers) are values to check
    fuse_gelu(out, [o.name for o in g.output], table)
    fuse_linear(out, [o.name for o in g.output], table)  # a weight it transposes is copied from the map there
    if mapped is not None:
        for k, v in out.consts.items():
            if mapped.owns(v):  # the map closes with the import: what the module keeps is copied out, once
                out.consts[k] = np.array(v, order="C")
                mapped.release(v)
    return out


def _fold_cap(inputs) -> int:
    """The most bytes one folded constant may take: the fold cap (converter/untrusted.py's ``fold``), or twice
    the inputs' bytes where they are larger (a Transpose or Cast of a large weight is no bomb)."""
    from ..untrusted import limit

    return max(limit("fold"), 2 * sum(getattr(v, "nbytes", 0) for v in inputs if v is not None))


def _planned_bytes(shape, onnx_type) -> int:
    """Bytes of an output whose shape and type inference knows, or 0 (the fold's result is checked instead)."""
    if shape is None or onnx_type is None or any(d is None for d in shape):
        return 0
    from onnx import helper

    try:
        item = np.dtype(helper.tensor_dtype_to_np_dtype(onnx_type)).itemsize
    except (KeyError, TypeError, ValueError):
        item = 1
    n = item
    for d in shape:
        n *= int(d)
    return n


def _shaped_by_input(op_type: str, vals) -> int:
    """Bytes (at 1 per element) of the result of an op whose output size a shape input sets, from the inputs
    alone: inference may not know it, and the fold must not allocate it to find out."""
    try:
        if op_type == "Expand" and len(vals) == 2:
            x, shape = (np.asarray(v) for v in vals)
            dims = [int(d) for d in shape.reshape(-1)]
            lead = [1] * max(0, len(x.shape) - len(dims)) + dims
            xs = [1] * max(0, len(dims) - len(x.shape)) + list(x.shape)
            return int(np.prod([max(a, b) for a, b in zip(xs, lead)], dtype=object)) * x.itemsize
        if op_type == "ConstantOfShape" and vals:
            return int(np.prod([int(d) for d in np.asarray(vals[0]).reshape(-1)], dtype=object))
        if op_type == "Tile" and len(vals) == 2:
            x, reps = (np.asarray(v) for v in vals)
            return x.nbytes * int(np.prod([int(r) for r in reps.reshape(-1)], dtype=object))
    except (TypeError, ValueError):
        pass
    return 0


def _check_fold(ctx, sizes, cap: int) -> None:
    """Refuse a constant fold past the cap (a tiny Expand or ConstantOfShape can ask for gigabytes)."""
    big = max(sizes, default=0)
    if big > cap:
        ctx.fail(f"folding it when the model is built makes a {big}-byte constant, more than the {cap}-byte cap; "
                 "refused (a few bytes of graph asking for that much memory is a hostile or broken model). Fix: "
                 "check the model's shape inputs, or raise the cap with TPU_EXPORT_MAX_FOLD_BYTES")


def _shape_slice(s: np.ndarray, attrs) -> np.ndarray:
    n = len(s)
    start, end = attrs.get("start", 0), attrs.get("end")
    start = min(max(start + n if start < 0 else start, 0), n)
    end = n if end is None else min(max(end + n if end < 0 else end, 0), n)
    return s[start:end]
