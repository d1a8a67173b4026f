"""Build ONNX test models with onnx.helper, run them in onnxruntime (the reference) and through both of our
outputs: the LiteRT interpreter (edge) and PJRT CPU (the TPU backend's jax function, jitted on CPU).

Several rows share one model (each row's node reads its own inputs and writes its own outputs), so one
torch.export and one conversion per backend cover a whole family of rows.
"""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np

from tests.numerics import rel_err

__all__ = ["Init", "OnnxRow", "build_model", "run_ort", "run_ours", "compare"]


@dataclasses.dataclass
class Init:
    """An input given as an initializer (a weight, or a constant the importer folds)."""

    value: np.ndarray


@dataclasses.dataclass
class OnnxRow:
    id: str
    op: str
    inputs: list  # np arrays (graph inputs), Init (initializers) or None (absent optional input)
    attrs: dict = dataclasses.field(default_factory=dict)
    n_out: int = 1
    family: str = "misc"
    opset: int = 18
    domain: str = ""
    rtol: float = 1e-5
    why: str = ""  # required when rtol is looser than 1e-5, or with only
    only: str = ""  # "tpu": the edge backend does not lower the op this row needs (why says which)


def _name(row, i):
    return f"{row.id}__in{i}"


def build_model(rows: list[OnnxRow], opset: int, out_info=None):
    """One ModelProto holding every row's node. ``out_info``: {output name: (elem type, shape)} from a first
    onnxruntime run (outputs are typed from it); None gives untyped outputs for that first run."""
    import onnx
    from onnx import helper, numpy_helper

    nodes, inputs, inits, outputs = [], [], [], []
    domains = {""}
    for r in rows:
        names = []
        for i, v in enumerate(r.inputs):
            if v is None:
                names.append("")
                continue
            n = _name(r, i)
            names.append(n)
            if isinstance(v, Init):
                inits.append(numpy_helper.from_array(np.asarray(v.value), n))
            else:
                inputs.append(helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape))
        outs = [f"{r.id}__out{j}" for j in range(r.n_out)]
        nodes.append(helper.make_node(r.op, names, outs, name=r.id, domain=r.domain, **r.attrs))
        domains.add(r.domain)
        for o in outs:
            if out_info is None:
                outputs.append(helper.make_tensor_value_info(o, 1, None))  # typed by _inferred_types
            else:
                et, shape = out_info[o]
                outputs.append(helper.make_tensor_value_info(o, et, shape))
    g = helper.make_graph(nodes, "rows", inputs, outputs, inits)
    ops = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, 1) for d in sorted(domains - {""})]
    m = helper.make_model(g, opset_imports=ops)
    m.ir_version = 9 if opset <= 20 else 10
    if out_info is not None:
        onnx.checker.check_model(m)
    return m


def feeds(rows) -> dict:
    return {_name(r, i): v for r in rows for i, v in enumerate(r.inputs) if isinstance(v, np.ndarray)}


def run_ort(rows, opset):
    """onnxruntime's outputs {name: array} and the typed model built from them."""
    import onnxruntime as ort
    from onnx import helper

    first = build_model(rows, opset)
    types = _inferred_types(first)
    for o in first.graph.output:
        o.type.tensor_type.elem_type = types.get(o.name, 1)  # contrib ops have no ONNX inference: float
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # the reference: each op as written
    sess = ort.InferenceSession(first.SerializeToString(), so, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    vals = dict(zip(names, sess.run(None, feeds(rows))))
    info = {n: (helper.np_dtype_to_tensor_dtype(v.dtype), list(v.shape)) for n, v in vals.items()}
    return vals, build_model(rows, opset, info)


def _inferred_types(model) -> dict:
    import onnx

    m = onnx.ModelProto()
    m.CopyFrom(model)
    del m.graph.output[:]
    inferred = onnx.shape_inference.infer_shapes(m)
    return {vi.name: vi.type.tensor_type.elem_type for vi in inferred.graph.value_info}


def run_ours(model, rows):
    """(edge outputs, tpu outputs), each {output name: numpy array}: one import, one capture, two backends
    (edge outputs are None for rows marked only="tpu")."""
    import jax
    import torch

    from tpu_export import converter, litert_torch
    from tpu_export.converter.onnx import import_onnx
    from tpu_export.edge import convert_program
    from tpu_export.tpu_backend.lowering import lower_signature

    imp = import_onnx(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the 64->32-bit policy warns on int64 inputs
        prog = converter.prepare(imp.module, imp.sample_args, dynamic_shapes=imp.dynamic_shapes)
    sig = prog.signature()
    f = feeds(rows)
    args = [f[n] for n in imp.input_names]
    edge_out = None
    if not any(r.only == "tpu" for r in rows):
        edge_model = litert_torch.Model(convert_program(prog))
        cast = [torch.from_numpy(a).to(s.dtype) for a, s in zip(args, sig.inputs)]
        edge_out = {k: v.numpy() for k, v in edge_model(*cast).items()}
    low = lower_signature(prog)
    flat = [np.asarray(a).astype(dt) for a, dt in zip(args, low.input_dtypes)]
    tpu = jax.jit(low.fn)(low.weight_arrays(prog), *flat)
    tpu_out = {s.name: np.asarray(v) for s, v in zip(sig.outputs, tpu)}
    return edge_out, tpu_out


def compare(rows, want: dict, got: dict | None, backend: str) -> list[str]:
    """One line per row output that differs from onnxruntime beyond the row's tolerance."""
    bad = []
    if got is None:
        return bad
    for r in rows:
        for j in range(r.n_out):
            n = f"{r.id}__out{j}"
            w, g = want[n], got.get(n)
            if g is None:
                bad.append(f"{backend} {r.id}: output {j} missing")
                continue
            g = np.asarray(g)
            if g.shape != w.shape:
                bad.append(f"{backend} {r.id}: output {j} shape {g.shape} != onnxruntime's {w.shape}")
            elif np.issubdtype(w.dtype, np.floating):
                err = rel_err(g, w)
                if not err <= r.rtol:
                    bad.append(f"{backend} {r.id}: output {j} rel err {err:.3g} > {r.rtol}")
            elif not np.array_equal(g.astype(np.int64), w.astype(np.int64)):
                bad.append(f"{backend} {r.id}: output {j} differs from onnxruntime (exact compare)")
    return bad
