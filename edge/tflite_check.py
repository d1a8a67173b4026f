"""Structural check of a .tflite before any interpreter sees it.

The LiteRT interpreter trusts the flatbuffer: a bad offset or index in a corrupt file can make
it read out of bounds (a crash, not an exception) or loop. ``check_tflite`` walks every table,
vector and string the interpreter reads, with explicit bounds, and checks the cross-references
(opcode, tensor, buffer, subgraph indices; buffer sizes against constant tensors' shapes;
signature defs). It reads offsets only, never weight bytes: a 100 MB model checks in
milliseconds. Anything wrong raises ``TfliteFormatError``: one line, the file, what is wrong.
"""

from __future__ import annotations

import os
import struct

from tpu_export.converter.untrusted import UntrustedFileError, open_regular

__all__ = ["TfliteFormatError", "check_tflite", "read_tflite", "map_tflite", "open_interpreter"]


class TfliteFormatError(ValueError):
    """The bytes are not a well-formed .tflite (truncated, corrupt, or not a LiteRT model)."""


_FIX = "Fix: convert the model again (litert_torch.convert(...).export(path)); this file is truncated or corrupt"
_SCHEMA_VERSION = 3
# Sizes no LiteRT model for a device comes near; past them a shape is corruption, and the
# interpreter would try to allocate it (kernels also count elements in int32).
_MAX_RANK = 32
_MAX_ELEMENTS = (1 << 31) - 1
_MAX_TENSOR_BYTES = 1 << 32
# a subgraph's non-constant tensors live at once (each from the operator writing it to the last one reading it):
# what the interpreter's arena holds. Not their sum: a 32-layer ViT at 546 px declares 20 GiB of attention
# scores in all, 0.3 GiB of them at a time
_MAX_ARENA_BYTES = 1 << 34
# bytes per element by TensorType (schema order); None: no fixed size (string, resource, variant)
_ITEMSIZE = [4, 2, 4, 1, 8, None, 1, 2, 8, 1, 8, 16, 8, None, None, 4, 2, 0.5, 2, 0.25, 0.5, 1, 1]

