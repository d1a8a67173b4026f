"""Quantize while streaming: weights quantized tensor by tensor inside a lowered ModelBuilder, before
it is written, so a large model never has a float copy of itself in memory.

Each scheme is what ai-edge-quantizer's recipe of the same name (edge/quantize.py) does to a
FULLY_CONNECTED weight and to an embedding table, byte for byte:

- ``dynamic_int8``: symmetric per-output-channel int8 (scale = max|w[c]| / 127, zero point 0,
  quantized dimension 0), the kernel quantizing activations on the fly (LiteRT's hybrid
  FULLY_CONNECTED / EMBEDDING_LOOKUP).
- ``weight_only_int8``: the same int8 bytes and scales, read through a DEQUANTIZE op (a float32 tensor
  ``<weight>_dequant`` placed before the weight's first reader) so that compute stays float.
- ``dynamic_int4_block32``: int4 in blocks of 32 input channels (scale = max|block| / 7, rounded to
  bfloat16's 7-bit mantissa and stored as a float16 tensor ``<weight>_scales`` [rows, cols / 32]),
  values clipped to [-8, 7] and packed two to a byte, low nibble first; a scale that rounds to 0 (an
  all-zero block) is float16's smallest normal instead, its values 0 (edge/quantize_post.py).

An embedding table is first made an EMBEDDING_LOOKUP (a GATHER of a constant float table on axis 0
with static int32 ids, as edge/quantize_prep.py does for the in-memory path): the recipes quantize
that op's table, never GATHER's. Only FULLY_CONNECTED weights and lookup tables are touched (in an
LLM, nearly all of its weights); a buffer any other operator also reads stays float. Each weight is
read in row blocks (bounded scratch memory) and its quantized bytes go where the builder keeps
computed arrays (its spill file when it has one).
"""

from __future__ import annotations

import os

import numpy as np

from .builder import TENSOR_TYPE, ModelBuilder, _Spilled, options, schema
from .quantize_post import ZERO_BLOCK_SCALE
from .quantize_prep import _qualifies

__all__ = ["quantize_weights", "STREAM_SCHEMES"]

STREAM_SCHEMES = ("dynamic_int8", "weight_only_int8", "dynamic_int4_block32")
_BLOCK = 32 << 20  # bytes of float rows quantized at a time
_INT4_BLOCK = 32
_MIN_BOUND = np.float32(1e-9)  # ai-edge-quantizer's floor on a range (an all-zero row or block)


def _lookups_for_gathers(model: ModelBuilder) -> None:
    """Every GATHER of a constant float32 2-D table on axis 0 with static int32 ids becomes RESHAPE(ids -> 1-D),
    EMBEDDING_LOOKUP(ids, table), RESHAPE(rows -> the GATHER's shape) (no reshape when the ids are 1-D already)."""
    s = schema()
    gather = s.BuiltinOperator.GATHER
    for sg in model.subgraphs:
        ops = []
        for op in sg.operators:
            opts = op.builtinOptions
            if model.builtin_code(op.opcodeIndex) != gather or len(op.inputs) != 2:
                ops.append(op)
                continue
            table_t, ids_t = sg.tensors[op.inputs[0]], sg.tensors[op.inputs[1]]
            if not _qualifies(getattr(opts, "axis", 0), getattr(opts, "batchDims", 0), table_t.type, table_t.shape,
                              bool(table_t.buffer), ids_t.type, ids_t.shapeSignature, s):
                ops.append(op)
                continue
            table, ids, out = int(op.inputs[0]), int(op.inputs[1]), int(op.outputs[0])
            n, width, name = int(np.prod(ids_t.shape)), int(table_t.shape[1]), sg.tensors[out].name
            flat_ids, rows = ids, out
            if len(ids_t.shape) != 1:
                flat_ids = sg.tensor(f"{name}/ids", [n], np.int32)
                ops.append(_reshape(model, sg, ids, flat_ids, [n]))
                rows = sg.tensor(f"{name}/rows", [n, width], np.float32)
            lookup = s.OperatorT()
            lookup.opcodeIndex = model.opcode(s.BuiltinOperator.EMBEDDING_LOOKUP)
            lookup.inputs, lookup.outputs = [flat_ids, table], [rows]  # EMBEDDING_LOOKUP takes (ids, table)
            ops.append(lookup)
            if rows != out:
                ops.append(_reshape(model, sg, rows, out, [int(d) for d in sg.tensors[out].shape]))
        sg.operators = ops


