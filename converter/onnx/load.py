"""Safe parse of an ``.onnx`` file: protobuf only (nothing in the file is executed), external data
read by us and only from inside the model's folder, then onnx.checker and shape inference.

External data (models past protobuf's 2 GB limit keep their weights in side files) is resolved
here rather than by ``onnx.load``: each tensor's ``location`` must be a relative path that stays
inside the model's folder after resolving symlinks, and its offset/length must lie inside that file
and match the tensor's dtype and shape. A file that breaks any of these fails with one line naming
the tensor, the location and the fix.
"""

from __future__ import annotations

import os

from ..errors import ConversionError, one_line

__all__ = ["OnnxImportError", "load_model", "check_and_infer", "tensor_nbytes"]


class OnnxImportError(ConversionError):
    """An ONNX file or graph cannot be imported. The message names the file or node and the fix."""


def load_model(model, base_dir: str | None = None):
    """A ModelProto from a path, bytes or a ModelProto, with external data loaded (safely)."""
    import onnx

    where = "<ModelProto>"
    if isinstance(model, (str, os.PathLike)):
        where = os.fspath(model)
        if not os.path.isfile(where):
            raise OnnxImportError(f"{where}: no such file. Fix: give the path of an .onnx file")
        base_dir = os.path.dirname(os.path.abspath(where))
        try:
            with open(where, "rb") as f:
                proto = onnx.load_model_from_string(f.read())
        except Exception as e:  # noqa: BLE001 - protobuf's DecodeError and friends
            raise OnnxImportError(f"{where}: not a valid ONNX protobuf ({type(e).__name__}: {one_line(e, 200)}). "
                                  "Fix: re-export the model, or check the file is not truncated") from None
    elif isinstance(model, (bytes, bytearray)):
        try:
            proto = onnx.load_model_from_string(bytes(model))
        except Exception as e:  # noqa: BLE001
            raise OnnxImportError(f"<bytes>: not a valid ONNX protobuf ({one_line(e, 200)})") from None
    elif isinstance(model, onnx.ModelProto):
        proto = model
        if any(t.data_location == onnx.TensorProto.EXTERNAL for t in _external_tensors(model.graph)):
            proto = onnx.ModelProto()
            proto.CopyFrom(model)  # external data is filled into a copy: the caller's proto stays as it was
    else:
        raise OnnxImportError(f"cannot import a {type(model).__name__}; give an onnx.ModelProto or an .onnx path")
    if not proto.HasField("graph") or not proto.opset_import:
        raise OnnxImportError(f"{where}: not an ONNX model (no graph or no opset_import). "
                              "Fix: give an .onnx model file")
    _load_external(proto, base_dir, where)
    return proto, where


def tensor_nbytes(t) -> int | None:
    """Bytes a TensorProto's data takes when stored raw, or None for strings."""
    import numpy as np
    from onnx import helper

    if t.data_type == 8:  # STRING
        return None
    n = 1
    for d in t.dims:
        n *= int(d)
    bits = {16: 16, 22: 4, 21: 4, 23: 4, 24: 4, 25: 2}  # bfloat16 and the sub-byte types
    if t.data_type in bits:
        return (n * bits[t.data_type] + 7) // 8
    return n * np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type)).itemsize


def _external_tensors(graph):
    from onnx import AttributeProto

    for t in graph.initializer:
        yield t
    for node in graph.node:
        for a in node.attribute:
            if a.type == AttributeProto.TENSOR:
                yield a.t
            elif a.type == AttributeProto.GRAPH:
                yield from _external_tensors(a.g)
            elif a.type == AttributeProto.GRAPHS:
                for g in a.graphs:
                    yield from _external_tensors(g)


