"""ONNX graph -> a torch ``nn.Module`` whose forward runs the graph node by node with torch ops.

The module then goes through the ordinary capture (torch.export) -> Program pipeline, so every
target, quantization and report works on it unchanged. At build time:

- every node's op must be in the table (converter/onnx/registry.py); all the missing ones are
  listed in one error before anything is built;
- initializers become parameters (floats) or buffers, their names kept (dots become submodules);
- values computable from constants alone (Constant nodes, shape arithmetic, Shape of a value
  whose shape ONNX inference knows) are folded here, in Python, so the captured graph has static
  sizes wherever the file allows; what depends on a dynamic dim is folded while tracing, on
  numpy arrays of SymInts;
- graph inputs give the signature: names kept (made identifiers), shapes and dtypes from the
  graph, ``dim_param`` dims dynamic (a torch.export Dim) unless ``dim_sizes`` fixes them.
"""

from __future__ import annotations

import dataclasses
import inspect
import re

import numpy as np
import torch

from .common import NoFold
from .load import OnnxImportError, check_and_infer, load_model
from .registry import CONTRIB_DOMAIN, ONNX_OPSETS, REQUIRED, load_ops

__all__ = ["ImportedOnnx", "import_onnx", "capture_inputs", "UnsupportedOnnxOpsError", "NodeContext", "ONNX_DTYPES"]


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


# ONNX TensorProto element type -> torch dtype
ONNX_DTYPES = {1: torch.float32, 2: torch.uint8, 3: torch.int8, 5: torch.int16, 6: torch.int32, 7: torch.int64,
               9: torch.bool, 10: torch.float16, 11: torch.float64, 12: torch.uint32, 13: torch.uint64,
               16: torch.bfloat16}


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


@dataclasses.dataclass
class ImportedOnnx:
    module: torch.nn.Module
    sample_args: tuple
    dynamic_shapes: tuple | None
    input_names: list
    output_names: list


def _ident(name: str, taken: set) -> str:
    s = re.sub(r"\W", "_", name) or "input"
    if s[0].isdigit():
        s = "_" + s
    while s in taken or s in ("self",) or not s.isidentifier():
        s += "_"
    taken.add(s)
    return s


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


def _to_torch(v):
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


def _int_array(values) -> np.ndarray:
    """Shape values (ints and SymInts) as an int64 array, or an object array while any is symbolic."""
    vals = list(values)
    if all(isinstance(x, (int, np.integer)) for x in vals):
        return np.asarray(vals, dtype=np.int64)
    return np.asarray(vals + [None], dtype=object)[:-1]


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


class _Graph:
    """The build-time result: folded constants, the nodes left to run, the signature."""

    def __init__(self):
        self.consts: dict[str, np.ndarray] = {}
        self.nodes: list = []  # (spec, ctx, attrs, input names, output names)


def _static_shape(vi) -> list | None:
    t = vi.type.tensor_type
    if not t.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim]


def _run(spec, ctx, attrs, inputs):
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
            args.append(_to_torch(x))
    return _as_list(spec.fn(ctx, *args, **attrs))


def build_graph(proto, inferred, where: str, opset: int) -> _Graph:
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
    out = _Graph()
    for t in g.initializer:
        out.consts[t.name] = numpy_helper.to_array(t)
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
            try:
                with torch.no_grad():
                    folded = [_to_numpy(v) for v in _run(spec, ctx, attrs, vals)]
            except OnnxImportError:
                raise
            except Exception as e:  # noqa: BLE001 - an op function's error names its node
                ctx.fail(f"{type(e).__name__}: {' '.join(str(e).split())[:300]}")
        if folded is not None:
            for o, v in zip(node.output, folded):
                if o:
                    out.consts[o] = v
        else:
            out.nodes.append((spec, ctx, attrs, names, list(node.output)))
    return out


def _shape_slice(s: np.ndarray, attrs) -> np.ndarray:
    n = len(s)
    start, end = attrs.get("start", 0), attrs.get("end")
    start = min(max(start + n if start < 0 else start, 0), n)
    end = n if end is None else min(max(end + n if end < 0 else end, 0), n)
    return s[start:end]


def _node_call(ctx):
    """A one-line caller whose code carries the ONNX node's name and op as its file name: torch.export records
    that frame in each captured node's stack trace, so a backend's "op X cannot be lowered ... at <line>" names
    the ONNX node. The code is our fixed text; only the label comes from the model file."""
    if ctx.call is None:
        ns: dict = {}
        label = f"<ONNX node {ctx.name!r} ({ctx.op_type})>"
        exec(compile("def forward(run, *a):\n    return run(*a)\n", label, "exec"), ns)  # noqa: S102 - fixed code
        ctx.call = ns["forward"]
    return ctx.call


