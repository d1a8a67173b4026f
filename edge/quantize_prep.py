"""Flatbuffer rewrites that make a float .tflite quantizable by ai-edge-quantizer (edge.quantize's first step).

- Tensor names unique model-wide: the quantizer keys its recipes and results by tensor name and refuses a name
  that repeats anywhere, but a multi-signature model (an LLM's ``prefill_<L>`` and ``decode``) repeats its input
  names and its shared weights' names in every subgraph.
- An embedding table read by GATHER becomes an EMBEDDING_LOOKUP: the quantizer's dynamic-range, weight-only and
  float16 recipes quantize EMBEDDING_LOOKUP tables (LiteRT dequantizes only the rows it reads) but never GATHER's,
  and an LLM's table is often the largest weight (Gemma 3 270M: 170 M of its 270 M parameters), so leaving it
  float keeps a quantized LLM at ~2x its float size instead of ~4x. Only GATHERs of a constant float 2-D table on
  axis 0 with static int32 indices qualify; the lookup takes 1-D ids, so the ids are flattened first and the rows
  reshaped back (a no-op RESHAPE pair when the ids are already 1-D is skipped).

Both run in one object-API pass (read, edit, pack once) into the large-model form, each weight's bytes copied once;
the model comes back as the same object when nothing applies.
"""

from __future__ import annotations

import collections

import numpy as np

__all__ = ["prepare_for_quantizer", "buffer_span"]


def prepare_for_quantizer(tflite: bytes, *, embedding_lookup: bool = False) -> bytes | bytearray:
    """``tflite`` with unique tensor names and (``embedding_lookup``) GATHER tables as EMBEDDING_LOOKUP: the same
    object when nothing applies, else a new bytearray (the quantizer takes one) in the large-model form."""
    from ai_edge_litert import schema_py_generated as s

    model = s.Model.GetRootAs(tflite, 0)
    gathers = embedding_lookup and _has_table_gather(model, s)
    if _names_unique(model) and not gathers:
        return tflite
    spans = _data_spans(model)
    # the object API reads each buffer's data as a view of ``tflite`` (no copy); the edits below touch tables only
    obj = s.ModelT.InitFromObj(model)
    if gathers:
        for sg in obj.subgraphs:
            _lookups_for_gathers(obj, sg, s)
    _rename(obj)
    return _pack_external(obj, spans, tflite, s)


_INLINE_BELOW = 1024  # ai-edge-quantizer's own threshold: smaller buffers stay in the flatbuffer


def _data_spans(model) -> list[tuple[int, int, int]]:
    """(buffer index, start in the file, length) of the buffers that go after the flatbuffer: those already there
    (the large-model form's ``offset`` / ``size``) and the tensor data of 1 KiB or more stored in it (a ``data``
    vector). Metadata stays inline, where readers of the model's metadata (litert_torch's signatures) look."""
    metadata = {model.Metadata(i).Buffer() for i in range(model.MetadataLength())}
    spans = []
    for i in range(model.BuffersLength()):
        buf = model.Buffers(i)
        start, n = buffer_span(buf)
        if buf.Offset() > 1 or (n >= _INLINE_BELOW and i not in metadata):
            spans.append((i, start, n))
    return spans


def buffer_span(buf) -> tuple[int, int]:
    """(start, length) of a Buffer's bytes in the file: after the flatbuffer (the large-model form's offset and
    size) or inside it (its ``data`` vector, read in place); (0, 0) when it has none."""
    if buf.Offset() > 1:
        return int(buf.Offset()), int(buf.Size())
    slot = buf._tab.Offset(4)  # Buffer.data (vtable slot 4)
    return (int(buf._tab.Vector(slot)), int(buf._tab.VectorLen(slot))) if slot else (0, 0)


