"""Program -> .tflite bytes: the support check first, then one subgraph per signature."""

from __future__ import annotations

import json
import operator

import torch

from converter.decompositions import KEEP_WHOLE, decompose_nodes
from converter.support import check_support

from . import ops  # noqa: F401 - fills the EDGE table
from .builder import ModelBuilder
from .lower import SYM_OPS, lower_signature
from .registry import EDGE, node_supported

__all__ = ["convert_program", "is_supported", "STRUCTURE_METADATA"]

# Metadata entry holding each signature's input/output pytree specs (JSON, never code).
STRUCTURE_METADATA = "tpu_export.structure"


def is_supported(node) -> bool:
    if node.target is operator.getitem or node.target in SYM_OPS:
        return True
    return node_supported(node)


def _decompose_unlowered(prog) -> None:
    """Ops the converter kept whole that this backend has no lowering for: decompose them."""
    missing = {t for t in KEEP_WHOLE if t not in EDGE}
    if not missing:
        return
    for sig in prog.signatures.values():
        decompose_nodes(sig.graph_module, missing)


def _structure(prog) -> bytes:
    from torch.utils._pytree import treespec_dumps

    out = {}
    for name, sig in prog.signatures.items():
        entry = {"inputs": [s.name for s in sig.inputs], "outputs": [s.name for s in sig.outputs]}
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
            io = to_channel_last_io
            if isinstance(io, dict):
                io = io.get(sig.name)
            ins, outs = io if io is not None else ((), ())
            lower_signature(model, prog, sig, channel_last_inputs=ins, channel_last_outputs=outs)
    model.metadata[STRUCTURE_METADATA] = _structure(prog)
    return model.finish()
