"""The LiteRT flatbuffer writer: buffers, tensors, operator codes, subgraphs, signature defs.

Built on the object API of ``ai_edge_litert.schema_py_generated`` and packed with
``flatbuffers.Builder``. Buffer data goes in as numpy arrays, held by reference (a weight is a
view of the torch parameter, not a copy) until it is written (16-byte aligned as the schema's
``force_align`` asks); identical buffers are stored once, so weights shared by several
signatures, or repeated constants, cost their bytes once.

Two file forms (``ModelBuilder.write``): the classic one, every buffer inside the flatbuffer
(``finish`` returns it as bytes), and past the flatbuffer's 2 GiB limit the schema's large-model
form: the flatbuffer holds no weight bytes, each Buffer carries ``offset`` / ``size`` (from the
start of the file) and the data follows the flatbuffer, 16-byte aligned, streamed into the file
one buffer at a time. TFLite's own converter and ai-edge-quantizer write the same layout
(placeholders offset=1/size=1 packed first, patched once the flatbuffer's length is known).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import struct

import numpy as np

__all__ = ["schema", "ModelBuilder", "SubgraphBuilder", "options", "TENSOR_TYPE", "NP_DTYPE", "type_names",
           "builtin_names", "CLASSIC_LIMIT"]

# A flatbuffer's offsets are 32-bit signed: flatbuffers.Builder refuses to grow past 2 GiB. Past
# this many bytes (data plus a margin for the tables) a model is written in the large-model form.
CLASSIC_LIMIT = (1 << 31) - (64 << 20)
# Arrays smaller than this are copied when added (cheap, and safe against a caller that reuses
# its array); larger ones are held by reference until written.
_COPY_BELOW = 1 << 16

_SCHEMA = None


def schema():
    """The generated LiteRT schema module (imported on first use: it pulls in flatbuffers)."""
    global _SCHEMA
    if _SCHEMA is None:
        from ai_edge_litert import schema_py_generated

        _SCHEMA = schema_py_generated
    return _SCHEMA


# numpy dtype name -> LiteRT TensorType value (numbers from the schema's TensorType enum)
TENSOR_TYPE = {
    "float32": 0, "float16": 1, "int32": 2, "uint8": 3, "int64": 4, "bool": 6, "int16": 7,
    "complex64": 8, "int8": 9, "float64": 10, "uint32": 15, "uint16": 16,
}
NP_DTYPE = {v: np.dtype(k) for k, v in TENSOR_TYPE.items()}


def builtin_names() -> dict[int, str]:
    """Every BuiltinOperator value of the schema -> its name ("CONV_2D", "FULLY_CONNECTED", ...)."""
    return {v: k for k, v in vars(schema().BuiltinOperator).items() if not k.startswith("_")}


def type_names() -> dict[int, str]:
    """Every TensorType value of the schema -> its lower-case name ("float32", "int4", "bool", ...)."""
    return {v: k.lower() for k, v in vars(schema().TensorType).items() if not k.startswith("_")}


def options(kind: str, **fields):
    """(BuiltinOptions enum value, filled ``<kind>OptionsT``), e.g. options("Conv2D", strideW=2).

    Unknown field names raise at once: a typo would otherwise be silently dropped by the packer.
    """
    s = schema()
    obj = getattr(s, f"{kind}OptionsT")()
    for k, v in fields.items():
        if not hasattr(obj, k):
            raise AttributeError(f"{kind}OptionsT has no field {k!r}")
        setattr(obj, k, v)
    return getattr(s.BuiltinOptions, f"{kind}Options"), obj


_SPILL_FROM = 1 << 20


class _Spilled:
    """An array's bytes parked in the builder's spill file: (file, offset, length)."""

    __slots__ = ("file", "offset", "n")

    def __init__(self, file, offset: int, n: int):
        self.file, self.offset, self.n = file, offset, n

    def __len__(self) -> int:
        return self.n

    def chunks(self, size: int = 64 << 20):
        self.file.flush()
        fd = self.file.fileno()
        for i in range(0, self.n, size):
            yield os.pread(fd, min(size, self.n - i), self.offset + i)

    @contextlib.contextmanager
    def mapped(self):
        """The bytes as a read-only map of the spill file (no copy, nothing allocated)."""
        import mmap

        self.file.flush()
        lo = self.offset - self.offset % mmap.ALLOCATIONGRANULARITY
        with mmap.mmap(self.file.fileno(), self.offset + self.n - lo, access=mmap.ACCESS_READ, offset=lo) as m:
            view = memoryview(m)[self.offset - lo:]
            try:
                yield view
            finally:
                view.release()

    def copy_into(self, f) -> bool:
        """Append the bytes to the binary file ``f`` inside the kernel (copy_file_range: no read into this process
        and back); False, with nothing written, where ``f`` has no descriptor or the kernel cannot."""
        try:
            out = f.fileno()
        except (AttributeError, OSError, ValueError):
            return False
        self.file.flush()
        f.flush()
        at, left = self.offset, self.n
        while left:
            try:
                k = os.copy_file_range(self.file.fileno(), out, left, at)
            except OSError:
                if left == self.n:
                    return False
                raise
            if k <= 0:
                raise OSError(f"copy_file_range stopped {left} bytes short copying from the spill file")
            at, left = at + k, left - k
        return True


def _emit(f, data) -> None:
    if isinstance(data, _Spilled):
        if not data.copy_into(f):
            for c in data.chunks():
                f.write(c)
    else:
        f.write(data)


_SAMPLE_FROM = 1 << 20
_SAMPLE_PAGES = 16


def _sample_digest(data: np.ndarray) -> bytes:
    """A digest of the length and 16 4 KiB pieces spread evenly over ``data`` (>= 1 MiB)."""
    n, piece = len(data), 4096
    h = hashlib.blake2b(digest_size=20)
    for i in range(_SAMPLE_PAGES):
        at = (n - piece) * i // (_SAMPLE_PAGES - 1)
        h.update(data[at:at + piece])
    return h.digest() + str(n).encode()


@contextlib.contextmanager
def _readable(data):
    """``data`` (bytes, a memoryview of an array, or _Spilled) as one byte buffer: itself, or a map of the spill."""
    if isinstance(data, _Spilled):
        with data.mapped() as view:
            yield view
    else:
        yield memoryview(data).cast("B")


def _same_bytes(a, b, piece: int = 64 << 20) -> bool:
    """Whether ``a`` and ``b`` (bytes, memoryviews of arrays, or _Spilled) hold the same bytes: compared piece by
    piece (as 8-byte words where the length allows), stopping at the first piece that differs, a spilled one read
    through a map of the spill file. 6x faster than hashing both with blake2b, which is what deciding two large
    buffers equal cost before."""
    if a is None or b is None or len(a) != len(b):
        return False
    word = np.uint64 if len(a) % 8 == 0 else np.uint8
    with _readable(a) as x, _readable(b) as y:
        for i in range(0, len(x), piece):
            xs, ys = np.frombuffer(x[i:i + piece], word), np.frombuffer(y[i:i + piece], word)
            same = np.array_equal(xs, ys)
            del xs, ys  # the maps close on the way out: nothing may still view them
            if not same:
                return False
    return True


def _address_of(data) -> int:
    """The address of a memoryview's first byte (0 for anything else)."""
    if not isinstance(data, memoryview) or not len(data):
        return 0
    return np.frombuffer(data, np.uint8, count=1).ctypes.data


