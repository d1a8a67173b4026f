"""The LiteRT flatbuffer writer: buffers, tensors, operator codes, subgraphs, signature defs.

Built on the object API of ``ai_edge_litert.schema_py_generated`` and packed with
``flatbuffers.Builder``. Buffer data goes in as numpy arrays (one memcpy each, 16-byte
aligned as the schema's ``force_align`` asks), and identical buffers are stored once, so
weights shared by several signatures, or repeated constants, cost their bytes once.
"""

from __future__ import annotations

import hashlib

import numpy as np

__all__ = ["schema", "ModelBuilder", "SubgraphBuilder", "options", "TENSOR_TYPE", "NP_DTYPE", "type_names",
           "builtin_names"]

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


class _AlignedBuffer:
    """A BufferT stand-in whose Pack writes its bytes 16-byte aligned in one copy."""

    def __init__(self, data: bytes | None):
        self.data = data

    def Pack(self, builder):  # noqa: N802 - the object API's method name
        s = schema()
        vec = None
        if self.data:
            n = len(self.data)
            builder.StartVector(1, n, 16)
            builder.head = builder.head - n
            builder.Bytes[builder.head : builder.head + n] = self.data
            builder.vectorNumElems = n
            vec = builder.EndVector()
        s.BufferStart(builder)
        if vec is not None:
            s.BufferAddData(builder, vec)
        return s.BufferEnd(builder)


class ModelBuilder:
    """Owns what subgraphs share: buffers (deduplicated by content) and operator codes."""

    def __init__(self):
        self.buffers: list[_AlignedBuffer] = [_AlignedBuffer(None)]  # buffer 0: the empty sentinel
        self._buffer_by_digest: dict[bytes, int] = {}
        self._opcodes: dict[int, int] = {}  # builtin code -> index in operator_codes
        self._opcode_versions: list[list[int]] = []  # [code, version]
        self.subgraphs: list[SubgraphBuilder] = []
        self.signature_defs = []
        self.metadata: dict[str, bytes] = {}

    def buffer(self, array: np.ndarray) -> int:
        data = np.asarray(array).tobytes(order="C")
        digest = hashlib.blake2b(data, digest_size=20).digest() + str(len(data)).encode()
        idx = self._buffer_by_digest.get(digest)
        if idx is None:
            idx = len(self.buffers)
            self.buffers.append(_AlignedBuffer(data))
            self._buffer_by_digest[digest] = idx
        return idx

    def opcode(self, code: int, version: int = 1) -> int:
        idx = self._opcodes.get(code)
        if idx is None:
            idx = len(self._opcode_versions)
            self._opcodes[code] = idx
            self._opcode_versions.append([code, version])
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

    def finish(self) -> bytes:
        import flatbuffers

        s = schema()
        model = s.ModelT()
        model.version = 3
        model.description = "tpu-export edge backend"
        codes = []
        for code, version in self._opcode_versions:
            oc = s.OperatorCodeT()
            oc.builtinCode = code
            oc.deprecatedBuiltinCode = min(code, 127)
            oc.version = version
            codes.append(oc)
        model.operatorCodes = codes
        model.subgraphs = [sg.to_object() for sg in self.subgraphs]
        meta = []
        for name, data in self.metadata.items():
            m = s.MetadataT()
            m.name = name
            m.buffer = len(self.buffers)
            self.buffers.append(_AlignedBuffer(data))
            meta.append(m)
        model.metadata = meta or None
        model.buffers = self.buffers
        model.signatureDefs = self.signature_defs
        size = sum(len(b.data or b"") for b in self.buffers)
        fb = flatbuffers.Builder(size + 1024 * 1024)
        fb.Finish(model.Pack(fb), file_identifier=b"TFL3")
        return bytes(fb.Output())


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

    def op(self, code: int, inputs: list[int], outputs: list[int], opts=None, version: int = 1):
        s = schema()
        o = s.OperatorT()
        o.opcodeIndex = self.model.opcode(code, version)
        o.inputs = list(inputs)
        o.outputs = list(outputs)
        if opts is not None:
            o.builtinOptionsType, o.builtinOptions = opts
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
