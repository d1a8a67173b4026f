"""An .onnx file's large weights read straight from a read-only map of the file, each copied once.

``onnx.load`` parses every weight into protobuf's memory; the importer then copied each out (``raw_data`` is a
new bytes object) and again into the writable array torch keeps: three copies of the weights, 2.7x the file in
peak memory, and most of the import's time on a real-size file (page faults, not parsing). Here the file's
protobuf wire format is walked down to each top-level initializer's ``raw_data`` (ModelProto.graph ->
GraphProto.initializer -> TensorProto.raw_data); the model is parsed from the file's bytes with those fields cut
out, and each weight is a view of the map until the importer copies it into the array it keeps (its pages then
leave the process: ``release``). The graph's weights in external data files are mapped the same way
(load._load_external).

Only the plain layout is taken this way (one graph field, one raw_data per tensor, a byte-aligned dtype, no
typed data, not external): anything else is parsed whole, as onnx.load would, so the result is the same model.
The wire format is read, never executed; a malformed one is left to protobuf's own parse and its error.
"""

from __future__ import annotations

import mmap
import os
import sys

import numpy as np

__all__ = ["MappedWeights", "parse_mapped", "map_file", "plain_raw", "RAW_ITEMSIZE", "SMALL_BYTES"]

# bytes per element of the byte-aligned ONNX types (onnx.checker's table for raw_data): float, uint8, int8,
# uint16, int16, int32, int64, bool, float16, double, uint32, uint64, bfloat16
RAW_ITEMSIZE = {1: 4, 2: 1, 3: 1, 4: 2, 5: 2, 6: 4, 7: 8, 9: 1, 10: 2, 11: 8, 12: 4, 13: 8, 16: 2}
_TYPED = ("float_data", "int32_data", "string_data", "int64_data", "double_data", "uint64_data")
SMALL_BYTES = 4096  # weights up to this size stay in the proto: shape constants, read by shape inference
_GRAPH, _INITIALIZER, _RAW_DATA = 7, 5, 9  # ModelProto.graph, GraphProto.initializer, TensorProto.raw_data


class _NotPlain(Exception):
    pass


def plain_raw(t) -> bool:
    """A tensor whose whole onnx.checker verdict on its data is "raw_data holds at least dims x itemsize bytes":
    a byte-aligned type, no typed value field, not external, no segment, every dim positive, not small."""
    if t.data_type not in RAW_ITEMSIZE or t.data_location == 1 or t.HasField("segment"):
        return False
    if any(len(getattr(t, f)) for f in _TYPED):
        return False
    n = RAW_ITEMSIZE[t.data_type]
    for d in t.dims:
        if d <= 0:
            return False
        n *= d
    return SMALL_BYTES < n < (1 << 62)


class MappedWeights:
    """The raw bytes of initializers left in read-only maps of their files (the model's own, or its external
    data files): {index in graph.initializer: (map, offset, length)}."""

    def __init__(self, spans: dict, maps: list):
        self.spans, self._maps = spans, maps

    def __contains__(self, i) -> bool:
        return i in self.spans

    def length(self, i: int) -> int:
        return self.spans[i][2]

    def add(self, other: MappedWeights) -> None:
        self.spans.update(other.spans)
        self._maps += other._maps

    def array(self, i: int, t, where: str) -> np.ndarray:
        """Initializer ``i`` (TensorProto ``t``, its data cut out) as a read-only view of its map, what
        numpy_helper.to_array gives for raw data."""
        from onnx import helper

        from .load import OnnxImportError

        m, off, length = self.spans[i]
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type))
        n = 1
        for d in t.dims:
            n *= d
        if length != n * dtype.itemsize:
            raise OnnxImportError(f"{where}: tensor {t.name!r}: raw_data holds {length} bytes; its dtype and shape "
                                  f"{list(t.dims)} take {n * dtype.itemsize}. Fix: re-export the model")
        return np.frombuffer(m, dtype=dtype, count=n, offset=off).reshape(tuple(t.dims))

    def owns(self, a) -> bool:
        """Whether ``a`` is an array whose memory is one of the maps (made by ``array``, or a view of one)."""
        return self._map_of(a) is not None

    def _map_of(self, a):
        """The map whose memory the array ``a`` views, or None."""
        while isinstance(a, np.ndarray):
            a = a.base
        # np.frombuffer keeps a memoryview of the map
        m = a.obj if isinstance(a, memoryview) else None
        return m if any(m is x for x in self._maps) else None

    def release(self, a) -> None:
        """Drop the pages under ``a`` (a view of a map, just copied) from this process's memory: the file's
        pages stay in the page cache, so a later read of a neighbour sharing a page re-maps it; the peak RSS of a
        build no longer holds every weight twice (the map's pages and the copies)."""
        from numpy.lib.array_utils import byte_bounds

        m = self._map_of(a)
        if m is None or m.closed:
            return
        lo, hi = byte_bounds(a)
        start = lo - np.frombuffer(m, np.uint8, count=1).__array_interface__["data"][0]
        start -= start % mmap.PAGESIZE
        try:
            m.madvise(mmap.MADV_DONTNEED, start, min(hi - lo + mmap.PAGESIZE, len(m) - start))
        except (OSError, ValueError, AttributeError):  # no madvise here: the pages go with the map
            pass

    def close(self) -> None:
        for m in self._maps:
            try:
                m.close()
            except BufferError:
                pass  # a view is still held somewhere: the map goes when it does