def _raw(array):
    """The bytes of ``array`` in C order: ``bytes`` when small (a copy, as before), else a
    memoryview of it without a copy when it is contiguous (a torch parameter's numpy view stays a
    view). Both read like bytes (len, truth, buffer protocol) for lowerings that look at a buffer."""
    a = np.ascontiguousarray(array)
    raw = a.reshape(-1).view(np.uint8)
    return raw.tobytes() if raw.nbytes < _COPY_BELOW else memoryview(raw)


def _computed(data) -> bool:
    """Whether ``data`` (bytes or a memoryview of an array) is memory numpy allocated, i.e. an array a
    lowering computed, rather than a view of a tensor, a map or a file spool that lives elsewhere."""
    root = data.obj if isinstance(data, memoryview) else None
    while isinstance(root, np.ndarray) and isinstance(root.base, np.ndarray):
        root = root.base
    return not isinstance(root, np.ndarray) or root.base is None


class _AlignedBuffer:
    """A BufferT stand-in whose Pack writes its bytes 16-byte aligned in one copy; in the
    large-model form (``external``) it packs offset/size placeholders instead of the data."""

    def __init__(self, data):
        self.data = data  # None, bytes, a memoryview of an array, or _Spilled
        self.external = False

    @property
    def nbytes(self) -> int:
        return 0 if self.data is None else len(self.data)

    def Pack(self, builder):  # noqa: N802 - the object API's method name
        s = schema()
        vec = None
        n = self.nbytes
        if n and not self.external:
            builder.StartVector(1, n, 16)
            builder.head = builder.head - n
            skipped = getattr(builder, "tpu_export_skipped", None)
            if skipped is None:
                data = b"".join(self.data.chunks()) if isinstance(self.data, _Spilled) else self.data
                builder.Bytes[builder.head : builder.head + n] = memoryview(data)
            else:  # streaming: leave the (untouched, zero) pages alone; write() puts the data there
                skipped.append((len(builder.Bytes) - builder.head, self))
            builder.vectorNumElems = n
            vec = builder.EndVector()
        s.BufferStart(builder)
        if vec is not None:
            s.BufferAddData(builder, vec)
        if n and self.external:
            # non-default placeholders, so both uint64 fields are packed and can be patched in place
            s.BufferAddOffset(builder, 1)
            s.BufferAddSize(builder, 1)
        return s.BufferEnd(builder)


