"""A Hugging Face model directory's safetensors shards (``model.safetensors`` or
``model.safetensors.index.json``) as weights: ``read_checkpoint`` checks the index and every shard's header
(JSON, nothing in it is run) and gives each tensor's dtype, shape and place without reading a byte of data;
``safetensors_loader`` reads one tensor at a time (a weights_loader for ``lazy_weights.materialize``);
``map_safetensors`` points a meta module's parameters at private maps of the shards themselves, with no copy,
where the stored dtype and layout allow.

Every file is read by converter/untrusted.py's rule, relative to the directory: the index names shards by plain
file names inside it (no ``..``, no absolute path, no symlink out of it, ``.safetensors`` only), each one a
regular file; a header's length is checked against the file's size before it is read, and every tensor's range
against the file and against its dtype and shape. Anything wrong is an ``UntrustedFileError`` naming the file and
the tensor.
"""

from __future__ import annotations

import dataclasses
import math
import os

import torch

from ._torch_compat import set_module_tensor
from .lazy_weights import _FileMap, _named_tensors
from .untrusted import Folder, UntrustedFileError, limit, pread_into

__all__ = ["Checkpoint", "TensorEntry", "check_entry", "map_safetensors", "read_checkpoint", "read_header",
           "safetensors_loader"]

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"

_SAFETENSORS_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
                       "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
                       "BOOL": torch.bool}
# bits per element of every dtype the format defines (those torch maps above, and the ones it stores but we
# never map: they are checked for size and then cast by transformers' own loader, or refused by it)
_BITS = {"F64": 64, "F32": 32, "F16": 16, "BF16": 16, "I64": 64, "I32": 32, "I16": 16, "I8": 8, "U8": 8, "BOOL": 8,
         "C64": 64, "U16": 16, "U32": 32, "U64": 64, "F8_E4M3": 8, "F8_E5M2": 8, "F8_E8M0": 8, "F6_E2M3": 6,
         "F6_E3M2": 6, "F4": 4, "E8M0": 8}
_FLOATS = {"F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2", "F8_E8M0", "F6_E2M3", "F6_E3M2", "F4", "E8M0"}
_MAX_DIM = 1 << 40


@dataclasses.dataclass(frozen=True)
class TensorEntry:
    shard: str  # the shard's file name inside the directory
    dtype_name: str  # as the header says: F32, BF16, ...
    shape: tuple
    offset: int  # of the tensor's first byte in the shard
    nbytes: int

    @property
    def dtype(self):
        """The torch dtype, or None for a format dtype torch does not map here."""
        return _SAFETENSORS_DTYPES.get(self.dtype_name)

    @property
    def is_float(self) -> bool:
        return self.dtype_name in _FLOATS


@dataclasses.dataclass
class Checkpoint:
    """The directory's shards, checked: ``tensors`` {name: TensorEntry}, ``shards`` {file name: bytes}, and the
    open ``folder`` every shard is read from (close it, or use the Checkpoint as a context manager)."""

    folder: Folder
    tensors: dict
    shards: dict

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        self.folder.close()

    @property
    def elements(self) -> int:
        return sum(math.prod(e.shape) for e in self.tensors.values())

    def open_shard(self, shard: str) -> int:
        fd, size = self.folder.open(shard, what="the shard")
        if size != self.shards[shard]:
            os.close(fd)
            raise UntrustedFileError(self.folder.shown(shard), f"changed size ({self.shards[shard]} -> {size} bytes) "
                                     "while the model was read", "leave the directory alone during a conversion",
                                     reason="changed")
        return fd


def _bad(where: str, problem: str, fix: str = "re-save the model (model.save_pretrained(DIR))"):
    return UntrustedFileError(where, problem, fix, reason="malformed")


def _shard_names(d: Folder) -> tuple[list, dict | None]:
    """([shard file name], {tensor: shard} from the index, or None for a single model.safetensors)."""
    if not d.exists(INDEX):
        return [SINGLE], None
    where = d.shown(INDEX)
    index = d.read_json(INDEX, what="the shard index")
    wm = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(wm, dict) or not wm:
        raise _bad(where, "has no weight_map (a non-empty {tensor name: shard file name} object)")
    for name, shard in wm.items():
        if not isinstance(shard, str) or not name:
            raise _bad(where, f"weight_map[{name!r}] is {shard!r}, not a shard file name")
        if "/" in shard or "\\" in shard or shard in (".", "..") or os.path.isabs(shard) or "\0" in shard:
            raise _bad(where, f"weight_map[{name!r}] names {shard!r}, which is not a plain file name inside the "
                       "directory", "keep every shard beside the index and name it by its file name alone")
        if not shard.endswith(".safetensors"):
            raise _bad(where, f"weight_map[{name!r}] names {shard!r}, not a .safetensors file (only safetensors "
                       "weights are read)", "re-save the model with safetensors (model.save_pretrained(DIR))")
    return sorted(set(wm.values())), wm