def _pack_external(obj, spans, tflite, s) -> bytearray:
    """The edited model in the large-model form (Buffer.offset / size from the file's start, data after the
    flatbuffer; the layout edge.builder and ai-edge-quantizer write past 2 GiB, which both the quantizer and LiteRT
    read at any size): the tables are packed with placeholder offsets, then each buffer's bytes are copied once from
    ``tflite`` after them, 16-byte aligned, and their offset and size patched in. Repacking the classic form instead
    (the data inside the flatbuffer) held a builder as large as the model plus each array's ``tobytes`` copy on top
    of the output: Gemma-3-100M int8 peaked 0.87 GB above the float model, this 0.37 GB (the output alone)."""
    import struct

    import flatbuffers

    for i, _, _ in spans:
        buf = obj.buffers[i]
        buf.data, buf.offset, buf.size = None, 1, 1  # non-default, so that the packer writes both fields
    # the small buffers left inline are packed from views of ``tflite`` (a copy each, at most the metadata's size)
    b = flatbuffers.Builder(1 << 20)
    b.Finish(obj.Pack(b), file_identifier=b"TFL3")
    head = b.Output()
    place, end = [], len(head)
    for i, old, n in spans:
        start = (end + 15) // 16 * 16
        place.append((i, start, old, n))
        end = start + n
    out = bytearray(end)
    out[:len(head)] = head
    model = s.Model.GetRootAs(out, 0)
    # memoryview to memoryview: a plain copy (``out[a:b] = view`` first copies the view into a temporary bytearray,
    # as large as the largest weight)
    src, dst = memoryview(tflite), memoryview(out)
    for i, start, old, n in place:
        tab = model.Buffers(i)._tab
        struct.pack_into("<Q", out, tab.Pos + tab.Offset(6), start)  # Buffer.offset (vtable slot 6)
        struct.pack_into("<Q", out, tab.Pos + tab.Offset(8), n)  # Buffer.size (slot 8)
        dst[start:start + n] = src[old:old + n]
    dst.release()
    return out


def _names_unique(model) -> bool:
    names = [model.Subgraphs(g).Tensors(i).Name() for g in range(model.SubgraphsLength())
             for i in range(model.Subgraphs(g).TensorsLength())]
    return len(set(names)) == len(names)


def _rename(obj) -> None:
    taken = {t.name for sg in obj.subgraphs for t in sg.tensors}
    seen = collections.Counter()
    for sg in obj.subgraphs:
        for t in sg.tensors:
            seen[t.name] += 1
            if seen[t.name] > 1:
                k = seen[t.name] - 1
                while t.name + b"_%d" % k in taken:
                    k += 1
                t.name = t.name + b"_%d" % k
                taken.add(t.name)


def _qualifies(axis, batch_dims, table_type, table_shape, table_const, ids_type, ids_signature, s) -> bool:
    """Whether a GATHER becomes an EMBEDDING_LOOKUP: a constant float32 2-D table on axis 0, static int32 ids (also
    the rule of edge/quantize_stream.py's rewrite inside a ModelBuilder)."""
    return (axis == 0 and batch_dims == 0 and table_type == s.TensorType.FLOAT32 and len(table_shape) == 2
            and table_const and ids_type == s.TensorType.INT32
            and (ids_signature is None or isinstance(ids_signature, int) or all(int(d) >= 0 for d in ids_signature)))


def _has_table_gather(model, s) -> bool:
    """A scan of the flatbuffer itself (no object-API copy) for a GATHER that qualifies."""
    for g in range(model.SubgraphsLength()):
        sg = model.Subgraphs(g)
        for i in range(sg.OperatorsLength()):
            op = sg.Operators(i)
            oc = model.OperatorCodes(op.OpcodeIndex())
            if max(oc.BuiltinCode(), oc.DeprecatedBuiltinCode()) != s.BuiltinOperator.GATHER or op.InputsLength() != 2:
                continue
            opts = s.GatherOptions()
            if op.BuiltinOptions() is not None:
                opts.Init(op.BuiltinOptions().Bytes, op.BuiltinOptions().Pos)
            table, ids = sg.Tensors(op.Inputs(0)), sg.Tensors(op.Inputs(1))
            buf = model.Buffers(table.Buffer())
            if _qualifies(opts.Axis() if op.BuiltinOptions() is not None else 0,
                          opts.BatchDims() if op.BuiltinOptions() is not None else 0, table.Type(),
                          table.ShapeAsNumpy(), buf.DataLength() > 0 or buf.Size() > 0, ids.Type(),
                          ids.ShapeSignatureAsNumpy(), s):
                return True
    return False