_STREAM_BUILDER = None


def _stream_builder():
    """flatbuffers.Builder with a slot for the spans it skipped (Builder has __slots__)."""
    global _STREAM_BUILDER
    if _STREAM_BUILDER is None:
        import flatbuffers

        class StreamBuilder(flatbuffers.Builder):
            __slots__ = ("tpu_export_skipped",)

        _STREAM_BUILDER = StreamBuilder
    return _STREAM_BUILDER


def _align16(n: int) -> int:
    return (n + 15) & ~15


class ModelBuilder:
    """Owns what subgraphs share: buffers (deduplicated by content) and operator codes."""

    def __init__(self):
        self.buffers: list[_AlignedBuffer] = [_AlignedBuffer(None)]  # buffer 0: the empty sentinel
        self._buffer_by_digest: dict[bytes, int] = {}
        self._buffer_by_sample: dict[bytes, list[int]] = {}  # large buffers: sample digest -> indices
        self._buffer_by_address: dict[tuple[int, int], int] = {}  # large views: (address, bytes) -> index
        self._opcodes: dict = {}  # builtin code, or (CUSTOM, custom code) -> index in operator_codes
        self._opcode_versions: list[list[int]] = []  # [code, version]
        self._custom_codes: dict[int, str] = {}  # index in operator_codes -> a custom op's name
        self.subgraphs: list[SubgraphBuilder] = []
        self.signature_defs = []
        self.metadata: dict[str, bytes] = {}
        # what a lowering shares across signatures (edge.attention_prefix's subgraphs): key -> value
        self.memo: dict = {}

    def buffer(self, array: np.ndarray) -> int:
        """The index of a buffer holding ``array``'s bytes; an identical earlier buffer is reused.

        Arrays under 1 MiB are keyed by a digest of their bytes. A larger one is first keyed by a
        digest of 16 pages spread over it: distinct weights differ there, so they are never read
        whole (reading a 2 GB model costs seconds and, for weights mapped from disk, pages them
        all in); only when the samples match an earlier buffer are the two compared byte for byte,
        so the buffers shared are exactly those with equal bytes. A view of memory the builder
        already holds (the same parameter read again by the next signature) is that buffer at
        once: nothing is read (the 0.84 B Llama's decode signature hashed 3.3 GB)."""
        from tpu_export.converter.lazy_weights import drop_all_pages, drop_pages

        data = _raw(array)
        # spilled when large and computed here (a folded or transposed weight); a bias (1-D) stays
        # readable in memory, and a view of memory someone else holds (a module's parameter) is
        # written from there: copying it to the spill file would only cost a write and a read back.
        weights = np.ndim(array) >= 2 and _computed(data)
        if len(data) < _SAMPLE_FROM:
            digest = hashlib.blake2b(data, digest_size=20).digest() + str(len(data)).encode()
            idx = self._buffer_by_digest.get(digest)
            if idx is None:
                idx = self._add(data, weights)
                self._buffer_by_digest[digest] = idx
            return idx
        at = None if _computed(data) else (_address_of(data), len(data))
        idx = self._buffer_by_address.get(at)
        # the earlier buffer still holds its view, so that memory is alive and is the same bytes (weights are not
        # written to during lowering); a computed array is never keyed so: its memory may be freed and reused
        if idx is not None and self.buffers[idx].data is not None and \
                _address_of(self.buffers[idx].data) == at[0]:
            return idx
        key = _sample_digest(data)
        earlier = self._buffer_by_sample.setdefault(key, [])
        for idx in earlier:
            if _same_bytes(self.buffers[idx].data, data):
                drop_pages(data)
                if weights:  # computed from mapped weights (a fold): give back the pages that read paged in
                    drop_all_pages()
                return idx
        idx = self._add(data, weights)
        earlier.append(idx)
        if at is not None and isinstance(self.buffers[idx].data, memoryview):
            self._buffer_by_address[at] = idx
        return idx

    def _add(self, data, spillable: bool) -> int:
        from tpu_export.converter.lazy_weights import drop_pages

        on_disk = drop_pages(data)  # a weight mapped from disk: reading it paged it in; give the pages back
        self.buffers.append(_AlignedBuffer(data if on_disk or not spillable else self._spilled(data)))
        return len(self.buffers) - 1

    def spill_to(self, folder: str | None) -> None:
        """Keep large arrays the lowering computes (a norm's scale folded into a weight, a transposed
        kernel) in an unlinked temp file in ``folder`` (None: the temp folder) instead of memory,
        until they are written. For models written to a file: their copies would otherwise add
        up to most of the weights (a Llama's q/k/v/gate/up weights carry the RMSNorm scale)."""
        import tempfile

        fd, path = tempfile.mkstemp(prefix=".tpu-export-spill-", dir=folder)
        os.unlink(path)
        self._spill = os.fdopen(fd, "w+b")
        self._spill_size = 0

    def _spilled(self, data):
        spill = getattr(self, "_spill", None)
        if spill is None or len(data) < _SPILL_FROM:
            return data
        from tpu_export.converter.lazy_weights import drop_all_pages

        spill.write(memoryview(data))
        at, self._spill_size = self._spill_size, self._spill_size + len(data)
        drop_all_pages()  # the weights the copy was computed from were paged in from their spool
        return _Spilled(spill, at, data.nbytes)

    def opcode(self, code: int, version: int = 1, custom_code: str | None = None) -> int:
        key = code if custom_code is None else (code, custom_code)  # each custom op has an entry of its own
        idx = self._opcodes.get(key)
        if idx is None:
            idx = len(self._opcode_versions)
            self._opcodes[key] = idx
            self._opcode_versions.append([code, version])
            if custom_code is not None:
                self._custom_codes[idx] = custom_code
        else:
            # one entry per builtin; its version is the highest any use needs
            self._opcode_versions[idx][1] = max(self._opcode_versions[idx][1], version)
        return idx

    def builtin_code(self, opcode_index: int) -> int:
        """The builtin operator an operator's ``opcodeIndex`` stands for."""
        return self._opcode_versions[opcode_index][0]

    def subgraph(self, name: str) -> "SubgraphBuilder":
        sg = SubgraphBuilder(self, name)
        self.subgraphs.append(sg)
        return sg

    def add_signature(self, key: str, subgraph_index: int, inputs: list[tuple[str, int]],
                      outputs: list[tuple[str, int]]) -> None:
        s = schema()
        sd = s.SignatureDefT()
        sd.signatureKey = key
        sd.subgraphIndex = subgraph_index
        sd.inputs = [_tensor_map(n, i) for n, i in inputs]
        sd.outputs = [_tensor_map(n, i) for n, i in outputs]
        self.signature_defs.append(sd)

    def data_bytes(self) -> int:
        """Bytes of buffer data held so far (weights and constants, each stored once)."""
        return sum(b.nbytes for b in self.buffers)

    def _model(self, external: bool):
        """(ModelT, its buffers) with the metadata entries added; ``external``: weight buffers
        pack offset/size placeholders (the large-model form)."""
        s = schema()
        model = s.ModelT()
        model.version = 3
        model.description = "tpu-export edge backend"
        codes = []
        for i, (code, version) in enumerate(self._opcode_versions):
            oc = s.OperatorCodeT()
            oc.builtinCode = code
            oc.deprecatedBuiltinCode = min(code, 127)
            oc.version = version
            oc.customCode = self._custom_codes.get(i)
            codes.append(oc)
        model.operatorCodes = codes
        model.subgraphs = [sg.to_object() for sg in self.subgraphs]
        buffers = list(self.buffers)
        for b in buffers:
            b.external = external and b.nbytes > 0
        meta = []
        for name, data in self.metadata.items():
            m = s.MetadataT()
            m.name = name
            m.buffer = len(buffers)
            buffers.append(_AlignedBuffer(data))  # small JSON, kept inside the flatbuffer in both forms
            meta.append(m)
        model.metadata = meta or None
        model.buffers = buffers
        model.signatureDefs = self.signature_defs
        return model, buffers

    def _pack(self, external: bool, stream: bool = False):
        """Pack the model with flatbuffers.Builder. ``stream``: the builder works in an anonymous
        memory map sized for the whole model and skips the buffer data (its pages stay untouched,
        so they cost no memory); the skipped spans are listed in ``tpu_export_skipped`` as
        (offset from the end, buffer) for ``write`` to fill from the arrays."""
        import mmap

        import flatbuffers

        model, buffers = self._model(external)
        size = sum(b.nbytes for b in buffers if not b.external)
        if stream:
            n_objects = sum(len(sg.tensors) + len(sg.operators) for sg in self.subgraphs)
            cap = size + 16 * len(buffers) + (64 << 20) + 512 * n_objects
            cap = min(cap, flatbuffers.Builder.MAX_BUFFER_SIZE)
            fb = _stream_builder()(0)
            fb.Bytes = mmap.mmap(-1, cap)  # zero pages, allocated only where the tables are written
            fb.head = cap
            fb.tpu_export_skipped = []
        else:
            fb = flatbuffers.Builder(size + 1024 * 1024)
        fb.Finish(model.Pack(fb), file_identifier=b"TFL3")
        for b in buffers:
            b.external = False
        return fb, buffers

    def finish(self) -> bytes:
        """The classic form as bytes (the whole model in memory; under 2 GiB only). Assembled the way
        ``write`` streams it, into one buffer sized up front: one copy of the model, where packing it
        whole and taking ``Output()`` held two (vit_b_16 convert() + export(): 1.50 -> 1.18 GB peak RSS)."""
        import io

        out = io.BytesIO()
        self._write_classic(out, None, None, keep=True)
        return out.getvalue()  # the BytesIO's own bytes object, not a copy

    def is_large(self) -> bool:
        """Whether the classic form would pass the flatbuffer's 2 GiB limit."""
        return self.data_bytes() + sum(len(v) for v in self.metadata.values()) > CLASSIC_LIMIT

    def write(self, f, *, large: bool | None = None, progress=None, release=None) -> int:
        """Write the model to the binary file ``f``; returns the bytes written.

        ``large=None`` picks the large-model form only when the classic one cannot hold the data;
        ``large=False`` gives the bytes ``finish`` returns. Either way the weights are streamed
        from their arrays into ``f``, never gathered into one bytes object: the classic form's
        tables are packed around the (skipped) data spans, the large form's flatbuffer holds no
        weight bytes at all. ``progress(done_bytes, total_bytes, done_buffers, total_buffers)``
        is called as buffers are written, ``release(array)`` once an array's bytes are written
        (it may free them)."""
        if large is None:
            large = self.is_large()
        if not large:
            return self._write_classic(f, progress, release)
        fb, buffers = self._pack(True)
        head = bytearray(fb.Output())
        del fb
        m = schema().Model.GetRootAs(head, 0)
        pos = _align16(len(head))
        layout = []
        for i, b in enumerate(buffers):
            if not b.nbytes or i >= len(self.buffers):
                continue
            tab = m.Buffers(i)._tab
            for slot, value in ((6, pos), (8, b.nbytes)):  # vtable offsets of Buffer.offset, Buffer.size
                struct.pack_into("<Q", head, tab.Pos + tab.Offset(slot), value)
            layout.append((pos, b))
            pos = _align16(pos + b.nbytes)
        f.write(head)
        written, total = len(head), sum(b.nbytes for _, b in layout)
        done = 0
        for k, (at, b) in enumerate(layout):
            f.write(b"\0" * (at - written))
            _emit(f, b.data)
            written = at + b.nbytes
            done += b.nbytes
            self._written(b, release)
            if progress is not None:
                progress(done, total, k + 1, len(layout))
        self._close_spill()
        return written

    def _written(self, b, release) -> None:
        from tpu_export.converter.lazy_weights import drop_pages

        data, b.data = b.data, None  # written once; the builder no longer keeps the array alive
        drop_pages(data)
        if release is not None:
            release(data)

    def _close_spill(self) -> None:
        """Close the spill file once nothing is left in it (every spilled buffer written). It is unlinked, so its
        pages are dropped unwritten: held until the builder is collected (its subgraphs point back at it, a cycle)
        they are dirty pages the kernel writes to disk for nothing, 1.7 GB for the 0.84 B Llama."""
        spill = getattr(self, "_spill", None)
        if spill is not None and not any(isinstance(b.data, _Spilled) for b in self.buffers):
            self._spill = None
            spill.close()

    def _write_classic(self, f, progress, release, keep: bool = False) -> int:
        """``keep``: the buffers keep their data (``finish``), else each is let go once written."""
        fb, _ = self._pack(False, stream=True)
        end, start = len(fb.Bytes), fb.Head()
        spans = sorted(((end - off - start, b) for off, b in fb.tpu_export_skipped), key=lambda t: t[0])
        view = memoryview(fb.Bytes)[start:]
        if keep and len(view):  # size the in-memory file once (BytesIO would grow it by copies)
            f.seek(len(view) - 1)
            f.write(b"\0")
            f.seek(0)
        pos, done, total = 0, 0, sum(b.nbytes for _, b in spans)
        for k, (at, b) in enumerate(spans):
            f.write(view[pos:at])
            n = b.nbytes
            _emit(f, b.data)
            pos = at + n
            done += n
            if not keep:
                self._written(b, release)
            if progress is not None:
                progress(done, total, k + 1, len(spans))
        f.write(view[pos:])
        n = len(view)
        view.release()
        if not keep:
            self._close_spill()
        return n

