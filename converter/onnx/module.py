"""The torch module of an imported ONNX graph: constants as parameters/buffers (names kept) or numpy (the
static inputs), and a forward that runs the graph's remaining nodes with torch ops."""

from __future__ import annotations

import numpy as np
import torch

from .._torch_compat import is_dynamo_error, module_children, module_owns_tensor
from .graph import OnnxGraph, run_node, to_torch
from .load import OnnxImportError

__all__ = ["OnnxModule"]


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

    def __init__(self, graph: OnnxGraph, input_names: list, output_names: list, where: str):
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
            self._paths[n] = self._attach(n, to_torch(graph.consts[n]))

    def _attach(self, name: str, t: torch.Tensor) -> str:
        param = t.is_floating_point()
        parts = name.split(".")
        owner, path = self, []
        try:
            for p in parts[:-1]:
                if module_owns_tensor(owner, p) or not p:
                    raise KeyError(p)
                if p not in module_children(owner):
                    owner.add_module(p, torch.nn.Module())
                owner, path = module_children(owner)[p], path + [p]
            leaf = parts[-1]
            if not leaf or leaf in module_children(owner):
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
                res = _node_call(ctx)(run_node, spec, ctx, attrs, vals)
            except OnnxImportError:
                raise
            except Exception as e:  # noqa: BLE001
                if is_dynamo_error(e) or "GuardOnDataDependent" in type(e).__name__:
                    raise
                ctx.fail(f"{type(e).__name__}: {' '.join(str(e).split())[:300]}")
            for o, v in zip(outs, res):
                if o:
                    env[o] = v
        result = {}
        for n in self._outputs:
            v = env[n] if n in env else self._const(n)
            result[n] = to_torch(v) if isinstance(v, np.ndarray) else v
        return result
