"""Quantize while streaming: int8 weights computed tensor by tensor inside a lowered ModelBuilder,
before it is written, so a large model never has a float copy of itself in memory.

``dynamic_int8`` here is what ai-edge-quantizer's dynamic_int8 recipe does to a FULLY_CONNECTED
weight, byte for byte: symmetric per-output-channel int8 (scale = max|w[c]| / 127, zero point 0,
quantized dimension 0), the kernel quantizing activations on the fly (LiteRT's hybrid
FULLY_CONNECTED). Only FULLY_CONNECTED weights are touched (in a transformer, nearly all of its
weights); a buffer any other operator also reads (a tied embedding table) stays float.
Each weight is read in row blocks (bounded scratch memory) and its int8 bytes go where the
builder keeps computed arrays (its spill file when it has one).
"""

from __future__ import annotations

import numpy as np

from .builder import TENSOR_TYPE, ModelBuilder, _Spilled, schema

__all__ = ["quantize_weights", "STREAM_SCHEMES"]

STREAM_SCHEMES = ("dynamic_int8",)
_BLOCK = 32 << 20  # bytes of float rows quantized at a time


def _fc_weight_buffers(model: ModelBuilder) -> dict[int, list]:
    """buffer index -> [(subgraph, tensor index)] of float32 rank-2 FULLY_CONNECTED weights whose
    buffer no other tensor role reads."""
    fc = schema().BuiltinOperator.FULLY_CONNECTED
    f32 = TENSOR_TYPE["float32"]
    weight_uses: dict[int, list] = {}
    other: set[int] = set()
    for sg in model.subgraphs:
        for op in sg.operators:
            is_fc = model.builtin_code(op.opcodeIndex) == fc
            for k, t in enumerate(op.inputs):
                if t < 0:
                    continue
                buf = sg.tensors[t].buffer
                if not buf:
                    continue
                if is_fc and k == 1:
                    weight_uses.setdefault(buf, []).append((sg, t))
                else:
                    other.add(buf)
    out = {}
    for buf, uses in weight_uses.items():
        tensors = {(id(sg), t): (sg, t) for sg, t in uses}.values()
        if buf in other or any(sg.tensors[t].type != f32 or len(sg.tensors[t].shape) != 2 for sg, t in tensors):
            continue
        out[buf] = list(tensors)
    return out


def _float_rows(data, rows: int, cols: int):
    """The float32 weight as blocks of rows (from memory, or read back from the spill file)."""
    step = max(1, _BLOCK // max(cols * 4, 1))
    if isinstance(data, _Spilled):
        data.file.flush()
        import os

        for r in range(0, rows, step):
            n = min(step, rows - r)
            raw = os.pread(data.file.fileno(), n * cols * 4, data.offset + r * cols * 4)
            yield np.frombuffer(raw, np.float32).reshape(n, cols)
    else:
        w = np.frombuffer(data, np.float32).reshape(rows, cols)
        for r in range(0, rows, step):
            yield w[r:r + step]


def quantize_weights(model: ModelBuilder, scheme: str = "dynamic_int8", progress=None) -> int:
    """Quantize the model's FULLY_CONNECTED weights in place; returns how many buffers changed."""
    if scheme not in STREAM_SCHEMES:
        raise ValueError(f"quantize while streaming supports {list(STREAM_SCHEMES)}, not {scheme!r}")
    from converter.lazy_weights import drop_all_pages

    s = schema()
    targets = _fc_weight_buffers(model)
    for k, (buf, uses) in enumerate(targets.items()):
        sg, t = uses[0]
        rows, cols = (int(d) for d in sg.tensors[t].shape)
        b = model.buffers[buf]
        q = np.empty((rows, cols), np.int8)
        scales = np.empty(rows, np.float32)
        r = 0
        for block in _float_rows(b.data, rows, cols):
            n = block.shape[0]
            sc = np.abs(block).max(axis=1) / np.float32(127)
            sc[sc == 0] = np.float32(1)  # an all-zero row: any scale gives zeros
            scales[r:r + n] = sc
            q[r:r + n] = np.clip(np.round(block / sc[:, None]), -127, 127)
            r += n
        b.data = model._spilled(memoryview(q.reshape(-1).view(np.uint8)))
        del q
        drop_all_pages()
        for sg, t in uses:
            tensor = sg.tensors[t]
            tensor.type = TENSOR_TYPE["int8"]
            qp = s.QuantizationParametersT()
            qp.scale = scales.tolist()
            qp.zeroPoint = [0] * rows
            qp.quantizedDimension = 0
            tensor.quantization = qp
        if progress is not None:
            progress(k + 1, len(targets))
    return len(targets)
