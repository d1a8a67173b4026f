"""Safe parse of an ``.onnx`` file: protobuf only (nothing in the file is executed), external data
read by us and only from inside the model's folder, then onnx.checker and shape inference.

External data (models past protobuf's 2 GB limit keep their weights in side files) is resolved
here rather than by ``onnx.load``, by converter/untrusted.py's rule: each tensor's ``location`` must be
a relative path that stays inside the model's folder (a symlink only to a file inside it), a regular
file (a FIFO or device is refused, never waited on), and its offset/length must lie inside that file
and match the tensor's dtype and shape. A file that breaks any of these fails with one line naming
the tensor, the location and the fix.
"""

from __future__ import annotations

import contextlib
import os

from ..errors import ConversionError, one_line
from ..untrusted import Folder, UntrustedFileError, open_regular, pread_exact
from .wire import RAW_ITEMSIZE, MappedWeights, map_file, parse_mapped, plain_raw

__all__ = ["OnnxImportError", "load_model", "check_and_infer", "tensor_nbytes"]


class OnnxImportError(ConversionError):
    """An ONNX file or graph cannot be imported. The message names the file or node and the fix."""


def load_model(model, base_dir: str | None = None):
    """(ModelProto, where, MappedWeights or None) from a path, bytes or a ModelProto, with external data resolved
    (safely). The large weights of a file, and the graph's weights in external data files, stay in maps of those
    files (converter/onnx/wire.py): their initializers hold no raw_data, ``MappedWeights`` has their bytes; the
    caller closes it."""
    import onnx

    where = "<ModelProto>"
    mapped = None
    if isinstance(model, (str, os.PathLike)):
        where = os.fspath(model)
        if not os.path.lexists(where):
            raise OnnxImportError(f"{where}: no such file. Fix: give the path of an .onnx file")
        if not os.path.isfile(where):  # a FIFO, a device, a directory: refused by the rule's own words
            try:
                os.close(open_regular(where, what="the .onnx file")[0])
            except UntrustedFileError as e:
                raise OnnxImportError(str(e)) from None
        base_dir = os.path.dirname(os.path.abspath(where))
        try:
            proto, mapped = parse_mapped(where)
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
    try:
        if not proto.HasField("graph") or not proto.opset_import:
            raise OnnxImportError(f"{where}: not an ONNX model (no graph or no opset_import). "
                                  "Fix: give an .onnx model file")
        external = _load_external(proto, base_dir, where)
        if external is not None:
            if mapped is None:
                mapped = external
            else:
                mapped.add(external)
    except BaseException:
        if mapped is not None:
            mapped.close()
        raise
    return proto, where, mapped


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


def _external_tensors(graph, initializers: bool = True):
    from onnx import AttributeProto

    if initializers:
        yield from graph.initializer
    for node in graph.node:
        for at in node.attribute:
            if at.type == AttributeProto.TENSOR:
                yield at.t
            elif at.type == AttributeProto.GRAPH:
                yield from _external_tensors(at.g)
            elif at.type == AttributeProto.GRAPHS:
                for g in at.graphs:
                    yield from _external_tensors(g)


def _load_external(proto, base_dir, where):
    """Resolve every tensor whose data is in an external file (checked to lie inside the model's folder and to
    fit the tensor). The graph's plain initializers stay in read-only maps of those files (a MappedWeights,
    returned; None if none), the others are read into their raw_data."""
    import sys

    from onnx import TensorProto

    if not any(t.data_location == TensorProto.EXTERNAL for t in _external_tensors(proto.graph)):
        return None
    if base_dir is None:
        t = next(t for t in _external_tensors(proto.graph) if t.data_location == TensorProto.EXTERNAL)
        loc = {e.key: e.value for e in t.external_data}.get("location", "")
        raise OnnxImportError(f"{where}: tensor {t.name!r} keeps its data in external file {loc!r}, but the model "
                              "was given without its folder. Fix: pass the .onnx path instead of the ModelProto")
    maps: dict = {}
    spans = {}
    fds: dict = {}
    try:
        with Folder(base_dir, what="the model's folder") as folder:
            for i, t in enumerate(proto.graph.initializer):
                if t.data_location == TensorProto.EXTERNAL:
                    loc, offset, length = _external_span(t, folder, fds, where)
                    _local(t)
                    m = None
                    if plain_raw(t) and sys.byteorder == "little":
                        if loc not in maps:
                            maps[loc] = map_file(folder.shown(loc), fds[loc][0])
                        m = maps[loc]
                    if m is not None:
                        spans[i] = (m, offset, length)  # as a weight cut out of the model's own file
                    else:
                        t.raw_data = _read(fds[loc][0], offset, length, folder.shown(loc))
            for t in _external_tensors(proto.graph, initializers=False):
                if t.data_location == TensorProto.EXTERNAL:
                    loc, offset, length = _external_span(t, folder, fds, where)
                    _local(t)
                    t.raw_data = _read(fds[loc][0], offset, length, folder.shown(loc))
    except UntrustedFileError as e:
        for m in maps.values():
            if m is not None:
                m.close()
        raise OnnxImportError(f"{where}: external data: {e}") from None
    except BaseException:
        for m in maps.values():
            if m is not None:
                m.close()
        raise
    finally:
        for fd, _ in fds.values():
            os.close(fd)
    return MappedWeights(spans, [m for m in maps.values() if m is not None]) if spans else None


def _local(t) -> None:
    from onnx import TensorProto

    del t.external_data[:]
    t.data_location = TensorProto.DEFAULT


def _read(fd: int, offset: int, length: int, shown: str) -> bytes:
    """The tensor's bytes: its range was checked to lie inside the file, so the read is bounded by the tensor."""
    data = pread_exact(fd, offset, length)
    if len(data) != length:
        raise OnnxImportError(f"{shown}: read {len(data)} of {length} bytes: the file shrank while it was read")
    return data