def _reshape(model, sg, x: int, out: int, shape):
    s = schema()
    op = s.OperatorT()
    op.opcodeIndex = model.opcode(s.BuiltinOperator.RESHAPE)
    op.inputs = [x, sg.const(np.asarray(shape, np.int32), f"{sg.tensors[out].name}/shape")]
    op.outputs = [out]
    op.builtinOptionsType, op.builtinOptions = options("Reshape", newShape=list(shape))
    return op


def _weight_buffers(model: ModelBuilder) -> dict[int, list]:
    """buffer index -> [(subgraph, tensor index)] of float32 rank-2 FULLY_CONNECTED weights and EMBEDDING_LOOKUP
    tables whose buffer no other tensor role reads."""
    s = schema()
    roles = {s.BuiltinOperator.FULLY_CONNECTED: 1, s.BuiltinOperator.EMBEDDING_LOOKUP: 1}
    f32 = TENSOR_TYPE["float32"]
    weight_uses: dict[int, list] = {}
    other: set[int] = set()
    for sg in model.subgraphs:
        for op in sg.operators:
            slot = roles.get(model.builtin_code(op.opcodeIndex))
            for k, t in enumerate(op.inputs):
                if t < 0:
                    continue
                buf = sg.tensors[t].buffer
                if not buf:
                    continue
                if k == slot:
                    weight_uses.setdefault(buf, []).append((sg, t))
                else:
                    other.add(buf)
    out = {}
    for buf, uses in weight_uses.items():
        tensors = {(id(sg), t): (sg, t) for sg, t in uses}.values()
        shapes = {tuple(int(d) for d in sg.tensors[t].shape) for sg, t in tensors}
        if buf in other or len(shapes) != 1 or any(sg.tensors[t].type != f32 or len(sg.tensors[t].shape) != 2
                                                   for sg, t in tensors):
            continue
        out[buf] = list(tensors)
    return out