def map_file(path: str, fd: int | None = None):
    """A read-only map of the regular file at ``path`` (or of ``fd``, already opened by converter/untrusted.py's
    rule; the map keeps no descriptor), or None where it cannot be mapped (empty, or a filesystem without mmap: the
    caller reads it instead). ``path`` is opened by the same rule: a FIFO or a device is refused, never waited on."""
    from ..untrusted import open_regular

    if fd is None:
        fd, _ = open_regular(path, what="the .onnx file")
    else:
        fd = os.dup(fd)
    with os.fdopen(fd, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            return None
        try:
            return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError):
            return None


def parse_mapped(path: str):
    """(ModelProto, MappedWeights or None) of the file at ``path``; None where nothing was left in the map (a
    small model, or a layout other than the plain one: then the proto is the whole parse)."""
    import onnx

    proto = onnx.ModelProto()
    m = map_file(path)
    if m is None:  # empty (protobuf parses it as an empty model), or a filesystem that cannot map files
        from ..untrusted import open_regular, read_exact

        fd, size = open_regular(path, what="the .onnx file")  # the same rule as the map's: a regular file, bounded
        try:
            _parse_whole(proto, read_exact(fd, size, path))
        finally:
            os.close(fd)
        return proto, None
    try:
        with memoryview(m) as view:
            try:
                # raw_data is little-endian: a big-endian host needs numpy_helper's byteswap, so the whole parse
                cut = _without_raw(view) if sys.byteorder == "little" else None
            except _NotPlain:
                cut = None
            if cut is not None and cut[1]:
                try:
                    proto.ParseFromString(cut[0])
                    spans = _plain_spans(proto, cut[1], m)
                except Exception:  # noqa: BLE001 - malformed: the whole parse below gives protobuf's own error
                    spans = None
                if spans:
                    return proto, MappedWeights(spans, [m])
            proto.Clear()
            _parse_whole(proto, view)  # nothing to leave in the map: the plain parse, as onnx.load does
    except BaseException:
        m.close()
        raise
    m.close()
    return proto, None


def _parse_whole(proto, view) -> None:
    used = proto.ParseFromString(view)
    if used is not None and used != len(view):  # what onnx.load_model_from_string checks
        raise ValueError(f"protobuf decoding consumed too few bytes: {used} out of {len(view)}")


def _plain_spans(proto, spans: list, m) -> dict:
    """{initializer index: (map, offset, length)} of the cut tensors that are plain; the others get their bytes back
    into the proto (onnx.checker and numpy_helper then see them as they are in the file)."""
    inits = proto.graph.initializer
    out = {}
    for i, off, length in spans:
        t = inits[i]
        if plain_raw(t):
            out[i] = (m, off, length)
        else:
            t.raw_data = m[off:off + length]
    return out


def _varint(buf, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise _NotPlain()
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7


def _fields(buf, start: int, end: int):
    """(field number, wire type, start of the field's key, start of its value, end) for each field."""
    pos = start
    while pos < end:
        key_at = pos
        key, pos = _varint(buf, pos)
        num, wire = key >> 3, key & 7
        if wire == 0:
            _, pos = _varint(buf, pos)
            at = pos
        elif wire == 2:
            n, at = _varint(buf, pos)
            pos = at + n
        elif wire in (1, 5):
            at, pos = pos, pos + (8 if wire == 1 else 4)
        else:  # groups: not in onnx.proto
            raise _NotPlain()
        if pos > end:
            raise _NotPlain()
        yield num, wire, key_at, at, pos


def _key_len(num: int, n: int) -> bytes:
    out = bytearray()
    for v in ((num << 3) | 2, n):
        while v >= 0x80:
            out.append((v & 0x7F) | 0x80)
            v >>= 7
        out.append(v)
    return bytes(out)


def _without_raw(buf):
    """(the model's bytes without the large raw_data fields of the graph's initializers, [(initializer index,
    offset, length)]), or None where the model has no single graph field."""
    top = list(_fields(buf, 0, len(buf)))
    if sum(1 for f in top if f[0] == _GRAPH) != 1:
        return None
    parts, spans = [], []
    for num, wire, key_at, at, end in top:
        if num != _GRAPH or wire != 2:
            parts.append(buf[key_at:end])
            continue
        graph, index = [], 0
        for gnum, gwire, gkey, gat, gend in _fields(buf, at, end):
            if gnum != _INITIALIZER or gwire != 2:
                graph.append(buf[gkey:gend])
                continue
            fields = list(_fields(buf, gat, gend))
            raws = [f for f in fields if f[0] == _RAW_DATA]
            if len(raws) != 1 or raws[0][1] != 2 or raws[0][4] - raws[0][3] <= SMALL_BYTES:
                graph.append(buf[gkey:gend])
            else:
                body = b"".join(buf[k:e] for n, _, k, _, e in fields if n != _RAW_DATA)
                graph += [_key_len(_INITIALIZER, len(body)), body]
                spans.append((index, raws[0][3], raws[0][4] - raws[0][3]))
            index += 1
        body = b"".join(graph)
        parts += [_key_len(_GRAPH, len(body)), body]
    return b"".join(parts), spans
