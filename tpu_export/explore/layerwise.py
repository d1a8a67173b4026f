"""Layer-by-layer comparison of an artifact with torch eager: every intermediate tensor on both sides.

The torch side runs the captured core-ATen graph op by op in torch (the same graph both backends lower), so
each of its nodes has a value. The .tflite side runs in the LiteRT interpreter with every intermediate tensor
kept (``experimental_preserve_all_tensors``); its tensors carry the graph's stable names (``<module
path>/<op>``, converter/passes/naming.py), which map them back to the torch nodes. The TPU side is a debug
export of the signature: the same lowering, with every node's value as an extra output, run on jax's CPU
backend; the artifact's own outputs are compared too.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any

import numpy as np

__all__ = ["LayerRow", "CompareResult", "compare"]

DEFAULT_TOLERANCE = 1e-3


@dataclasses.dataclass
class LayerRow:
    """One torch node next to the artifact's value of it."""

    node: str  # the fx node's name
    tensor_name: str  # its stable name, '<module path>/<op>' (converter/passes/naming.py)
    op: str  # its ATen op
    module: str  # the torch module path it sits in ("" at top level)
    source: str  # the user's source line (torch.export's stack trace)
    artifact_tensor: str  # the artifact's tensor holding it (a .tflite tensor name, or the debug export's output)
    shape: tuple
    max_abs: float
    max_rel: float  # max_abs / max |torch value| (0 when both are all zeros)
    over: bool  # past the tolerance

    def as_dict(self) -> dict:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in dataclasses.asdict(self).items()}


@dataclasses.dataclass
class CompareResult:
    """The per-layer table of one compare() run."""

    artifact: str
    kind: str  # "tflite" or "tpu"
    signature: str
    tolerance: float
    rows: list  # LayerRow, in graph order
    outputs: dict  # output name -> {"max_abs", "max_rel"}: the artifact's own outputs against torch eager

    @property
    def first_divergence(self) -> LayerRow | None:
        """The first node (in graph order) whose error is past the tolerance: where the artifact goes wrong."""
        return next((r for r in self.rows if r.over), None)

    def table(self) -> str:
        """The table ``tpu-export compare`` prints."""
        head = f"{'node':28s} {'module':24s} {'max abs':>10s} {'max rel':>10s}  source"
        lines = [f"{self.artifact} [{self.kind}, signature {self.signature}] vs torch eager, "
                 f"tolerance {self.tolerance:g} (max rel)", head]
        first = self.first_divergence
        for r in self.rows:
            mark = " <- first past tolerance" if r is first else (" !" if r.over else "")
            lines.append(f"{r.node[:28]:28s} {r.module[:24]:24s} {r.max_abs:10.3g} {r.max_rel:10.3g}  "
                         f"{_short(r.source)}{mark}")
        for name, e in self.outputs.items():
            lines.append(f"output {name}: max abs {e['max_abs']:.3g}, max rel {e['max_rel']:.3g}")
        off = [n for n, e in self.outputs.items() if e["max_rel"] > self.tolerance]
        if first is None and off:
            lines.append(f"every compared node is within {self.tolerance:g}, but output(s) {', '.join(off)} are "
                         "past it (errors that build up over nodes each within it)")
        elif first is None:
            lines.append(f"every compared node is within {self.tolerance:g}")
        else:
            lines.append(f"first node past {self.tolerance:g}: {first.node} ({first.op}) in module "
                         f"{first.module or '<top>'} at {first.source}: max rel {first.max_rel:.3g}")
        return "\n".join(lines)

    def as_dict(self) -> dict:
        first = self.first_divergence
        return {"artifact": self.artifact, "kind": self.kind, "signature": self.signature,
                "tolerance": self.tolerance, "first_divergence": first.node if first else None,
                "rows": [r.as_dict() for r in self.rows], "outputs": self.outputs}

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), indent=2)


def _short(source: str) -> str:
    # 'File "/a/b/model.py", line 12, in forward: y = f(x)' -> 'model.py:12: y = f(x)'
    import re

    m = re.match(r'File "([^"]+)", line (\d+), in [^:]+(?:: (.*))?$', source)
    if not m:
        return source
    return f"{os.path.basename(m.group(1))}:{m.group(2)}" + (f": {m.group(3)}" if m.group(3) else "")