def _numpy_slot(spec, i: int, value) -> bool:
    """Whether a constant reaches input ``i`` of ``spec`` as numpy: static slots, and small integer constants of
    ops with a numpy fold (shape arithmetic: Concat([dynamic batch], [-1]) must stay foldable)."""
    if i in spec.static or i in spec.maybe_static:
        return True
    return (spec.fold is not None and isinstance(value, np.ndarray) and value.size <= 1024
            and (value.dtype.kind in "iub"))


class OnnxModule(torch.nn.Module):
    """Runs the runtime nodes of an imported ONNX graph with torch ops (see the module docstring)."""

    def __init__(self, graph: _Graph, input_names: list, output_names: list, where: str):
        super().__init__()
        self._nodes = graph.nodes
        self._inputs = input_names
        self._outputs = output_names
        self._where = where
        self._static: dict[str, np.ndarray] = {}  # consts read at static slots only: kept as numpy
        self._paths: dict[str, str] = {}  # const name -> attribute path of its parameter/buffer
        as_tensor = set()
        for spec, _, _, names, _ in self._nodes:
            for i, n in enumerate(names):
                if n in graph.consts:
                    if _numpy_slot(spec, i, graph.consts[n]):
                        self._static[n] = graph.consts[n]
                    else:
                        as_tensor.add(n)
        as_tensor |= {n for n in output_names if n in graph.consts}
        for n in sorted(as_tensor):
            self._paths[n] = self._attach(n, _to_torch(graph.consts[n]))

    def _attach(self, name: str, t: torch.Tensor) -> str:
        param = t.is_floating_point()
        parts = name.split(".")
        owner, path = self, []
        try:
            for p in parts[:-1]:
                if p in owner._buffers or p in owner._parameters or not p:
                    raise KeyError(p)
                if p not in owner._modules:
                    owner.add_module(p, torch.nn.Module())
                owner, path = owner._modules[p], path + [p]
            leaf = parts[-1]
            if not leaf or leaf in owner._modules:
                raise KeyError(leaf)
            # t owns its memory (a fresh array from numpy_helper or a fold): no copy, so a big model's weights
            # are held once here
            if param:
                owner.register_parameter(leaf, torch.nn.Parameter(t, requires_grad=False))
            else:
                owner.register_buffer(leaf, t)
            return ".".join(path + [leaf])
        except KeyError:
            # a name that clashes with another's path or a Module attribute: stored under a made-up name
            leaf = f"onnx_const_{len(self._paths)}"
            (self.register_parameter(leaf, torch.nn.Parameter(t, requires_grad=False)) if param
             else self.register_buffer(leaf, t))
            return leaf

    def _const(self, name: str, static: bool = False):
        if name not in self._paths or (static and name in self._static):
            return self._static[name]
        obj = self
        for p in self._paths[name].split("."):
            obj = getattr(obj, p)
        return obj

    def forward(self, *args):
        env = dict(zip(self._inputs, args))
        for spec, ctx, attrs, names, outs in self._nodes:
            vals = []
            for i, n in enumerate(names):
                if not n:
                    vals.append(None)
                elif n in env:
                    vals.append(env[n])
                else:
                    vals.append(self._const(n, _numpy_slot(spec, i, self._static.get(n))))
            try:
                res = _node_call(ctx)(_run, spec, ctx, attrs, vals)
            except OnnxImportError:
                raise
            except Exception as e:  # noqa: BLE001
                if type(e).__module__.startswith("torch._dynamo") or "GuardOnDataDependent" in type(e).__name__:
                    raise
                ctx.fail(f"{type(e).__name__}: {' '.join(str(e).split())[:300]}")
            for o, v in zip(outs, res):
                if o:
                    env[o] = v
        result = {}
        for n in self._outputs:
            v = env[n] if n in env else self._const(n)
            result[n] = _to_torch(v) if isinstance(v, np.ndarray) else v
        return result


def import_onnx(model, sample_args=None, *, dim_sizes=None, base_dir=None) -> ImportedOnnx:
    """Build the torch module of an ONNX model (a path, bytes or an onnx.ModelProto).

    ``dim_sizes``: {dim_param: size} fixes named dims; the other named dims stay dynamic (a torch.export
    Dim each, one per name, shared by every input that uses it). ``sample_args``: tensors to trace with
    (default: seeded random values of the graph inputs' shapes and dtypes).
    """
    proto, where = load_model(model, base_dir)
    opsets = {(o.domain or ""): o.version for o in proto.opset_import}
    opset = opsets.get("", opsets.get("ai.onnx", 0))
    if not ONNX_OPSETS[0] <= opset <= ONNX_OPSETS[1]:
        raise OnnxImportError(
            f"{where}: the model's default-domain opset is {opset}; the importer takes opsets {ONNX_OPSETS[0]}.."
            f"{ONNX_OPSETS[1]}. Fix: onnx.version_converter.convert_version(model, 17), then import that")
    for d, v in opsets.items():
        if d not in ("", "ai.onnx", CONTRIB_DOMAIN):
            used = [n.name or n.op_type for n in proto.graph.node if n.domain == d]
            if used:
                raise OnnxImportError(f"{where}: node(s) {', '.join(used[:5])} use domain {d!r} (opset {v}), which "
                                      f"the importer does not know (it takes ai.onnx and {CONTRIB_DOMAIN}). Fix: "
                                      "re-export without custom ops, or inline the model's local functions")
    dim_sizes = dict(dim_sizes or {})
    inferred = check_and_infer(proto, where, {k: v for k, v in dim_sizes.items() if isinstance(v, int)})
    init_names = {t.name for t in proto.graph.initializer}
    graph_inputs = [vi for vi in proto.graph.input if vi.name not in init_names]
    graph = build_graph(proto, inferred, where, opset)
    samples, dyn, names = _signature(graph_inputs, sample_args, dim_sizes, where)
    outputs = [o.name for o in proto.graph.output]
    module = OnnxModule(graph, [vi.name for vi in graph_inputs], outputs, where).eval()
    params = [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in names]
    # torch.export names the signature's inputs after forward's parameters: the graph's input names
    module.forward = _bound_forward(module, inspect.Signature(params))
    return ImportedOnnx(module, samples, dyn, names, outputs)