# Option tables whose fields are not all inline scalars, by schema class name: slot -> kind, where
# kind is a vector's element size, "str", or "sg" (an int32 subgraph index) / "sgv" (a vector of them).
_OPTION_FIELDS = {
    "ConcatEmbeddingsOptions": {1: 4, 2: 4},
    "FullyConnectedOptions": {5: 1},
    "ReshapeOptions": {0: 4},
    "SqueezeOptions": {0: 4},
    "VarHandleOptions": {0: "str", 1: "str"},
    "BucketizeOptions": {0: 4},
    "CallOptions": {0: "sg"},
    "IfOptions": {0: "sg", 1: "sg"},
    "CallOnceOptions": {0: "sg"},
    "WhileOptions": {0: "sg", 1: "sg"},
    "StablehloBroadcastInDimOptions": {0: 8},
    "StablehloSliceOptions": {0: 8, 1: 8, 2: 8},
    "StablehloConvolutionOptions": {0: 8, 1: 8, 2: 8, 3: 8, 4: 1, 7: 8, 10: 8, 13: 8, 16: 4},
    "StablehloCustomCallOptions": {0: "str", 2: "str", 4: "sgv", 5: 1},
    "StablehloReduceOptions": {0: 8, 1: "sg"},
    "StablehloScatterOptions": {1: 8, 2: 8, 3: 8, 6: "sg"},
    "StablehloDynamicSliceOptions": {0: 8},
    "StablehloPadOptions": {0: 8, 1: 8, 2: 8},
    "StablehloDotGeneralOptions": {0: 8, 1: 8, 2: 8, 3: 8, 4: 4},
    "StablehloReduceWindowOptions": {0: 8, 1: 8, 2: 8, 3: 8, 4: 8, 5: "sg"},
    "StablehloWhileOptions": {0: "sg", 1: "sg"},
    "StablehloSortOptions": {2: "sg"},
    "StablehloGatherOptions": {0: 8, 1: 8, 2: 8, 4: 8},
    "StablehloTransposeOptions": {0: 8},
    "StableHLOCompositeOptions": {0: "str", 1: "sg", 2: 1},
    "StablehloCaseOptions": {0: "sgv"},
}
# Inputs an operator may leave out (index -1). LiteRT kernels fetch any other input without a
# null check, so a -1 there is a null dereference (seen: FULLY_CONNECTED's weights).
_OPTIONAL_INPUTS = {
    "FULLY_CONNECTED": {2}, "CONV_2D": {2}, "DEPTHWISE_CONV_2D": {2}, "CONV_3D": {2}, "TRANSPOSE_CONV": {3},
    "CONV_3D_TRANSPOSE": {3}, "SVDF": {3}, "LSH_PROJECTION": {2},
    # the recurrent kernels are written around optional inputs (peepholes, projection, aux inputs)
    "LSTM": "all but 0", "UNIDIRECTIONAL_SEQUENCE_LSTM": "all but 0", "BIDIRECTIONAL_SEQUENCE_LSTM": "all but 0",
    "BIDIRECTIONAL_SEQUENCE_RNN": "all but 0",
}
# Option tables shared by several operators; every other XOptions belongs to the operator X
# (ConvTranspose..., StablehloPad...), found by name. An operator carrying another operator's
# options is corrupt: its kernel reads defaults where it expects its own parameters (seen: a crash).
_SHARED_OPTIONS = {
    "Pool2DOptions": ("AVERAGE_POOL_2D", "MAX_POOL_2D", "L2_POOL_2D"), "L2NormOptions": ("L2_NORMALIZATION",),
    "ReducerOptions": ("MEAN", "SUM", "REDUCE_PROD", "REDUCE_MAX", "REDUCE_MIN", "REDUCE_ANY", "REDUCE_ALL"),
    "SequenceRNNOptions": ("UNIDIRECTIONAL_SEQUENCE_RNN",), "MaximumMinimumOptions": ("MAXIMUM", "MINIMUM"),
    "RandomOptions": ("RANDOM_STANDARD_NORMAL", "RANDOM_UNIFORM", "MULTINOMIAL"),
}
_QUANT_DETAILS = {1: {0: 1}, 2: {3: 4}, 3: {3: 4}}  # CustomQuantization, Blockwise-, MultiAxisQuantization
_SPARSE_INDEX = {1: 4, 2: 2, 3: 1}  # Int32Vector, Uint16Vector, Uint8Vector: slot 0 values


class _Bad(Exception):
    pass


_SCHEMA: dict = {}


def _schema_tables() -> dict:
    """From the installed schema (the interpreter's own): operator codes, and per options kind
    its nested-field layout and the operators that may carry it."""
    if not _SCHEMA:
        from ai_edge_litert import schema_py_generated as s

        ops = {k: v for k, v in vars(s.BuiltinOperator).items() if not k.startswith("_")}
        by_norm = {k.replace("_", "").lower(): v for k, v in ops.items()}
        for which, enum in (("options", s.BuiltinOptions), ("options2", s.BuiltinOptions2)):
            table = {}
            for name, kind in vars(enum).items():
                if name.startswith("_") or name == "NONE":
                    continue
                owners = {ops[o] for o in _SHARED_OPTIONS.get(name, ())}
                own = by_norm.get(name.removesuffix("Options").replace("_", "").lower())
                table[kind] = (_OPTION_FIELDS.get(name, {}), owners | ({own} if own is not None else set()))
            _SCHEMA[which] = table
        _SCHEMA["optional"] = {ops[k]: v for k, v in _OPTIONAL_INPUTS.items()}
        _SCHEMA["max_op"] = max(ops.values())
    return _SCHEMA


# A .tflite larger than this is not one the flatbuffer format (2 GiB) plus large-model buffers can describe
# sensibly on the machines we target; refusing it bounds what a read may allocate.
_MAX_FILE = 64 << 30