def _errors(got: np.ndarray, ref: np.ndarray) -> tuple[float, float]:
    got = np.asarray(got, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if got.size == 0:
        return 0.0, 0.0
    diff = np.abs(got - ref)
    bad = ~(np.isfinite(got) == np.isfinite(ref))
    max_abs = math.inf if bad.any() else float(np.nanmax(np.where(np.isfinite(ref), diff, 0.0)))
    scale = float(np.max(np.abs(ref[np.isfinite(ref)]))) if np.isfinite(ref).any() else 0.0
    if max_abs == 0.0:
        return 0.0, 0.0
    return max_abs, (max_abs / scale if scale > 0 else math.inf)


def _module_path(node) -> str:
    stack = node.meta.get("nn_module_stack") or {}
    return list(stack.values())[-1][0] if stack else ""


def _capture(model, args, kwargs):
    from tpu_export.converter.pipeline import SignatureRequest, prepare_many

    return prepare_many([SignatureRequest("serving_default", model, tuple(args), kwargs)])


def _torch_values(prog, sig, flat_inputs) -> dict:
    """Every node's value, running the captured graph op by op in torch (eager)."""
    import torch

    from tpu_export.converter.interpret import NarrowingInterpreter

    values: dict = {}

    class _Keep(NarrowingInterpreter):
        def run_node(self, n):
            out = super().run_node(n)
            values[n] = out
            return out

    weights = [prog.weights[w] for w in sig.weight_names]
    with torch.no_grad():
        _Keep(sig.graph_module).run(*weights, *flat_inputs)
    return values


def _tensor_nodes(sig) -> list:
    import torch

    return [n for n in sig.graph.nodes
            if n.op == "call_function" and isinstance(n.meta.get("val"), torch.Tensor)]


def _layout_candidates(ref: np.ndarray, shape: tuple) -> list:
    """The torch value in the layouts the edge lowering writes: as is, or channels-last (dim 1 moved last)."""
    out = []
    if tuple(ref.shape) == tuple(shape):
        out.append(ref)
    if ref.ndim >= 3:
        cl = np.moveaxis(ref, 1, -1)
        if tuple(cl.shape) == tuple(shape):
            out.append(cl)
    if not out and ref.size == int(np.prod(shape)) and ref.size > 0:
        out.append(ref.reshape(shape))  # a size-1 dim dropped or added
    return out


def _dequantized(interp, detail, value) -> np.ndarray:
    q = detail.get("quantization_parameters") or {}
    scales = np.asarray(q.get("scales", []))
    if value.dtype.kind in "iu" and scales.size:
        zp = np.asarray(q.get("zero_points", [0]))
        axis = q.get("quantized_dimension", 0)
        if scales.size > 1:
            shape = [1] * value.ndim
            shape[axis] = -1
            scales, zp = scales.reshape(shape), zp.reshape(shape)
        return (value.astype(np.float64) - zp) * scales
    return value


def _tflite_tensors(path, signature, flat_inputs, input_names) -> tuple[dict, dict]:
    """(tensor name -> value, output name -> value) of one run with every intermediate tensor kept."""
    import warnings

    from ai_edge_litert.interpreter import Interpreter

    with warnings.catch_warnings():  # its "for debugging only" warning: keeping every tensor is the point here
        warnings.simplefilter("ignore", UserWarning)
        interp = Interpreter(model_path=path, experimental_preserve_all_tensors=True)
    runner = interp.get_signature_runner(signature)
    details = runner.get_input_details()
    feed = {}
    for name, x in zip(input_names, flat_inputs):
        want = details[name]["dtype"] if name in details else None
        a = np.asarray(x.detach().cpu().numpy() if hasattr(x, "detach") else x)
        feed[name] = a.astype(want) if want is not None else a
    outs = runner(**feed)
    sg = interp._interpreter.GetSubgraphIndexFromSignature(signature)  # noqa: SLF001 - the public API has no getter
    tensors = {}
    for d in interp.get_tensor_details(sg) if _takes_subgraph(interp) else interp.get_tensor_details():
        try:
            v = interp.get_tensor(d["index"], sg)
        except ValueError:  # a tensor with no data (an omitted optional input)
            continue
        if v is None or d["name"] in tensors:
            continue
        tensors[d["name"]] = _dequantized(interp, d, np.array(v))
    return tensors, outs


def _takes_subgraph(interp) -> bool:
    import inspect

    return "subgraph_index" in inspect.signature(interp.get_tensor_details).parameters


def _fused_chain(node, has_tensor) -> Any:
    """The node whose value an artifact tensor named after ``node`` holds: an activation fused into its producer
    (CONV_2D's fused RELU) or an alias (clone, detach) writes no tensor of its own, so the tensor carries the last
    node of that single-user chain."""
    import torch

    cur = node
    while len(cur.users) == 1:
        (u,) = cur.users
        val = u.meta.get("val")
        if u.op != "call_function" or has_tensor(u) or not isinstance(val, torch.Tensor) \
                or tuple(val.shape) != tuple(cur.meta["val"].shape):
            break
        cur = u
    return cur


def _row(node, tensor_name, got, ref, tol) -> LayerRow:
    from tpu_export.converter.errors import source_line
    from tpu_export.converter.registry import op_name

    cands = _layout_candidates(ref, got.shape)
    if not cands:
        return None
    max_abs, max_rel = min((_errors(got, c) for c in cands), key=lambda e: e[1])
    return LayerRow(node.name, node.meta.get("tensor_name", node.name), op_name(node.target), _module_path(node),
                    source_line(node), tensor_name,
                    tuple(int(d) for d in ref.shape), max_abs, max_rel, max_rel > tol)


def _compare_tflite(path, prog, sig, flat, tol, args, kwargs) -> tuple[list, dict]:
    import torch

    values = _torch_values(prog, sig, flat)
    tensors, outs = _tflite_tensors(path, sig.name, flat, [s.name for s in sig.inputs])
    name_of = {n: n.meta.get("tensor_name", n.name) for n in sig.graph.nodes}
    for spec, o in zip(sig.outputs, sig.output_nodes()):
        # a signature output's tensor carries the output's name (output_0), not its node's
        if hasattr(o, "meta") and name_of.get(o) not in tensors and spec.name in tensors:
            name_of[o] = spec.name
    rows = []
    for n in _tensor_nodes(sig):
        tname = name_of[n]
        if tname not in tensors:
            continue
        target = _fused_chain(n, lambda u: name_of.get(u) in tensors)
        ref = values[target]
        if not isinstance(ref, torch.Tensor) or not ref.dtype.is_floating_point:
            continue
        r = _row(target, tname, tensors[tname], ref.detach().float().numpy(), tol)
        if r is not None:
            rows.append(r)
    ref_outs = [values[o] if o in values else None for o in sig.output_nodes()]
    out_err = {}
    for spec, ref in zip(sig.outputs, ref_outs):
        if isinstance(ref, torch.Tensor) and spec.name in outs and ref.dtype.is_floating_point:
            got = np.asarray(outs[spec.name])
            cands = _layout_candidates(ref.detach().float().numpy(), got.shape)
            if cands:
                a, r = min((_errors(got, c) for c in cands), key=lambda e: e[1])
                out_err[spec.name] = {"max_abs": a, "max_rel": r}
    return rows, out_err


def debug_signature(prog, sig):
    """The signature with every tensor-valued node appended to its outputs (the TPU debug export's program)."""
    import torch

    from tpu_export.converter._torch_compat import tree_leaves
    from tpu_export.converter.program import Program

    g = torch.fx.Graph()
    remap: dict = {}
    out_args = g.graph_copy(sig.graph, remap)
    nodes = _tensor_nodes(sig)
    flat_out = list(tree_leaves(out_args))
    g.output(tuple(flat_out + [remap[n] for n in nodes]))
    gm = torch.fx.GraphModule(sig.graph_module, g)
    dbg = dataclasses.replace(sig, graph_module=gm)
    return Program(prog.weights, {sig.name: dbg}, prog.enable_x64), nodes, len(flat_out)


def debug_export(prog, sig):
    """(LoweredSignature of the debug program, its torch nodes in output order, the number of real outputs)."""
    from tpu_export.tpu_backend.lowering import lower_signature

    dprog, nodes, n_out = debug_signature(prog, sig)
    return lower_signature(dprog, sig.name, platforms=("cpu",)), dprog, nodes, n_out


def _compare_tpu(path, prog, sig, flat, tol, args, kwargs) -> tuple[list, dict]:
    import jax
    import torch

    from tpu_export.converter._torch_compat import tree_leaves

    values = _torch_values(prog, sig, flat)
    low, dprog, nodes, n_out = debug_export(prog, sig)
    ins = [np.asarray(x.detach().cpu().numpy()) for x in flat]
    cpu = jax.devices("cpu")[0]
    with jax.default_device(cpu):
        got = jax.jit(low.fn)(low.weight_arrays(dprog), *ins)
    rows = []
    for k, n in enumerate(nodes):
        ref = values[n]
        if not ref.dtype.is_floating_point:
            continue
        r = _row(n, f"debug export output {n_out + k}", np.asarray(got[n_out + k]), ref.detach().float().numpy(), tol)
        if r is not None:
            rows.append(r)
    from tpu_export import tpu_backend

    art = tpu_backend.load(path)
    outs = art(*args, signature_name=sig.name, **(kwargs or {}))
    flat_outs = list(tree_leaves(outs))
    out_err = {}
    for spec, o, want in zip(sig.outputs, flat_outs, sig.output_nodes()):
        ref = values.get(want)
        if isinstance(ref, torch.Tensor) and ref.dtype.is_floating_point:
            a, r = _errors(np.asarray(o), ref.detach().float().numpy())
            out_err[spec.name] = {"max_abs": a, "max_rel": r}
    return rows, out_err


def compare(model, artifact: str | os.PathLike, sample_args: tuple = (), sample_kwargs: dict | None = None, *,
            signature: str = "serving_default", tolerance: float = DEFAULT_TOLERANCE) -> CompareResult:
    """Run torch eager and ``artifact`` on the same inputs and compare every intermediate tensor.

    Args:
        model: The torch model the artifact was converted from: an ``nn.Module`` (called as
            ``model(*sample_args, **sample_kwargs)``), a ``torch.export.ExportedProgram`` or a ``.pt2`` path.
        artifact: A ``.tflite`` or a TPU artifact (``.tpuexp`` folder or ``.zip``).
        sample_args: The inputs both sides run on.
        sample_kwargs: Keyword inputs.
        signature: The artifact's signature to compare (the model's one signature is captured under this name).
        tolerance: The largest max relative error (max |artifact - torch| / max |torch|) a node may have.

    Returns:
        A CompareResult: one row per torch node the artifact holds a tensor of, its first row past
        ``tolerance`` (``first_divergence``), and the artifact's outputs against torch eager.

    Raises:
        FileNotFoundError: ``artifact`` does not exist.
        ValueError: ``artifact`` is neither a .tflite nor a TPU artifact, or ``tolerance`` is not positive.
    """
    import torch

    from tpu_export.converter.pipeline import SignatureRequest, prepare_many
    from tpu_export.tpu_backend.aot import prepare_cpu_host

    prepare_cpu_host()  # before jax starts (the TPU side runs on jax's CPU backend)
    path = os.fspath(artifact)
    if not os.path.exists(path):
        raise FileNotFoundError(f"artifact {path!r} does not exist")
    if not tolerance > 0:
        raise ValueError(f"tolerance must be a positive number, got {tolerance!r}")
    kind = "tflite" if path.endswith(".tflite") else "tpu" if (
        path.endswith((".tpuexp", ".zip")) or os.path.exists(os.path.join(path, "manifest.json"))) else None
    if kind is None:
        raise ValueError(f"artifact {path!r}: compare takes a .tflite or a TPU artifact (.tpuexp folder or .zip)")
    args = sample_args if isinstance(sample_args, tuple) else (sample_args,)
    prog = prepare_many([SignatureRequest(signature, model, args, sample_kwargs)])
    sig = prog.signature(signature)
    from tpu_export.converter.interpret import narrowed

    flat = [narrowed(x) if isinstance(x, torch.Tensor) else x for x in sig.flatten_inputs(args, sample_kwargs)]
    fn = _compare_tflite if kind == "tflite" else _compare_tpu
    rows, outs = fn(path, prog, sig, flat, tolerance, args, sample_kwargs)
    return CompareResult(path, kind, signature, tolerance, rows, outs)