def _tensor_map(name: str, index: int):
    tm = schema().TensorMapT()
    tm.name = name
    tm.tensorIndex = index
    return tm


class SubgraphBuilder:
    """Tensors and operators of one subgraph (one signature)."""

    def __init__(self, model: ModelBuilder, name: str):
        self.model = model
        self.name = name
        self.tensors = []
        self.operators = []
        self.inputs: list[int] = []
        self.outputs: list[int] = []
        self._const_tensors: dict[tuple, int] = {}
        self._names: set[str] = set()

    def unique_name(self, name: str) -> str:
        """``name``, or ``name_1``, ``name_2``... if taken: tools that key by tensor name
        (ai-edge-quantizer's recipes and calibration results) need every name in a subgraph unique."""
        base, k = name, 0
        while name in self._names:
            k += 1
            name = f"{base}_{k}"
        self._names.add(name)
        return name

    def rename(self, index: int, name: str) -> None:
        """Give tensor ``index`` the name ``name`` (a signature's output name); a tensor already
        holding it is renamed out of the way so names stay unique."""
        if self.tensors[index].name == name:
            return
        for t in self.tensors:
            if t.name == name:
                t.name = self.unique_name(name)
        self._names.add(name)
        self.tensors[index].name = name

    def tensor(self, name: str, shape, dtype, buffer: int = 0) -> int:
        """A tensor; ``shape`` may hold None for a dynamic dim (written 1, signature -1)."""
        s = schema()
        t = s.TensorT()
        t.name = self.unique_name(name)
        t.type = TENSOR_TYPE[np.dtype(dtype).name]
        t.shape = [1 if d is None else int(d) for d in shape]
        if any(d is None for d in shape):
            t.shapeSignature = [-1 if d is None else int(d) for d in shape]
        t.buffer = buffer
        t.hasRank = True
        self.tensors.append(t)
        return len(self.tensors) - 1

    def const(self, array: np.ndarray, name: str) -> int:
        """A constant tensor; the same value (bytes, shape, dtype) gives the same tensor."""
        array = np.asarray(array)
        buf = self.model.buffer(array)
        key = (buf, array.shape, array.dtype.str)
        idx = self._const_tensors.get(key)
        if idx is None:
            idx = self.tensor(name, array.shape, array.dtype, buffer=buf)
            self._const_tensors[key] = idx
        return idx

    def op(self, code: int, inputs: list[int], outputs: list[int], opts=None, version: int = 1,
           custom_code: str | None = None, custom_options: bytes | None = None):
        """An operator: a builtin ``code`` with its ``opts``, or (code CUSTOM) the custom op ``custom_code``
        with its flexbuffer ``custom_options``."""
        s = schema()
        o = s.OperatorT()
        o.opcodeIndex = self.model.opcode(code, version, custom_code)
        o.inputs = list(inputs)
        o.outputs = list(outputs)
        if opts is not None:
            o.builtinOptionsType, o.builtinOptions = opts
        if custom_options is not None:
            o.customOptions = list(custom_options)
            o.customOptionsFormat = s.CustomOptionsFormat.FLEXBUFFERS
        self.operators.append(o)
        return o

    def to_object(self):
        sg = schema().SubGraphT()
        sg.name = self.name
        sg.tensors = self.tensors
        sg.operators = self.operators
        sg.inputs = self.inputs
        sg.outputs = self.outputs
        return sg