def read_tflite(path, *, check: bool = True) -> bytes:
    """The bytes of the .tflite at ``path``, checked: only a regular file is read (a FIFO or a device would
    block or never end), opened without waiting for a writer, then ``check_tflite`` (``check=False``: for a
    caller that checks the bytes itself, as litert_torch.Model does)."""
    path = os.fspath(path)
    f, size = _open_regular(path)
    with f:
        data = f.read(size + 1)
    if len(data) != size:
        raise TfliteFormatError(f"{path}: the file changed size while it was read")
    if check:
        check_tflite(data, path)
    return data


def _open_regular(path: str):
    """(binary file, size) of the regular file at ``path``, by converter/untrusted.py's rule (non-blocking
    open, fstat, the size cap before a byte is read), refused as a TfliteFormatError."""
    try:
        fd, size = open_regular(path, what="the .tflite", max_bytes=_MAX_FILE)
    except UntrustedFileError as e:
        if e.reason == "not_regular":
            raise TfliteFormatError(f"{path}: not a regular file (a FIFO, device or socket); a .tflite is read "
                                    "only from a plain file") from None
        if e.reason == "too_large":
            raise TfliteFormatError(f"{path}: larger than any .tflite this tool reads ({_MAX_FILE} bytes)") from None
        raise TfliteFormatError(f"{path}: {e.problem}") from None
    return os.fdopen(fd, "rb"), size


def map_tflite(path, *, check: bool = False):
    """A read-only memory map of the .tflite at ``path`` (a regular file; the weights are paged in
    only when read, so a multi-GB model costs no memory to open). ``check``: run check_tflite,
    which reads the flatbuffer's tables and the large-model form's offset/size fields, never the weights."""
    import mmap

    path = os.fspath(path)
    f, size = _open_regular(path)
    with f:
        if size == 0:
            raise TfliteFormatError(f"{path}: not a valid .tflite: the file is empty. {_FIX}")
        data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    if check:
        check_tflite(data, path)
    return data


def check_tflite(data, name: str = "the .tflite") -> None:
    """Raise TfliteFormatError unless ``data`` is a structurally sound LiteRT flatbuffer."""
    try:
        _Checker(memoryview(data).cast("B")).model()
    except _Bad as e:
        raise TfliteFormatError(f"{name}: not a valid .tflite: {e}. {_FIX}") from None
    except (struct.error, IndexError, ValueError, TypeError, OverflowError, MemoryError, RecursionError) as e:
        # a slip past the explicit checks still ends as the format error, never as a crash later
        raise TfliteFormatError(f"{name}: not a valid .tflite ({type(e).__name__}: {e}). {_FIX}") from None


