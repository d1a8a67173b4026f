"""Program -> .tflite bytes: the support check first, then one subgraph per signature."""

from __future__ import annotations

import json
import operator

import torch

from converter.decompositions import KEEP_WHOLE, decompose_nodes
from converter.support import check_support

from . import (
    layout,
    ops,  # noqa: F401 - fills the EDGE table
)
from .builder import ModelBuilder
from .lower import SYM_OPS, lower_signature
from .registry import EDGE

__all__ = ["convert_program", "is_supported", "STRUCTURE_METADATA"]

# Metadata entry holding each signature's input/output pytree specs (JSON, never code).
STRUCTURE_METADATA = "tpu_export.structure"


def is_supported(node) -> bool:
    if node.target is operator.getitem or node.target in SYM_OPS:
        return True
    return EDGE.is_supported(node)


def _decompose_unlowered(prog) -> None:
    """Ops the converter kept whole that this backend has no lowering for: decompose them."""
    missing = {t for t in KEEP_WHOLE if t not in EDGE}
    if not missing:
        return
    for sig in prog.signatures.values():
        decompose_nodes(sig.graph_module, missing)


def _takes_channel_last(node) -> bool:
    """Every reader permutes the input (N, spatial..., C) -> (N, C, spatial...): the model takes
    it channel-last (what litert_torch.to_channel_last_io writes)."""
    r = node.meta["val"].dim()
    to_first = [0, r - 1, *range(1, r - 1)]
    return r >= 3 and bool(node.users) and all(
        u.target is torch.ops.aten.permute.default and list(u.args[1]) == to_first for u in node.users)


def _input_specs(sig, channel_last) -> list[dict]:
    """Each input as the .tflite takes it: shape (dim names for dynamic dims), layout, id bound."""
    out = []
    for k, (spec, node) in enumerate(zip(sig.inputs, sig.input_nodes())):
        shape = [d if isinstance(d, str) else int(d) for d in spec.shape]
        entry = {"name": spec.name, "shape": shape}
        if k in channel_last and len(shape) >= 3:
            entry["shape"] = [shape[p] for p in layout.channel_last(len(shape))]
            entry["channel_last"] = True
        elif _takes_channel_last(node):
            entry["channel_last"] = True
        if spec.index_bound is not None:
            entry["index_bound"] = spec.index_bound
        out.append(entry)
    return out


def _channel_last_io(to_channel_last_io, name) -> tuple:
    """(input indices, output indices) laid out channel-last in signature ``name``."""
    io = to_channel_last_io.get(name) if isinstance(to_channel_last_io, dict) else to_channel_last_io
    return io if io is not None else ((), ())


def _structure(prog, to_channel_last_io=None) -> bytes:
    """Per signature: input/output names, pytree specs and the input specs the Model checks calls against."""
    from torch.utils._pytree import treespec_dumps

    out = {}
    for name, sig in prog.signatures.items():
        entry = {"inputs": [s.name for s in sig.inputs], "outputs": [s.name for s in sig.outputs]}
        entry["input_specs"] = _input_specs(sig, set(_channel_last_io(to_channel_last_io, name)[0]))
        entry["dim_ranges"] = {d: [int(lo), int(hi)] for d, (lo, hi) in sig.dim_ranges.items()}
        try:
            entry["in_spec"] = treespec_dumps(sig.in_spec)
            entry["out_spec"] = treespec_dumps(sig.out_spec)
        except Exception:  # noqa: BLE001 - custom pytree nodes: fall back to flat names
            pass
        out[name] = entry
    return json.dumps(out).encode()


def convert_program(prog, *, to_channel_last_io=None) -> bytes:
    """Lower every signature of ``prog`` to LiteRT builtins and write the flatbuffer.

    ``to_channel_last_io``: (input indices, output indices) whose tensors the .tflite takes and
    gives channel-last (NHWC for 4-D), for every signature, or {signature: (inputs, outputs)}.
    The graph keeps torch's layout; only the boundary tensors are laid out NHWC, so a CNN gets
    no TRANSPOSE at all. Quantization is a second step over these float bytes
    (``edge.quantize``, through ai-edge-quantizer).
    """
    _decompose_unlowered(prog)
    check_support(prog, "edge", is_supported)
    model = ModelBuilder()
    with torch.no_grad():
        for sig in prog.signatures.values():
            ins, outs = _channel_last_io(to_channel_last_io, sig.name)
            lower_signature(model, prog, sig, channel_last_inputs=ins, channel_last_outputs=outs)
    model.metadata[STRUCTURE_METADATA] = _structure(prog, to_channel_last_io)
    return model.finish()
