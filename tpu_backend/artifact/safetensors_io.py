"""The safetensors format, read through a memory map over any byte range of a file.

Layout (https://github.com/huggingface/safetensors, "Format"): an 8-byte little-endian header
length N, N bytes of JSON ``{name: {"dtype", "shape", "data_offsets": [begin, end]}, ...,
"__metadata__": {...}}``, then the tensor bytes. Reading from a byte range (rather than a
path) lets the same code map weights inside an uncompressed zip. Writing streams tensor by
tensor, so saving never holds a second copy of the weights. The header is parsed as data and
checked completely (dtypes, shapes, offsets, coverage) before any array is made.
"""

from __future__ import annotations

import json
import math
import struct

import numpy as np
import torch

from .dtypes import name_to_numpy, torch_to_name, torch_to_numpy_array
from .errors import ArtifactCorruptError

__all__ = ["write_safetensors", "read_safetensors"]

_CODE = {
    "float32": "F32", "float16": "F16", "bfloat16": "BF16", "float64": "F64", "int8": "I8",
    "int16": "I16", "int32": "I32", "int64": "I64", "uint8": "U8", "bool": "BOOL", "complex64": "C64",
}
_NAME = {v: k for k, v in _CODE.items()}
_MAX_HEADER = 100 * 1024 * 1024


def write_safetensors(f, tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None) -> None:
    header: dict = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    offset = 0
    for name, t in tensors.items():
        if name == "__metadata__":
            raise ValueError("a weight may not be named '__metadata__'")
        n = t.numel() * t.element_size()
        header[name] = {"dtype": _CODE[torch_to_name(t.dtype)], "shape": list(t.shape),
                        "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the data starts 8-byte aligned
    f.write(struct.pack("<Q", len(raw)))
    f.write(raw)
    from tpu_export.converter.page_release import release_pages

    for t in tensors.values():
        if t.numel():
            f.write(memoryview(torch_to_numpy_array(t).reshape(-1).view(np.uint8)))
            release_pages(t)  # a weight mapped from a model directory: its pages, read for the write, go back


def read_safetensors(path: str, offset: int, length: int, what: str = "weights.safetensors") -> dict[str, np.ndarray]:
    """Arrays (read-only memory maps) of the safetensors blob at ``path[offset:offset+length]``."""

    def bad(msg):
        return ArtifactCorruptError(f"{what}: {msg}")

    with open(path, "rb") as f:
        f.seek(offset)
        head = f.read(8)
        if len(head) < 8:
            raise bad("truncated before the header length")
        (n,) = struct.unpack("<Q", head)
        if n > min(_MAX_HEADER, length - 8):
            raise bad(f"header length {n} does not fit in {length} bytes")
        try:
            header = json.loads(f.read(n))
        except (ValueError, RecursionError) as e:  # RecursionError: a header nested absurdly deep
            raise bad(f"header is not valid JSON ({e})") from None
    if not isinstance(header, dict):
        raise bad("header is not a JSON object")
    header.pop("__metadata__", None)
    data_start, data_len = offset + 8 + n, length - 8 - n
    spans = []
    for name, e in header.items():
        if not isinstance(e, dict) or set(e) != {"dtype", "shape", "data_offsets"}:
            raise bad(f"entry {name!r} is malformed")
        if not isinstance(e["dtype"], str) or e["dtype"] not in _NAME:
            raise bad(f"entry {name!r} has unknown dtype {e['dtype']!r}")
        shape, offs = e["shape"], e["data_offsets"]
        if not (isinstance(shape, list) and all(isinstance(d, int) and d >= 0 for d in shape)):
            raise bad(f"entry {name!r} has a malformed shape {shape!r}")
        if not (isinstance(offs, list) and len(offs) == 2 and all(isinstance(o, int) for o in offs)):
            raise bad(f"entry {name!r} has malformed data_offsets {offs!r}")
        dt = name_to_numpy(_NAME[e["dtype"]])
        if not 0 <= offs[0] <= offs[1] <= data_len or offs[1] - offs[0] != math.prod(shape) * dt.itemsize:
            raise bad(f"entry {name!r} spans bytes {offs} which do not fit its shape or the file "
                      f"({data_len} data bytes): truncated or corrupted")
        spans.append((offs[0], offs[1], name, dt, shape))
    spans.sort()
    pos = 0
    for b, e, name, _, _ in spans:
        if b != pos:
            raise bad(f"entry {name!r} starts at byte {b}, expected {pos} (gap or overlap)")
        pos = e
    if pos != data_len:
        raise bad(f"{data_len - pos} trailing bytes after the last tensor")
    buf = np.memmap(path, dtype=np.uint8, mode="r", offset=data_start, shape=(data_len,)) if data_len else None
    out = {}
    for b, e, name, dt, shape in spans:
        out[name] = buf[b:e].view(dt).reshape(shape) if e > b else np.zeros(shape, dt)
    return out
