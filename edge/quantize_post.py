"""Fixes applied to ai-edge-quantizer's output in place (edge.quantize's last step), so that its model loads everywhere.

- A blockwise block whose float16 scale is 0: the quantizer floors a block's range at 1e-9 but then rounds
  range / 7 to bfloat16 and float16, so an all-zero block (an embedding table's zeroed padding row: Gemma's row 0)
  or one whose values are all below 7 * 2**-25 gets scale 0, and XNNPACK refuses the whole tensor ("unsupported
  scale value (0.000000) ... INT4"): a tied table then fails the LiteRT-LM engine at the decode's logits
  projection. Its scale becomes ``ZERO_BLOCK_SCALE`` and its values 0 (the quantizer divided by 0 there: NaN or
  +-inf cast to int), so the block still dequantizes to 0 (what the quantizer's scale 0 meant) and nothing else
  changes. edge/quantize_stream.py computes the same bytes directly.
"""

from __future__ import annotations

import numpy as np

from .quantize_prep import buffer_span

__all__ = ["ZERO_BLOCK_SCALE", "nonzero_block_scales"]

# float16's smallest positive normal, 2**-14: XNNPACK accepts any positive normal float32 (CheckFp16Scale), so 1.0
# would load too, but this one keeps the "range ~0" a reader of the scales sees, is exact in bfloat16 (the
# quantizer's 7-bit-mantissa rule) and is normal in float16 itself, for a runtime that checks the half value
ZERO_BLOCK_SCALE = np.float16(2.0 ** -14)


def _blockwise_weights(model, s) -> dict:
    """{(weight buffer, scales buffer): (bits, rows, cols, block size)} of the blockwise int4 / int8 tensors whose
    float16 scales are laid out [rows, cols / block] (blocks along the last axis, what the quantizer writes)."""
    bits_of = {s.TensorType.INT4: 4, s.TensorType.INT8: 8}
    out = {}
    for g in range(model.SubgraphsLength()):
        sg = model.Subgraphs(g)
        for i in range(sg.TensorsLength()):
            t = sg.Tensors(i)
            qp = t.Quantization()
            if t.Type() not in bits_of or qp is None or qp.DetailsType() != s.QuantizationDetails.BlockwiseQuantization:
                continue
            details = s.BlockwiseQuantization()
            table = qp.Details()
            details.Init(table.Bytes, table.Pos)
            scales, shape, block = sg.Tensors(details.Scales()), t.ShapeAsNumpy(), int(details.BlockSize())
            if scales.Type() != s.TensorType.FLOAT16 or not len(shape) or block <= 0 or shape[-1] % block:
                continue
            cols = int(shape[-1])
            rows = int(np.prod(shape[:-1]))
            if int(np.prod(scales.ShapeAsNumpy())) != rows * cols // block or (bits_of[t.Type()] * block) % 8:
                continue
            out[(t.Buffer(), scales.Buffer())] = (bits_of[t.Type()], rows, cols, block)
    return out


def nonzero_block_scales(data: bytes | bytearray) -> bytes | bytearray:
    """``data`` (a .tflite) with every blockwise block whose scale is 0 given ``ZERO_BLOCK_SCALE`` and values 0: edited
    in place when it is a bytearray, a bytearray copy of bytes when a block needs it, ``data`` itself otherwise."""
    from ai_edge_litert import schema_py_generated as s

    model = s.Model.GetRootAs(data, 0)
    # every mask is read before anything is written: two tensors may share a weight or a scales buffer
    todo = []
    for (wbuf, sbuf), (bits, rows, cols, block) in _blockwise_weights(model, s).items():
        (sstart, slen), (wstart, wlen) = buffer_span(model.Buffers(sbuf)), buffer_span(model.Buffers(wbuf))
        row_bytes = cols * bits // 8
        if slen != rows * (cols // block) * 2 or wlen != rows * row_bytes:
            continue
        scales = np.frombuffer(data, np.float16, rows * (cols // block), sstart).reshape(rows, cols // block)
        zero = np.argwhere(scales == 0)
        if len(zero):
            todo.append((sstart, wstart, rows, cols // block, row_bytes, block * bits // 8, zero))
    if todo and not isinstance(data, bytearray):
        data = bytearray(data)
    for sstart, wstart, rows, nblocks, row_bytes, block_bytes, zero in todo:
        scales = np.frombuffer(data, np.float16, rows * nblocks, sstart).reshape(rows, nblocks)
        weights = np.frombuffer(data, np.uint8, rows * row_bytes, wstart).reshape(rows, nblocks, block_bytes)
        scales[zero[:, 0], zero[:, 1]] = ZERO_BLOCK_SCALE
        weights[zero[:, 0], zero[:, 1]] = 0
    return data
