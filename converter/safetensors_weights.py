"""A Hugging Face model directory's safetensors shards (``model.safetensors`` or
``model.safetensors.index.json``) as weights: ``safetensors_loader`` reads one tensor at a time (a
weights_loader for ``lazy_weights.materialize``); ``map_safetensors`` points a meta module's parameters at
private maps of the shards themselves, with no copy, where the stored dtype and layout allow. The shards'
headers are JSON: nothing in them is run.
"""

from __future__ import annotations

import json
import os

import torch

from ._torch_compat import set_module_tensor
from .lazy_weights import _FileMap, _named_tensors

__all__ = ["map_safetensors", "safetensors_loader"]

_SAFETENSORS_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
                       "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
                       "BOOL": torch.bool}


def _safetensors_entries(folder: str) -> dict | None:
    """{tensor name: (shard path, torch dtype, shape, byte offset in the shard, bytes)} from the shards' headers
    (JSON, never code), or None when a shard is missing, unreadable or holds a dtype or range this does not map."""
    index = os.path.join(folder, "model.safetensors.index.json")
    try:
        if os.path.isfile(index):
            with open(index) as f:
                shards = sorted(set(json.load(f)["weight_map"].values()))
        else:
            shards = ["model.safetensors"]
        out = {}
        for shard in shards:
            path = os.path.join(folder, shard)
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                n = int.from_bytes(f.read(8), "little")
                if not 0 < n <= min(size - 8, 100 << 20):
                    return None
                header = json.loads(f.read(n))
            for name, e in header.items():
                if name == "__metadata__":
                    continue
                dtype = _SAFETENSORS_DTYPES.get(e["dtype"])
                begin, end = (int(v) for v in e["data_offsets"])
                if dtype is None or not 0 <= begin <= end <= size - 8 - n:
                    return None
                out[name] = (path, dtype, tuple(int(d) for d in e["shape"]), 8 + n + begin, end - begin)
        return out
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def map_safetensors(module: torch.nn.Module, folder: str):
    """``materialize(module, safetensors_loader(folder))`` without the copy: each tensor the directory's shards
    hold in the module's dtype, aligned, becomes a view of a private map of its shard, read on demand (the 0.84 B
    Llama's 3.3 GB spool cost 6 s of a 36 s convert-lm, #15). Returns what materialize returns (the maps in place
    of the spool: keep them alive as long as the module), or None, with the module unchanged, when any tensor is
    not so stored (another dtype: materialize casts it into a spool) or a meta parameter is missing (materialize
    names it)."""
    entries = _safetensors_entries(os.fspath(folder))
    if entries is None:
        return None
    plan, placed = [], {}
    for mod, attr, name, t, is_param in _named_tensors(module):
        if id(t) not in placed:
            e = entries.get(name, entries.get(name.removeprefix("module.")))
            if e is None:
                if t.is_meta:
                    return None
                continue
            _, dtype, shape, at, n = e
            size = t.element_size()
            if dtype != t.dtype or shape != tuple(t.shape) or at % size or n != t.numel() * size:
                return None
            placed[id(t)] = e
        plan.append((mod, attr, t, is_param))
    maps = {path: _FileMap(path) for path in {e[0] for e in placed.values()}}
    views: dict[int, torch.Tensor] = {}
    undo = []
    for mod, attr, t, is_param in plan:
        v = views.get(id(t))
        if v is None:
            path, _, _, at, _ = placed[id(t)]
            v = maps[path].tensor(at, t)
            v = torch.nn.Parameter(v, requires_grad=False) if is_param else v
            views[id(t)] = v
        set_module_tensor(mod, attr, v, is_param)
        undo.append((mod, attr, t, is_param))
    return undo, list(maps.values())


def safetensors_loader(folder: str):
    """A weights_loader reading a model directory's safetensors shards one tensor at a time."""
    from safetensors import safe_open

    folder = os.fspath(folder)
    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index) as f:
            where = {k: os.path.join(folder, v) for k, v in json.load(f)["weight_map"].items()}
    else:
        single = os.path.join(folder, "model.safetensors")
        if not os.path.isfile(single):
            raise FileNotFoundError(f"{folder}: no model.safetensors or model.safetensors.index.json. Fix: pass a "
                                    "Hugging Face model directory saved with safetensors")
        with safe_open(single, framework="pt") as f:
            where = dict.fromkeys(f.keys(), single)

    def load(name: str) -> torch.Tensor:
        path = where.get(name)
        if path is None:
            raise KeyError(name)
        with safe_open(path, framework="pt") as f:
            return f.get_tensor(name)

    return load