def _load_external(proto, base_dir, where) -> None:
    from onnx import TensorProto

    for t in _external_tensors(proto.graph):
        if t.data_location != TensorProto.EXTERNAL:
            continue
        info = {e.key: e.value for e in t.external_data}
        loc = info.get("location", "")
        if base_dir is None:
            raise OnnxImportError(f"{where}: tensor {t.name!r} keeps its data in external file {loc!r}, but the model "
                                  "was given without its folder. Fix: pass the .onnx path instead of the ModelProto")
        root = os.path.realpath(base_dir)
        path = os.path.realpath(os.path.join(root, loc))
        if not loc or os.path.isabs(loc) or os.path.commonpath([root, path]) != root:
            raise OnnxImportError(f"{where}: tensor {t.name!r}: external data location {loc!r} is outside the model's "
                                  f"folder {root}; refused. Fix: keep external data files beside the .onnx file")
        if not os.path.isfile(path):
            raise OnnxImportError(f"{where}: tensor {t.name!r}: external data file {loc!r} not found in {root}. "
                                  "Fix: copy it beside the .onnx file")
        size = os.path.getsize(path)
        try:
            offset = int(info.get("offset", 0))
            length = int(info["length"]) if "length" in info else size - offset
        except ValueError:
            raise OnnxImportError(f"{where}: tensor {t.name!r}: external data offset/length are not integers") from None
        want = tensor_nbytes(t)
        if offset < 0 or length < 0 or offset + length > size or (want is not None and length != want):
            raise OnnxImportError(
                f"{where}: tensor {t.name!r}: external data {loc!r} offset {offset} length {length} does not fit the "
                f"file ({size} bytes) or the tensor ({want} bytes). Fix: re-save the model's external data")
        with open(path, "rb") as f:
            f.seek(offset)
            t.raw_data = f.read(length)
        del t.external_data[:]
        t.data_location = TensorProto.DEFAULT


def check_and_infer(proto, where: str, fixed_dims: dict | None = None):
    """onnx.checker on the model, then shape inference (with ``fixed_dims`` {dim_param: size} set on the
    graph inputs first, so that shapes depending on them become static)."""
    import onnx

    try:
        if proto.ByteSize() < (1 << 31) - 1:
            onnx.checker.check_model(proto)
        elif os.path.isfile(where):
            # past 2 GB only with external data (validated by _load_external): the checker reads the file's
            # own form, resolving the data files from its folder
            onnx.checker.check_model(where)
    except onnx.checker.ValidationError as e:
        raise OnnxImportError(f"{where}: onnx.checker rejects the model: {one_line(e, 300)}. "
                              "Fix: re-export it with a current exporter") from None
    lite = _without_weights(proto)  # inference needs types and shapes, not weight bytes
    if fixed_dims:  # set on the copy: a caller's ModelProto stays as it was
        for vi in lite.graph.input:
            for d in vi.type.tensor_type.shape.dim:
                if d.HasField("dim_param") and d.dim_param in fixed_dims:
                    d.dim_value = int(fixed_dims[d.dim_param])
    try:
        inferred = onnx.shape_inference.infer_shapes(lite, strict_mode=False, data_prop=True)
    except Exception as e:  # noqa: BLE001 - inference errors name the node in their text
        raise OnnxImportError(f"{where}: ONNX shape inference failed: {one_line(e, 300)}") from None
    return inferred


def _without_weights(proto):
    """A copy whose large initializers hold no data (their name, dims and dtype stay), built without copying
    the weight bytes: what the checker (past protobuf's 2 GB) and shape inference need."""
    import onnx

    lite = onnx.ModelProto()
    for f in ("ir_version", "producer_name", "producer_version", "domain", "model_version", "doc_string"):
        setattr(lite, f, getattr(proto, f))
    lite.opset_import.extend(proto.opset_import)
    lite.functions.extend(proto.functions)
    g, lg = proto.graph, lite.graph
    lg.name = g.name
    for field in ("node", "input", "output", "value_info", "sparse_initializer"):
        getattr(lg, field).extend(getattr(g, field))
    for t in g.initializer:
        if t.ByteSize() <= 4096:
            lg.initializer.append(t)  # small ones (shape constants) feed inference's data propagation
            continue
        s = lg.initializer.add()  # typed and shaped, with no data (neither check needs the values)
        s.name, s.data_type = t.name, t.data_type
        s.dims.extend(t.dims)
    return lite