def _bound_forward(module, sig):
    cls_forward = type(module).forward

    def forward(*args):
        return cls_forward(module, *args)

    forward.__signature__ = sig
    return forward


def _signature(graph_inputs, sample_args, dim_sizes, where):
    taken: set = set()
    names = [_ident(vi.name, taken) for vi in graph_inputs]
    if sample_args is not None:
        sample_args = tuple(sample_args) if isinstance(sample_args, (tuple, list)) else (sample_args,)
        if len(sample_args) != len(graph_inputs):
            raise OnnxImportError(f"{where}: the graph takes {len(graph_inputs)} input(s) "
                                  f"{[vi.name for vi in graph_inputs]}; got {len(sample_args)} sample input(s)")
    dims: dict[str, torch.export.Dim] = {}
    sizes: dict[str, int] = {}
    samples, dyn = [], []
    g = torch.Generator().manual_seed(0)
    for k, vi in enumerate(graph_inputs):
        tt = vi.type.tensor_type
        if not vi.type.HasField("tensor_type"):
            raise OnnxImportError(f"{where}: input {vi.name!r} is not a tensor (sequences, maps and optionals are "
                                  "not imported)")
        dtype = ONNX_DTYPES.get(tt.elem_type)
        if dtype is None:
            raise OnnxImportError(f"{where}: input {vi.name!r} has ONNX element type {tt.elem_type}, which the "
                                  "importer does not take")
        shape, spec = [], {}
        for i, d in enumerate(tt.shape.dim):
            if d.HasField("dim_value"):
                shape.append(d.dim_value)
            elif d.HasField("dim_param") and d.dim_param:
                p = d.dim_param
                if isinstance(dim_sizes.get(p), int):
                    shape.append(dim_sizes[p])
                    continue
                if p not in dims:
                    lo, hi = dim_sizes.get(p, (1, None)) if isinstance(dim_sizes.get(p), tuple) else (1, None)
                    dims[p] = torch.export.Dim(_ident(p, set()), min=max(lo, 1), **({"max": hi} if hi else {}))
                    sizes[p] = max(lo, 2) + len(sizes)  # distinct sizes: torch would take equal ones as one dim
                spec[i] = dims[p]
                shape.append(sizes[p])
            elif sample_args is not None:
                shape.append(None)
            else:
                raise OnnxImportError(f"{where}: input {vi.name!r} dim {i} has neither a size nor a name. Fix: pass "
                                      "sample inputs, or set the dim in the file (onnx.tools.update_model_dims)")
        if sample_args is not None:
            x = torch.as_tensor(sample_args[k])
            if x.dim() != len(shape) or any(s is not None and s != v for s, v in zip(shape, x.shape) if s is not None
                                            and not spec):
                raise OnnxImportError(f"{where}: sample input {vi.name!r} has shape {list(x.shape)}; the graph "
                                      f"declares {[d.dim_value or d.dim_param or '?' for d in tt.shape.dim]}")
            samples.append(x.to(dtype))
        elif dtype.is_floating_point:
            samples.append(torch.randn(shape, generator=g).to(dtype))
        else:
            samples.append(torch.zeros(shape, dtype=dtype))
        dyn.append(spec or None)
    return tuple(samples), (tuple(dyn) if dims else None), names


def capture_inputs(model, sample_args=None, dynamic_shapes=None, dim_sizes=None) -> tuple:
    """(module, sample_args, dynamic_shapes) to capture an ONNX model with: what the entry points
    (tpu_export.convert, litert_torch.convert, the CLI) call for an .onnx path or a ModelProto. A caller's
    dynamic_shapes replace the ones made from the graph's dim_params."""
    imp = import_onnx(model, sample_args, dim_sizes=dim_sizes)
    return imp.module, imp.sample_args, (dynamic_shapes if dynamic_shapes is not None else imp.dynamic_shapes)