def _external_span(t, folder: Folder, fds: dict, where) -> tuple[str, int, int]:
    """(location, offset, length) of an external tensor's data, its file opened into ``fds`` {location: (fd,
    size)}; refused unless inside the model's folder, a regular file, and the right size for the tensor."""
    info = {e.key: e.value for e in t.external_data}
    loc = info.get("location", "")
    root = folder.path
    if loc not in fds:
        if not loc or os.path.isabs(loc) or ".." in loc.replace("\\", "/").split("/"):
            raise OnnxImportError(f"{where}: tensor {t.name!r}: external data location {loc!r} is outside the "
                                  f"model's folder {root}; refused. Fix: keep external data files beside the .onnx "
                                  "file")
        try:
            fds[loc] = folder.open(os.path.normpath(loc), what="the external data file")
        except UntrustedFileError as e:
            if e.reason == "missing":
                raise OnnxImportError(f"{where}: tensor {t.name!r}: external data file {loc!r} not found in {root}. "
                                      "Fix: copy it beside the .onnx file") from None
            if e.reason == "escapes":
                raise OnnxImportError(f"{where}: tensor {t.name!r}: external data location {loc!r} is outside the "
                                      f"model's folder {root} ({e.problem}); refused. Fix: keep external data files "
                                      "beside the .onnx file") from None
            raise OnnxImportError(f"{where}: tensor {t.name!r}: external data {loc!r}: {e.problem}. Fix: {e.fix}") \
                from None
    size = fds[loc][1]
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
    return loc, offset, length


def check_and_infer(proto, where: str, fixed_dims: dict | None = None, mapped=None):
    """onnx.checker on the model, then shape inference (with ``fixed_dims`` {dim_param: size} set on the
    graph inputs first, so that shapes depending on them become static).

    Both run on a copy without the large weights' bytes (those ``mapped`` holds have none in the proto):
    check_model serializes the whole model and parses it back in C++ (with the ByteSize that picked the
    in-memory or the file form: ~2.7 s of CPU for bert-base's 440 MB, none of it on a weight's values). The
    checker's only test of a plain raw weight's data (its raw_data holds the bytes its dtype and shape need)
    is made here, in the checker's words."""
    import onnx

    lite, stand_ins, stripped = _without_weights(proto, mapped)
    for t, have in stripped:
        _check_raw(t, len(t.raw_data) if have is None else have, where)
    try:
        if lite.ByteSize() < (1 << 31) - 1:
            with _zero_dims(stand_ins):
                onnx.checker.check_model(lite)
        elif os.path.isfile(where):
            # past 2 GB even without its large weights (Constant nodes holding external data): the checker reads
            # the file's own form, resolving the data files from its folder
            onnx.checker.check_model(where)
    except onnx.checker.ValidationError as e:
        raise OnnxImportError(f"{where}: onnx.checker rejects the model: {one_line(e, 300)}. "
                              "Fix: re-export it with a current exporter") from None
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


def _check_raw(t, have: int, where: str) -> None:
    want = RAW_ITEMSIZE[t.data_type]
    for d in t.dims:
        want *= d
    if have == 0:
        why = "should contain one and only one value field."
    elif have < want:
        why = f"raw_data size ({have} bytes) is too small for the declared shape and type ({want} bytes required)."
    else:
        return
    raise OnnxImportError(f"{where}: onnx.checker rejects the model: TensorProto (tensor name: {t.name}) {why} "
                          "Fix: re-export it with a current exporter")


@contextlib.contextmanager
def _zero_dims(stand_ins):
    """Each stand-in's dims set to [0] for the checker's call: an empty 0-element tensor is one the checker
    accepts without data (nothing else the checker does reads an initializer's dims); inference gets them back."""
    dims = [list(s.dims) for s in stand_ins]
    for s in stand_ins:
        del s.dims[:]
        s.dims.append(0)
    try:
        yield
    finally:
        for s, d in zip(stand_ins, dims):
            del s.dims[:]
            s.dims.extend(d)


def _copy_fields(src, dst, skip: str) -> None:
    for fd, v in src.ListFields():
        if fd.name == skip:
            continue
        if isinstance(v, (bytes, str, int, float)):  # bool and enums are ints
            setattr(dst, fd.name, v)
        elif hasattr(v, "CopyFrom"):  # a message (protobuf's FieldDescriptor.label is gone in upb 6.x)
            getattr(dst, fd.name).CopyFrom(v)
        else:
            getattr(dst, fd.name).extend(v)


def _without_weights(proto, mapped):
    """(a copy whose large plain initializers hold no data, their stand-ins in it, [(initializer, its data's
    length where the map holds it, else None)]), built without copying the weight bytes: the checker and
    shape inference need the weights' types and shapes."""
    import onnx

    lite = onnx.ModelProto()
    _copy_fields(proto, lite, "graph")
    _copy_fields(proto.graph, lite.graph, "initializer")
    stand_ins, stripped = [], []
    for i, t in enumerate(proto.graph.initializer):
        if mapped is not None and i in mapped:
            have = mapped.length(i)
        elif plain_raw(t) and t.HasField("raw_data"):
            have = None  # read where checked: one transient copy of the tensor's bytes (upb has no length accessor)
        else:
            lite.graph.initializer.append(t)  # small ones (shape constants) feed inference's data propagation
            continue
        s = lite.graph.initializer.add()  # typed and shaped, with no data
        s.name, s.data_type = t.name, t.data_type
        s.dims.extend(t.dims)
        stand_ins.append(s)
        stripped.append((t, have))
    return lite, stand_ins, stripped