def _header(d: Folder, shard: str) -> tuple[int, int, dict]:
    """(shard size, header length, header) of a shard of the directory."""
    fd, size = d.open(shard, what="the shard")
    try:
        n, header = read_header(fd, 0, size, d.shown(shard))
    finally:
        os.close(fd)
    return size, n, header


def read_header(fd: int, offset: int, size: int, where: str) -> tuple[int, dict]:
    """(header length, header) of the safetensors blob ``size`` bytes long at ``offset`` of the open ``fd``: the
    length is checked against ``size`` and ``limit("safetensors_header")`` before the header is read, so at most
    that many bytes are read; ``where`` names the file in the ``UntrustedFileError``."""
    try:
        if size < 8:
            raise _bad(where, f"is {size} bytes, too short for a safetensors file (truncated)")
        n = int.from_bytes(os.pread(fd, 8, offset), "little")
        cap = limit("safetensors_header")
        if not 2 <= n <= min(size - 8, cap):
            raise _bad(where, f"its header length {n} does not fit the {size}-byte file (at most "
                       f"{min(size - 8, cap)}): truncated or not a safetensors file")
        raw = os.pread(fd, n, offset + 8)
    except OSError as e:
        raise UntrustedFileError(where, f"cannot be read ({e.strerror})", "make it readable",
                                 reason="unreadable") from None
    import json

    try:
        header = json.loads(raw)
    except (ValueError, RecursionError):
        raise _bad(where, "its header is not valid JSON: truncated or not a safetensors file") from None
    if len(raw) != n or not isinstance(header, dict):
        raise _bad(where, "its header is not a JSON object: truncated or not a safetensors file")
    return n, header