def _float_rows(data, rows: int, cols: int):
    """The float32 weight as blocks of rows (from memory, or read back from the spill file)."""
    step = max(1, _BLOCK // max(cols * 4, 1))
    if isinstance(data, _Spilled):
        data.file.flush()
        for r in range(0, rows, step):
            n = min(step, rows - r)
            raw = os.pread(data.file.fileno(), n * cols * 4, data.offset + r * cols * 4)
            yield np.frombuffer(raw, np.float32).reshape(n, cols)
    else:
        w = np.frombuffer(data, np.float32).reshape(rows, cols)
        for r in range(0, rows, step):
            yield w[r:r + step]


def _int8_rows(block):
    """(int8 rows, per-row scales) as ai-edge-quantizer's symmetric channelwise int8 (narrow range [-127, 127])."""
    sc = np.maximum(np.abs(block).max(axis=1), _MIN_BOUND) / np.float32(127)
    return np.clip(np.rint(block / sc[:, None]), -127, 127).astype(np.int8), sc


def _int4_rows(block):
    """(packed int4 bytes of the rows, float32 scales [n, cols / 32]) as ai-edge-quantizer's blockwise int4: the scale
    rounded to bfloat16 then float16 before the division, values in [-8, 7], two to a byte, low nibble first. A block
    whose scale rounds to 0 (all zeros, or every |value| <= 7 * 2**-25) gets ``ZERO_BLOCK_SCALE`` and values 0, what
    edge/quantize_post.py makes of the quantizer's scale 0 (which XNNPACK refuses)."""
    import ml_dtypes

    n, cols = block.shape
    b = block.reshape(n, cols // _INT4_BLOCK, _INT4_BLOCK)
    bound = np.maximum(np.maximum(np.abs(b.min(axis=2)), np.abs(b.max(axis=2))), _MIN_BOUND)
    sc = (bound / np.float32(7)).astype(ml_dtypes.bfloat16).astype(np.float16).astype(np.float32)
    sc[sc == 0] = ZERO_BLOCK_SCALE  # (edge/quantize_post.py): then the block's values round to 0 below
    q = np.clip(np.rint(b / sc[:, :, None]), -8, 7).astype(np.int8).reshape(-1).view(np.uint8)
    return (q[0::2] & 0xF) | ((q[1::2] & 0xF) << 4), sc


def _quantized_params(model, sg, t: int, scheme: str, scales):
    s = schema()
    tensor = sg.tensors[t]
    qp = s.QuantizationParametersT()
    qp.quantizedDimension = 0
    if scheme != "dynamic_int4_block32":
        tensor.type = TENSOR_TYPE["int8"]
        qp.scale = scales.tolist()
        qp.zeroPoint = [0] * len(scales)
    else:
        tensor.type = s.TensorType.INT4
        name = tensor.name.decode() if isinstance(tensor.name, bytes) else tensor.name
        details = s.BlockwiseQuantizationT()
        details.scales = sg.const(scales.astype(np.float16), f"{name}_scales")
        details.zeroPoints = -1  # no zero point (symmetric), as the quantizer writes it
        details.blockSize = _INT4_BLOCK
        qp.detailsType, qp.details = s.QuantizationDetails.BlockwiseQuantization, details
    tensor.quantization = qp
    if scheme == "weight_only_int8":
        _dequantize_before_use(model, sg, t)


def _dequantize_before_use(model, sg, t: int) -> None:
    """DEQUANTIZE(weight t) -> float32 ``<name>_dequant``, inserted before the first operator reading t; every reader
    takes the float tensor (ai-edge-quantizer's weight-only form)."""
    s = schema()
    name = sg.tensors[t].name
    name = name.decode() if isinstance(name, bytes) else name
    f = sg.tensor(f"{name}_dequant", [int(d) for d in sg.tensors[t].shape], np.float32)
    first = None
    for k, op in enumerate(sg.operators):
        if t in op.inputs:
            first = k if first is None else first
            op.inputs = [f if i == t else i for i in op.inputs]
    op = s.OperatorT()
    op.opcodeIndex = model.opcode(s.BuiltinOperator.DEQUANTIZE)
    op.inputs, op.outputs = [t], [f]
    sg.operators.insert(first or 0, op)


def quantize_weights(model: ModelBuilder, scheme: str = "dynamic_int8", progress=None) -> int:
    """Quantize the model's FULLY_CONNECTED weights and embedding tables in place; returns how many buffers changed."""
    if scheme not in STREAM_SCHEMES:
        raise ValueError(f"quantize while streaming supports {list(STREAM_SCHEMES)}, not {scheme!r}")
    from tpu_export.converter.lazy_weights import drop_all_pages

    _lookups_for_gathers(model)
    targets = _weight_buffers(model)
    if scheme == "dynamic_int4_block32":  # a width the blocks do not divide stays float (the quantizer refuses it)
        targets = {b: u for b, u in targets.items() if int(u[0][0].tensors[u[0][1]].shape[1]) % _INT4_BLOCK == 0}
    quantize = _int4_rows if scheme == "dynamic_int4_block32" else _int8_rows
    for k, (buf, uses) in enumerate(targets.items()):
        sg, t = uses[0]
        rows, cols = (int(d) for d in sg.tensors[t].shape)
        b = model.buffers[buf]
        per_row = cols // 2 if scheme == "dynamic_int4_block32" else cols  # bytes of one quantized row
        q = np.empty(rows * per_row, np.uint8)
        scales, r = [], 0
        for block in _float_rows(b.data, rows, cols):
            qb, sc = quantize(block)
            q[r * per_row:(r + len(block)) * per_row] = qb.reshape(-1).view(np.uint8)
            scales.append(sc)
            r += len(block)
        b.data = model._spilled(memoryview(q))
        del q
        drop_all_pages()
        scales = np.concatenate(scales)
        for sg, t in uses:
            _quantized_params(model, sg, t, scheme, scales)
        if progress is not None:
            progress(k + 1, len(targets))
    return len(targets)
