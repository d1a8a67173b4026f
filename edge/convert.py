"""Program -> .tflite: the support check first, then one subgraph per signature.

``convert_program`` returns the classic flatbuffer as bytes (small models, and every caller that
wants bytes); ``write_program`` writes straight into a file, streaming the weights, in the
large-model form past the flatbuffer's 2 GiB limit."""

from __future__ import annotations

import json
import operator
import os

import torch

from tpu_export.converter import layout
from tpu_export.converter._torch_compat import treespec_dumps
from tpu_export.converter.decompositions import KEEP_WHOLE, decompose_nodes
from tpu_export.converter.support import check_support

from . import ops  # noqa: F401 - fills the EDGE table
from .builder import ModelBuilder
from .lower import SYM_OPS, lower_signature
from .registry import EDGE

__all__ = ["convert_program", "write_program", "write_model", "lower_program", "is_supported", "STRUCTURE_METADATA"]

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


def lower_program(prog, to_channel_last_io=None, *, spill: bool = False,
                  spill_folder: str | None = None, pt2e_io_int8: bool = False) -> ModelBuilder:
    """Every signature lowered into a ModelBuilder (its weights held by reference, not yet written).
    ``spill``: arrays the lowering computes (folded weights) wait in a temp file in
    ``spill_folder``, not in memory (for a model about to be written to a file). ``pt2e_io_int8``: a
    PT2E-quantized program's inputs and outputs are int8 themselves (edge.quantize_pt2e; the iot target)."""
    _decompose_unlowered(prog)
    check_support(prog, "edge", is_supported)
    model = ModelBuilder()
    if spill:
        model.spill_to(spill_folder)
    pt2e = False
    with torch.no_grad():
        for sig in prog.signatures.values():
            ins, outs = _channel_last_io(to_channel_last_io, sig.name)
            lw = lower_signature(model, prog, sig, channel_last_inputs=ins, channel_last_outputs=outs)
            if lw.pt2e_values:  # a PT2E-quantized model: its observed ranges become int8 kernels
                from .quantize_pt2e import int8_from_pt2e

                int8_from_pt2e(lw, io_int8=pt2e_io_int8)
                pt2e = True
    if pt2e:
        from .quantize_pt2e import drop_unused_buffers

        drop_unused_buffers(model)
    model.metadata[STRUCTURE_METADATA] = _structure(prog, to_channel_last_io)
    return model


def convert_program(prog, *, to_channel_last_io=None) -> bytes:
    """Lower every signature of ``prog`` to LiteRT builtins and write the flatbuffer.

    ``to_channel_last_io``: (input indices, output indices) whose tensors the .tflite takes and
    gives channel-last (NHWC for 4-D), for every signature, or {signature: (inputs, outputs)}.
    The graph keeps torch's layout; only the boundary tensors are laid out NHWC, so a CNN gets
    no TRANSPOSE at all. Quantization is a second step over these float bytes
    (``edge.quantize``, through ai-edge-quantizer).
    """
    model = lower_program(prog, to_channel_last_io)
    if model.is_large():
        raise ValueError(f"the model holds {model.data_bytes() / 2**30:.2f} GiB of weights, past the 2 GiB a "
                         ".tflite flatbuffer can hold in memory. Fix: write it to a file "
                         "(litert_torch.convert(..., output_file_path='model.tflite') or edge.convert.write_program), "
                         "which uses the large-model form")
    return model.finish()


def write_program(prog, path, *, to_channel_last_io=None, large: bool | None = None, progress=None,
                  release=None) -> str:
    """Lower ``prog`` and write the .tflite to ``path`` atomically (temp file, then rename).

    ``large``: None picks the large-model form (weights after the flatbuffer, Buffer.offset/size)
    only past the 2 GiB limit, so a small model's file is byte-identical to ``convert_program``'s
    bytes; True forces it. ``progress(msg)`` gets a line per 256 MiB written (tensors, bytes,
    rate); ``release(array)`` runs once each weight array is in the file (it may free it).
    Returns the absolute path written."""
    folder = os.path.dirname(os.path.abspath(os.fspath(path)))
    return write_model(lower_program(prog, to_channel_last_io, spill=True, spill_folder=folder), path, large=large,
                       progress=progress, release=release)


def write_model(model: ModelBuilder, path, *, large: bool | None = None, progress=None, release=None) -> str:
    """Write a lowered model to ``path`` atomically, streaming its weights (see ``write_program``)."""
    import time

    from tpu_export.converter.atomic import write_file

    t0, step = time.perf_counter(), [0]

    def report(done, total, k, n):
        if progress is not None and (done - step[0] >= 256 << 20 or k == n):
            step[0] = done
            rate = done / max(time.perf_counter() - t0, 1e-6) / 2**20
            left = f", about {(total - done) / 2**20 / rate:,.0f} s left" if done < total and rate > 0 else ""
            progress(f"weights: {k}/{n} tensors, {done / 2**20:,.0f}/{total / 2**20:,.0f} MiB written "
                     f"({rate:,.0f} MiB/s{left})")

    return write_file(path, lambda f: model.write(f, large=large, progress=report, release=release))
