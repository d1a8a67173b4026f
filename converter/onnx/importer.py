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
- node patterns a backend runs better as one op are then folded (converter/onnx/fuse.py): GELU written
  out as Erf/Tanh arithmetic -> one GELU, MatMul + Add with constant weights -> one linear layer;
- graph inputs give the signature: names kept (made identifiers), shapes and dtypes from the
  graph, ``dim_param`` dims dynamic (a torch.export Dim) unless ``dim_sizes`` fixes them.
"""

from __future__ import annotations

import dataclasses
import inspect
import re

import torch

from .common import ONNX_DTYPES
from .graph import UnsupportedOnnxOpsError, build_graph
from .load import OnnxImportError, check_and_infer, load_model
from .module import OnnxModule
from .registry import CONTRIB_DOMAIN, ONNX_OPSETS

__all__ = ["ImportedOnnx", "import_onnx", "capture_inputs", "UnsupportedOnnxOpsError", "ONNX_DTYPES"]


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


def import_onnx(model, sample_args=None, *, dim_sizes=None, base_dir=None) -> ImportedOnnx:
    """Build the torch module of an ONNX model (a path, bytes or an onnx.ModelProto).

    ``dim_sizes``: {dim_param: size} fixes named dims; the other named dims stay dynamic (a torch.export
    Dim each, one per name, shared by every input that uses it). ``sample_args``: tensors to trace with
    (default: seeded random values of the graph inputs' shapes and dtypes).
    """
    proto, where, mapped = load_model(model, base_dir)
    try:
        return _import(proto, where, mapped, sample_args, dim_sizes)
    finally:
        if mapped is not None:
            mapped.close()  # each weight the module keeps was copied out of the file's map


def _import(proto, where, mapped, sample_args, dim_sizes) -> ImportedOnnx:
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
    inferred = check_and_infer(proto, where, {k: v for k, v in dim_sizes.items() if isinstance(v, int)}, mapped)
    init_names = {t.name for t in proto.graph.initializer}
    graph_inputs = [vi for vi in proto.graph.input if vi.name not in init_names]
    graph = build_graph(proto, inferred, where, opset, mapped)
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
                    # distinct sizes (torch would take equal ones for one dim), not 0 or 1 (torch specializes them)
                    sizes[p] = min(max(lo, 2) + len(sizes), hi) if hi else max(lo, 2) + len(sizes)
                spec[i] = dims[p]
                shape.append(sizes[p])
            elif sample_args is not None:
                shape.append(None)
            else:
                raise OnnxImportError(f"{where}: input {vi.name!r} dim {i} has neither a size nor a name. Fix: pass "
                                      "sample inputs, or set the dim in the file (onnx.tools.update_model_dims)")
        if sample_args is not None:
            x = torch.as_tensor(sample_args[k])
            if x.dim() != len(shape) or any(s is not None and i not in spec and s != v
                                            for i, (s, v) in enumerate(zip(shape, x.shape))):
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
