"""The safetensors format, read through a memory map over any byte range of a file.

Layout (https://github.com/huggingface/safetensors, "Format"): an 8-byte little-endian header
length N, N bytes of JSON ``{name: {"dtype", "shape", "data_offsets": [begin, end]}, ...,
"__metadata__": {...}}``, then the tensor bytes. Reading from a byte range of an open descriptor
(rather than a path) lets the same code map weights inside an uncompressed zip, and maps the very
file the container checked. Writing streams tensor by
tensor, so saving never holds a second copy of the weights. The header is parsed as data and
checked completely (dtypes, shapes, offsets, coverage) before any array is made.
"""

from __future__ import annotations

import json
import os
import struct

import numpy as np
import torch

from tpu_export.converter.safetensors_weights import check_entry, read_header
from tpu_export.converter.untrusted import UntrustedFileError, open_regular

from .dtypes import name_to_numpy, torch_to_name, torch_to_numpy_array
from .errors import ArtifactCorruptError, ArtifactError

__all__ = ["write_safetensors", "read_safetensors"]

_CODE = {
    "float32": "F32", "float16": "F16", "bfloat16": "BF16", "float64": "F64", "int8": "I8",
    "int16": "I16", "int32": "I32", "int64": "I64", "uint8": "U8", "bool": "BOOL", "complex64": "C64",
}
_NAME = {v: k for k, v in _CODE.items()}


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


def read_safetensors(source, offset: int, length: int, what: str = "weights.safetensors") -> dict[str, np.ndarray]:
    """Arrays (read-only memory maps) of the safetensors blob at bytes ``[offset, offset + length)`` of ``source``:
    an open descriptor (a container's checked one, read and mapped as it is, never reopened by name), or a path,
    opened once by converter/untrusted.py's rule. The header and every entry are checked by the converter's
    safetensors validator; an artifact's tensors must also tile the data exactly."""
    if isinstance(source, int):
        return _read_fd(source, offset, length, what)
    try:
        fd, _ = open_regular(source, what="the safetensors file")
    except UntrustedFileError as e:
        raise ArtifactError(str(e)) from None
    try:
        return _read_fd(fd, offset, length, what)
    finally:
        os.close(fd)


def _read_fd(fd: int, offset: int, length: int, what: str) -> dict[str, np.ndarray]:
    def bad(msg):
        return ArtifactCorruptError(f"{what}: {msg}")

    try:
        n, header = read_header(fd, offset, length, what)
        header.pop("__metadata__", None)
        data_len = length - 8 - n
        entries = [(name, check_entry(what, name, e, data_len)) for name, e in header.items()]
    except UntrustedFileError as e:
        raise (bad(e.problem) if e.reason == "malformed" else ArtifactError(str(e))) from None
    spans = []
    for name, (code, shape, begin, nbytes) in entries:
        if code not in _NAME:
            raise bad(f"tensor {name!r}: dtype {code} is not one a tpu-export artifact stores ({sorted(_NAME)}); "
                      "re-save the artifact with tpu-export")
        spans.append((begin, begin + nbytes, name, name_to_numpy(_NAME[code]), shape))
    spans.sort()
    pos = 0
    for b, e, name, _, _ in spans:
        if b != pos:
            raise bad(f"entry {name!r} starts at byte {b}, expected {pos} (gap or overlap)")
        pos = e
    if pos != data_len:
        raise bad(f"{data_len - pos} trailing bytes after the last tensor")
    buf = None
    if data_len:
        # the map is made from this descriptor (np.memmap dups it), so it shows the file that was checked;
        # np.memmap seeks to the end to size the file, and a zip's descriptor is shared with its reader, so its
        # position is put back
        pos = os.lseek(fd, 0, os.SEEK_CUR)
        try:
            with os.fdopen(fd, "rb", closefd=False) as f:
                buf = np.memmap(f, dtype=np.uint8, mode="r", offset=offset + 8 + n, shape=(data_len,))
        finally:
            os.lseek(fd, pos, os.SEEK_SET)
    out = {}
    for b, e, name, dt, shape in spans:
        out[name] = buf[b:e].view(dt).reshape(shape) if e > b else np.zeros(shape, dt)
    return out