def _opcode(obj, code, s) -> int:
    for k, oc in enumerate(obj.operatorCodes):
        if max(oc.builtinCode, oc.deprecatedBuiltinCode) == code:
            return k
    oc = s.OperatorCodeT()
    oc.builtinCode, oc.deprecatedBuiltinCode, oc.version = code, min(code, 127), 1
    obj.operatorCodes.append(oc)
    return len(obj.operatorCodes) - 1


def _tensor(sg, name: bytes, shape, ttype, s, buffer: int = 0) -> int:
    t = s.TensorT()
    t.name, t.shape, t.type, t.buffer = name, np.asarray(shape, np.int32), ttype, buffer
    sg.tensors.append(t)
    return len(sg.tensors) - 1


def _reshape(obj, sg, x: int, out: int, shape, s) -> object:
    buf = s.BufferT()
    buf.data = np.asarray(shape, np.int32).view(np.uint8)
    obj.buffers.append(buf)
    shape_t = _tensor(sg, sg.tensors[out].name + b"/shape", [len(shape)], s.TensorType.INT32, s, len(obj.buffers) - 1)
    op = s.OperatorT()
    op.opcodeIndex, op.inputs, op.outputs = _opcode(obj, s.BuiltinOperator.RESHAPE, s), [x, shape_t], [out]
    op.builtinOptionsType = s.BuiltinOptions.ReshapeOptions
    op.builtinOptions = s.ReshapeOptionsT()
    op.builtinOptions.newShape = list(shape)
    return op


def _lookups_for_gathers(obj, sg, s) -> None:
    ops = []
    for op in sg.operators:
        oc = obj.operatorCodes[op.opcodeIndex]
        code = max(oc.builtinCode, oc.deprecatedBuiltinCode)
        opts = op.builtinOptions
        if code != s.BuiltinOperator.GATHER or len(op.inputs) != 2:
            ops.append(op)
            continue
        table_t, ids_t = sg.tensors[op.inputs[0]], sg.tensors[op.inputs[1]]
        buf = obj.buffers[table_t.buffer]
        if not _qualifies(getattr(opts, "axis", 0), getattr(opts, "batchDims", 0), table_t.type, table_t.shape,
                          buf.data is not None or bool(getattr(buf, "size", 0)), ids_t.type, ids_t.shapeSignature, s):
            ops.append(op)
            continue
        table, ids, out = int(op.inputs[0]), int(op.inputs[1]), int(op.outputs[0])
        n, width = int(np.prod(sg.tensors[ids].shape)), int(sg.tensors[table].shape[1])
        flat_ids, rows = ids, out
        if len(sg.tensors[ids].shape) != 1:
            flat_ids = _tensor(sg, sg.tensors[out].name + b"/ids", [n], s.TensorType.INT32, s)
            ops.append(_reshape(obj, sg, ids, flat_ids, [n], s))
            rows = _tensor(sg, sg.tensors[out].name + b"/rows", [n, width], s.TensorType.FLOAT32, s)
        lookup = s.OperatorT()
        lookup.opcodeIndex = _opcode(obj, s.BuiltinOperator.EMBEDDING_LOOKUP, s)
        lookup.inputs, lookup.outputs = [flat_ids, table], [rows]  # EMBEDDING_LOOKUP takes (ids, table)
        ops.append(lookup)
        if rows != out:
            ops.append(_reshape(obj, sg, rows, out, [int(d) for d in sg.tensors[out].shape], s))
    sg.operators = ops