class _Checker:
    def __init__(self, buf):
        self.b = buf
        self.n = len(buf)

    # ------------------------------------------------------------------ flatbuffer primitives
    def _u32(self, p: int) -> int:
        if p < 0 or p + 4 > self.n:
            raise _Bad(f"offset {p} is outside the {self.n}-byte file")
        return struct.unpack_from("<I", self.b, p)[0]

    def table(self, p: int, what: str):
        """(position, vtable position, vtable size, object size) of the table at ``p``."""
        if p < 0 or p + 4 > self.n or p % 4:
            raise _Bad(f"{what} is at offset {p}, outside the {self.n}-byte file")
        vt = p - struct.unpack_from("<i", self.b, p)[0]
        if vt < 0 or vt + 4 > self.n or vt % 2:
            raise _Bad(f"{what} has its field table at offset {vt}, outside the file")
        vt_size, obj_size = struct.unpack_from("<HH", self.b, vt)
        if vt_size < 4 or vt_size % 2 or vt + vt_size > self.n or obj_size < 4 or p + obj_size > self.n:
            raise _Bad(f"{what} has a corrupt field table (sizes {vt_size}, {obj_size})")
        # every field, read here or not (an unknown option's scalars), must lie inside the table
        offs = struct.unpack_from(f"<{vt_size // 2 - 2}H", self.b, vt + 4)
        if offs and (max(offs) >= obj_size or 0 < min(o or 4 for o in offs) < 4):
            raise _Bad(f"{what} has a field outside its {obj_size}-byte table")
        return p, vt, vt_size, obj_size, what

    def _field(self, t, slot: int, size: int) -> int:
        """Position of field ``slot`` (0 when absent), checked to lie inside its table."""
        p, vt, vt_size, obj_size, what = t
        at = 4 + 2 * slot
        if at + 2 > vt_size:
            return 0
        off = struct.unpack_from("<H", self.b, vt + at)[0]
        if off == 0:
            return 0
        if off < 4 or off + size > obj_size or (p + off) % size:  # aligned, as flatbuffers' own verifier wants
            raise _Bad(f"{what}: field {slot} lies outside its table or off its alignment")
        return p + off

    def scalar(self, t, slot: int, fmt: str, default=0):
        pos = self._field(t, slot, struct.calcsize(fmt))
        return struct.unpack_from(fmt, self.b, pos)[0] if pos else default

    def _ref(self, t, slot: int):
        pos = self._field(t, slot, 4)
        if not pos:
            return None
        off = self._u32(pos)
        target = pos + off
        if off == 0 or off >= 1 << 31:
            raise _Bad(f"{t[4]}: field {slot} holds the offset {off}, which points at itself or backwards")
        if target + 4 > self.n:
            raise _Bad(f"{t[4]}: field {slot} points at offset {target}, past the end of the {self.n}-byte file")
        return target

    def vector(self, t, slot: int, esize: int):
        """(start, count) of a vector field; (0, 0) when absent."""
        v = self._ref(t, slot)
        if v is None:
            return 0, 0
        count = self._u32(v)
        if v % 4:
            raise _Bad(f"{t[4]}: field {slot} is a vector at the misaligned offset {v}")
        if v + 4 + count * esize > self.n:
            raise _Bad(f"{t[4]}: field {slot} is a vector of {count} elements that runs past the end of the file")
        return v + 4, count

    def ints(self, t, slot: int, fmt: str = "i") -> tuple:
        start, count = self.vector(t, slot, struct.calcsize(fmt))
        return struct.unpack_from(f"<{count}{fmt}", self.b, start) if count else ()

    def string(self, t, slot: int) -> str | None:
        start, count = self.vector(t, slot, 1)
        if not start:
            return None
        if start + count >= self.n or self.b[start + count] != 0:
            raise _Bad(f"{t[4]}: field {slot} is a string without its terminating zero byte")
        return bytes(self.b[start:start + count]).decode("utf-8", "replace")

    def tables(self, t, slot: int, what: str) -> list:
        start, count = self.vector(t, slot, 4)
        out = []
        for i in range(count):
            e = start + 4 * i
            off = self._u32(e)
            if off == 0 or off >= 1 << 31:
                raise _Bad(f"{t[4]}: entry {i} of field {slot} points at itself or wraps around")
            out.append(self.table(e + off, f"{what} {i}"))
        return out

    # ------------------------------------------------------------------ the LiteRT schema
    def model(self) -> None:
        if self.n < 8:
            raise _Bad(f"it is {self.n} bytes long, too short for a flatbuffer")
        if bytes(self.b[4:8]) != b"TFL3":
            raise _Bad(f"the file identifier is {bytes(self.b[4:8])!r}, not b'TFL3'")
        m = self.table(self._u32(0), "the model")
        version = self.scalar(m, 0, "<I")
        if version != _SCHEMA_VERSION:
            raise _Bad(f"schema version {version}, not {_SCHEMA_VERSION}")
        if self._field(m, 8, 4) or self._field(m, 9, 4):
            raise _Bad("it references external buffer files, which this loader does not open")
        self.schema = _schema_tables()
        optional = self.schema["optional"]
        opcodes = self.tables(m, 1, "operator code")
        self.codes, self.optional = [], []  # per operator code: the operator, the inputs that may be -1
        for oc in opcodes:
            self.string(oc, 1)
            dep, code = self.scalar(oc, 0, "<b"), self.scalar(oc, 3, "<i")
            # where a file holds both, the byte-sized deprecated code repeats the code (127 for codes
            # past it); older files hold only the byte, some writers (ai-edge-quantizer) only the int
            if dep and self._field(oc, 3, 4) and not (dep == code or (dep == 127 and code >= 127)):
                raise _Bad(f"{oc[4]} names builtin operator {code} and, in its deprecated field, {dep}")
            code = max(dep, code)
            if not 0 <= code <= self.schema["max_op"]:
                raise _Bad(f"{oc[4]} names builtin operator {code}, which does not exist")
            self.codes.append(code)
            self.optional.append(optional.get(code, ()))
        self.string(m, 3)
        self.buffer_sizes = [self.buffer(b) for b in self.tables(m, 4, "buffer")]
        subgraphs = self.tables(m, 2, "subgraph")
        if not subgraphs:
            raise _Bad("it has no subgraph")
        self.n_subgraphs = len(subgraphs)
        n_tensors = [self.subgraph(i, sg, len(opcodes)) for i, sg in enumerate(subgraphs)]
        for b in self.ints(m, 5):
            self._buffer_index(b, "the metadata buffer list")
        for md in self.tables(m, 6, "metadata"):
            self.string(md, 0)
            self._buffer_index(self.scalar(md, 1, "<I"), md[4])
        for sd in self.tables(m, 7, "signature"):
            self.signature(sd, n_tensors)

    def _buffer_index(self, b: int, what: str) -> None:
        if not 0 <= b < len(self.buffer_sizes):
            raise _Bad(f"{what} points at buffer {b}, but the model has {len(self.buffer_sizes)} buffers")

    def buffer(self, t) -> int:
        count = self.vector(t, 0, 1)[1]
        offset, size = self.scalar(t, 1, "<Q"), self.scalar(t, 2, "<Q")
        if offset > 1:  # the large-model form: data after the flatbuffer (offset 1 is the converter's placeholder)
            if count or offset + size > self.n:
                raise _Bad(f"{t[4]} holds {size} bytes at offset {offset}, past the end of the {self.n}-byte file")
            return size
        return count

    def subgraph(self, i: int, sg, n_opcodes: int) -> int:
        where = f"subgraph {i}"
        tensors = self.tables(sg, 0, f"{where}: tensor")
        nt = len(tensors)
        sizes = [self.tensor(t, f"{where}: tensor {j}") for j, t in enumerate(tensors)]
        for slot, what in ((1, "input"), (2, "output")):
            for x in self.ints(sg, slot):
                if not 0 <= x < nt:
                    raise _Bad(f"{where}: {what} {x} is not one of its {nt} tensors")
        self.string(sg, 4)
        ops = self.tables(sg, 3, f"{where}: operator")
        for k, op in enumerate(ops):
            self.operator(op, f"{where}: operator {k}", nt, n_opcodes)
        arena = self._live_peak(sg, ops, sizes)
        if arena > _MAX_ARENA_BYTES:
            raise _Bad(f"{where}'s tensors need {arena / 2**30:.0f} GiB of activations at once")
        return nt

    def _live_peak(self, sg, ops, sizes) -> int:
        """The most bytes of non-constant tensors live at once, running the operators in order: a tensor lives
        from the operator writing it (the start, for inputs and tensors no operator writes) to the last one
        reading it (the end, for outputs and tensors no operator reads)."""
        n = len(ops)
        born, dead = [0] * len(sizes), [n] * len(sizes)
        written, read = set(), {}
        for k, op in enumerate(ops):
            for x in self.ints(op, 2):
                if x not in written:
                    written.add(x)
                    born[x] = k
            for slot in (1, 8):
                for x in self.ints(op, slot):
                    if x >= 0:
                        read[x] = k
        for x, k in read.items():
            dead[x] = max(k, born[x])
        for x in self.ints(sg, 2):
            dead[x] = n
        delta = [0] * (n + 2)
        for x, size in enumerate(sizes):
            if size:
                delta[born[x]] += size
                delta[dead[x] + 1] -= size
        peak = live = 0
        for d in delta:
            live += d
            peak = max(peak, live)
        return peak

    def tensor(self, t, where: str) -> int:
        """Checks one tensor; its declared bytes when the interpreter allocates it (no constant data)."""
        shape = self.ints(t, 0)
        if len(shape) > _MAX_RANK or any(d < 0 for d in shape):
            raise _Bad(f"{where} has shape {list(shape[:8])}")
        self.ints(t, 7)
        ttype = self.scalar(t, 1, "<b")
        if not 0 <= ttype < len(_ITEMSIZE):
            raise _Bad(f"{where} has element type {ttype}, which does not exist")
        b = self.scalar(t, 2, "<I")
        self._buffer_index(b, where)
        self.string(t, 3)
        if self.scalar(t, 10, "<I"):
            raise _Bad(f"{where} references an external buffer, which this loader does not open")
        numel = 1
        for d in shape:
            numel *= d
        item = _ITEMSIZE[ttype]
        nbytes = numel * (item or 0)
        if numel > _MAX_ELEMENTS or nbytes > _MAX_TENSOR_BYTES:
            raise _Bad(f"{where} has shape {list(shape)}: {numel} elements, {nbytes:.3g} bytes")
        q = self._ref(t, 4)
        if q is not None:
            self.quantization(self.table(q, f"{where}: quantization"), shape)
        sparse = self._ref(t, 6)
        if sparse is not None:
            self.sparsity(self.table(sparse, f"{where}: sparsity"))
        for v in self.tables(t, 9, f"{where}: variant"):
            self.ints(v, 0)
        size = self.buffer_sizes[b]
        if b and size and item and sparse is None:
            want = -(-numel // round(1 / item)) if item < 1 else numel * item  # int4/int2 pack into whole bytes
            if size != want:
                raise _Bad(f"{where} has shape {list(shape)} ({numel} elements) but its buffer {b} holds {size} bytes, "
                           f"not {want}")
        return 0 if size else int(nbytes)

    def quantization(self, q, shape) -> None:
        scale = self.vector(q, 2, 4)[1]
        zero = self.vector(q, 3, 8)[1]
        self.vector(q, 0, 4), self.vector(q, 1, 4)
        if scale and zero and scale != zero:
            raise _Bad(f"{q[4]} has {scale} scales but {zero} zero points")
        dim = self.scalar(q, 6, "<i")
        if scale > 1 and not (0 <= dim < len(shape) and shape[dim] == scale):
            raise _Bad(f"{q[4]} has {scale} per-channel scales along dim {dim} of shape {list(shape)}")
        kind = self.scalar(q, 4, "<B")
        if kind:
            if kind not in _QUANT_DETAILS:
                raise _Bad(f"{q[4]} has quantization details of unknown kind {kind}")
            d = self._ref(q, 5)
            if d is None:
                raise _Bad(f"{q[4]} names quantization details it does not hold")
            self.fields(self.table(d, f"{q[4]} details"), _QUANT_DETAILS[kind])

    def sparsity(self, sp) -> None:
        self.ints(sp, 0), self.ints(sp, 1)
        for dm in self.tables(sp, 2, f"{sp[4]} dim"):
            for type_slot, slot in ((2, 3), (4, 5)):
                kind = self.scalar(dm, type_slot, "<B")
                if kind:
                    ref = self._ref(dm, slot)
                    if kind not in _SPARSE_INDEX or ref is None:
                        raise _Bad(f"{dm[4]} has a corrupt index vector (kind {kind})")
                    self.vector(self.table(ref, f"{dm[4]} indices"), 0, _SPARSE_INDEX[kind])

    def fields(self, t, layout: dict) -> None:
        for slot, kind in layout.items():
            if kind == "str":
                self.string(t, slot)
            elif kind == "sg":
                self._subgraph_index(self.scalar(t, slot, "<i"), t[4])
            elif kind == "sgv":
                for x in self.ints(t, slot):
                    self._subgraph_index(x, t[4])
            else:
                self.vector(t, slot, kind)

    def _subgraph_index(self, x: int, what: str) -> None:
        if not 0 <= x < self.n_subgraphs:
            raise _Bad(f"{what} calls subgraph {x}, but the model has {self.n_subgraphs}")

    def operator(self, op, where: str, nt: int, n_opcodes: int) -> None:
        code = self.scalar(op, 0, "<I")
        if code >= n_opcodes:
            raise _Bad(f"{where} uses operator code {code}, but the model has {n_opcodes}")
        optional = self.optional[code]
        for k, x in enumerate(self.ints(op, 1)):
            if x == -1 and (k in optional or (optional == "all but 0" and k)):
                continue  # an optional input left out
            if not 0 <= x < nt:
                raise _Bad(f"{where}: input {k} is tensor {x}, not one of the subgraph's {nt} tensors"
                           + (" (this operator has no optional input there)" if x == -1 else ""))
        for slot, what in ((2, "output"), (8, "intermediate")):
            for x in self.ints(op, slot):
                if not 0 <= x < nt:
                    raise _Bad(f"{where}: {what} {x} is not one of the subgraph's {nt} tensors")
        for type_slot, slot, which in ((3, 4, "options"), (11, 12, "options2")):
            kind = self.scalar(op, type_slot, "<B")
            if kind:
                layout, owners = self.schema[which].get(kind, (None, ()))
                if layout is None:
                    raise _Bad(f"{where} has options of unknown kind {kind}")
                if self.codes[code] not in owners:
                    raise _Bad(f"{where} is operator {self.codes[code]} but carries another operator's options "
                               f"(kind {kind})")
                ref = self._ref(op, slot)
                if ref is not None:
                    self.fields(self.table(ref, f"{where} options"), layout)
        self.vector(op, 5, 1), self.vector(op, 7, 1)
        offset, size = self.scalar(op, 9, "<Q"), self.scalar(op, 10, "<Q")
        if (offset or size) and offset + size > self.n:
            raise _Bad(f"{where} has custom options at offset {offset} (+{size}), past the end of the file")

    def name(self, t, slot: int, what: str) -> str:
        """A name a runtime looks things up by: the interpreter reads it as a C string, Python by its
        length, so an embedded zero byte (or bytes that are not UTF-8) makes the two disagree."""
        start, count = self.vector(t, slot, 1)
        raw = bytes(self.b[start:start + count]) if start else b""
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            text = None
        if self.string(t, slot) is None or not raw or b"\0" in raw or text is None:
            raise _Bad(f"{what} {raw[:40]!r} is not a usable name (empty, not UTF-8 or with a zero byte inside)")
        return text

    def signature(self, sd, n_tensors: list) -> None:
        key = self.name(sd, 2, "a signature key")
        sg = self.scalar(sd, 4, "<I")
        if sg >= len(n_tensors):
            raise _Bad(f"signature {key!r} runs subgraph {sg}, but the model has {len(n_tensors)}")
        for slot in (0, 1):
            seen = set()
            for tm in self.tables(sd, slot, f"signature {key!r} tensor"):
                name = self.name(tm, 0, f"signature {key!r}: an {('input', 'output')[slot]}")
                if name in seen:
                    raise _Bad(f"signature {key!r} names {('input', 'output')[slot]} {name!r} twice")
                seen.add(name)
                x = self.scalar(tm, 1, "<I")
                if name is None or x >= n_tensors[sg]:
                    raise _Bad(f"signature {key!r}: {name!r} points at tensor {x}, "
                               f"but subgraph {sg} has {n_tensors[sg]}")


def open_interpreter(source: str, *, path=None, content=None, **options):
    """The LiteRT interpreter over a .tflite already checked (``check_tflite``): from ``path`` (it maps the file
    itself, the large-model form included) or from the bytes ``content``; ``options`` go to the Interpreter. One it
    refuses (an op its kernels lack, a tensor it cannot prepare) is a TfliteFormatError naming ``source``."""
    from ai_edge_litert.interpreter import Interpreter

    from tpu_export.converter.errors import one_line

    try:
        return Interpreter(model_path=path, **options) if path is not None else \
            Interpreter(model_content=content, **options)
    except (RuntimeError, ValueError) as e:
        raise TfliteFormatError(f"{source}: the LiteRT interpreter refused the model: {one_line(e)}") from e