def check_entry(where: str, name: str, e, data_bytes: int) -> tuple[str, tuple, int, int]:
    """(dtype name, shape, first data byte, byte count) of one header entry, checked: a format dtype, a shape of
    sizes, and data_offsets inside the ``data_bytes`` after the header that hold exactly that shape."""
    if not isinstance(e, dict):
        raise _bad(where, f"tensor {name!r}: its header entry is not an object")
    dt, shape, offs = e.get("dtype"), e.get("shape"), e.get("data_offsets")
    if not isinstance(dt, str) or dt not in _BITS:
        raise _bad(where, f"tensor {name!r}: unknown dtype {dt!r}")
    ints = (lambda v, k: isinstance(v, list) and len(v) == k if k else isinstance(v, list))
    if not ints(shape, 0) or not all(type(x) is int and 0 <= x <= _MAX_DIM for x in shape) or len(shape) > 16:
        raise _bad(where, f"tensor {name!r}: shape {shape!r} is not a list of sizes")
    if not ints(offs, 2) or not all(type(x) is int for x in offs) or not 0 <= offs[0] <= offs[1] <= data_bytes:
        raise _bad(where, f"tensor {name!r}: data_offsets {offs!r} do not lie inside the file's {data_bytes} bytes "
                   "of data: truncated or corrupt")
    want = -(-math.prod(shape) * _BITS[dt] // 8)
    if offs[1] - offs[0] != want:
        raise _bad(where, f"tensor {name!r}: {offs[1] - offs[0]} bytes of data for shape {tuple(shape)} of {dt} "
                   f"({want} bytes): corrupt")
    return dt, tuple(shape), offs[0], want


def _entry(where: str, shard: str, name: str, e, data_bytes: int, data_at: int) -> TensorEntry:
    dt, shape, begin, nbytes = check_entry(where, name, e, data_bytes)
    return TensorEntry(shard, dt, shape, data_at + begin, nbytes)


def read_checkpoint(folder) -> Checkpoint:
    """The directory's shards checked and their headers read (see the module doc); no tensor data is read."""
    d = folder if isinstance(folder, Folder) else Folder(folder, what="the model directory")
    try:
        names, wm = _shard_names(d)
        tensors, shards = {}, {}
        for shard in names:
            size, n, header = _header(d, shard)
            shards[shard] = size
            where = d.shown(shard)
            for name, e in header.items():
                if name == "__metadata__":
                    continue
                if name in tensors:
                    raise _bad(where, f"tensor {name!r} is also in {tensors[name].shard}; a tensor is stored once")
                tensors[name] = _entry(where, shard, name, e, size - 8 - n, 8 + n)
        if wm is not None:
            for name, shard in wm.items():
                got = tensors.get(name)
                if got is None or got.shard != shard:
                    raise _bad(d.shown(INDEX), f"weight_map puts tensor {name!r} in {shard}, whose header does not "
                               "hold it", "re-save the model (the index and its shards disagree)")
        return Checkpoint(d, tensors, shards)
    except BaseException:
        if d is not folder:
            d.close()
        raise


def map_safetensors(module: torch.nn.Module, folder, checkpoint: Checkpoint | None = None):
    """``materialize(module, safetensors_loader(folder))`` without the copy: each tensor the directory's shards
    hold in the module's dtype, aligned, becomes a view of a private map of its shard, read on demand (the 0.84 B
    Llama's 3.3 GB spool cost 6 s of a 36 s convert-lm). Returns what materialize returns (the maps in place
    of the spool: keep them alive as long as the module), or None, with the module unchanged, when any tensor is
    not so stored (another dtype: materialize casts it into a spool) or a meta parameter is missing (materialize
    names it)."""
    ckpt = checkpoint or read_checkpoint(folder)
    try:
        return _map(module, ckpt)
    finally:
        if checkpoint is None:
            ckpt.close()


def _map(module, ckpt: Checkpoint):
    entries = ckpt.tensors
    plan, placed = [], {}
    for mod, attr, name, t, is_param in _named_tensors(module):
        if id(t) not in placed:
            e = entries.get(name, entries.get(name.removeprefix("module.")))
            if e is None:
                if t.is_meta:
                    return None
                continue
            size = t.element_size()
            if e.dtype != t.dtype or e.shape != tuple(t.shape) or e.offset % size or e.nbytes != t.numel() * size:
                return None
            placed[id(t)] = e
        plan.append((mod, attr, t, is_param))
    maps = {}
    for shard in sorted({e.shard for e in placed.values()}):
        fd = ckpt.open_shard(shard)
        try:
            maps[shard] = _FileMap(ckpt.folder.shown(shard), fd)
        finally:
            os.close(fd)
    views: dict[int, torch.Tensor] = {}
    undo = []
    for mod, attr, t, is_param in plan:
        v = views.get(id(t))
        if v is None:
            e = placed[id(t)]
            v = maps[e.shard].tensor(e.offset, t)
            v = torch.nn.Parameter(v, requires_grad=False) if is_param else v
            views[id(t)] = v
        set_module_tensor(mod, attr, v, is_param)
        undo.append((mod, attr, t, is_param))
    return undo, list(maps.values())


def safetensors_loader(folder, checkpoint=None):
    """A weights_loader reading a model directory's safetensors shards one tensor at a time (each read is the
    tensor's checked byte range of its shard, nothing more). ``checkpoint``: the directory's read_checkpoint
    already made, left open for its owner (else the loader reads its own and closes it with itself)."""
    ckpt = checkpoint if checkpoint is not None else read_checkpoint(folder)
    fds: dict[str, int] = {}

    def load(name: str) -> torch.Tensor:
        e = ckpt.tensors.get(name)
        if e is None:
            raise KeyError(name)
        if e.dtype is None:
            raise KeyError(f"{name}: stored as {e.dtype_name}, which this loader does not read")
        if e.shard not in fds:
            fds[e.shard] = ckpt.open_shard(e.shard)
        buf = bytearray(e.nbytes)
        got = pread_into(fds[e.shard], buf, e.offset)
        if got != e.nbytes:
            raise UntrustedFileError(ckpt.folder.shown(e.shard), f"tensor {name!r}: read {got} of {e.nbytes} bytes "
                                     "(the file shrank while read)", "leave the directory alone during a conversion",
                                     reason="changed")
        if not e.nbytes:
            return torch.empty(e.shape, dtype=e.dtype)
        return torch.frombuffer(buf, dtype=e.dtype).reshape(e.shape)

    def close():
        for fd in fds.values():
            os.close(fd)
        fds.clear()
        if checkpoint is None:
            ckpt.close()

    load.close = close
    load.checkpoint = ckpt
    return load
