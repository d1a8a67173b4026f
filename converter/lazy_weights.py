"""Weights that live on disk, not in memory: a spool file the weights are streamed into one
tensor at a time, memory-mapped back as the module's parameters.

A module built on the meta device (``with torch.device("meta"): model = Model(config)``) has no
weight bytes; ``materialize`` asks a ``weights_loader`` for each meta parameter (litert-torch
0.10's meaning: a callable ``name -> tensor`` or a dict, names as in ``module.named_parameters()``,
a leading ``module.`` tried stripped), writes it into an unlinked temp file, drops it, and puts a
tensor viewing a private map of that file in the module. Capture, the shared passes and the
lowering then see ordinary CPU tensors, but their bytes are file pages the kernel loads on
demand and ``drop_pages`` gives back once a writer has copied them: a model converts with
about one tensor of weights in memory at a time. ``restore`` puts the meta tensors back.

A model directory's safetensors shards are read by converter/safetensors_weights.py (a loader, or
maps of the shards themselves).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import tempfile
import weakref

import numpy as np
import torch

from ._torch_compat import set_module_tensor

__all__ = ["materialize", "restore", "drop_pages", "drop_all_pages", "spool_holding", "load_one",
           "WeightsLoaderError", "StorageReleaser", "params_on_meta"]

_ALIGN = 64
_PAGE = mmap.PAGESIZE
_DROP_PIECE = 256 << 20  # bytes checked and released at once by _Spool.drop
# the spools alive in this process (filled only while a conversion holds one)
_SPOOLS: "weakref.WeakSet[_Spool]" = weakref.WeakSet()


class WeightsLoaderError(KeyError):
    """A weight the loader does not have, or has with another shape."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class _Spool:
    """An unlinked temp file, mapped privately once every weight is in it."""

    def __init__(self, folder: str | None):
        fd, path = tempfile.mkstemp(prefix=".tpu-export-weights-", dir=folder)
        os.unlink(path)  # nothing left behind, whatever happens to the process
        self.file = os.fdopen(fd, "w+b")
        self.size = 0
        self.map = None
        self.base = 0

    def append(self, t: torch.Tensor) -> int:
        at = -(-self.size // _ALIGN) * _ALIGN
        if at != self.size:
            self.file.write(b"\0" * (at - self.size))
        raw = t.detach().contiguous().reshape(-1)
        if raw.numel():
            self.file.write(memoryview(raw.view(torch.uint8).numpy()))
        self.size = at + raw.numel() * raw.element_size()
        return at

    def open(self) -> None:
        self.file.flush()
        if self.size:
            # private: pages are read from the file on demand and can be dropped again (nobody writes them)
            self.map = mmap.mmap(self.file.fileno(), self.size, access=mmap.ACCESS_COPY)
            self.base = np.frombuffer(self.map, np.uint8, count=1).ctypes.data
        _SPOOLS.add(self)

    def tensor(self, at: int, like: torch.Tensor) -> torch.Tensor:
        n = like.numel() * like.element_size()
        if not n:
            return torch.empty(like.shape, dtype=like.dtype)
        flat = torch.frombuffer(self.map, dtype=torch.uint8, count=n, offset=at)
        return flat.view(like.dtype).reshape(like.shape)

    def release(self, addr: int, nbytes: int) -> bool:
        """Give back the pages of this map under [addr, addr + nbytes) (inside the map) that were never written,
        through converter.page_release's check (a page a parameter's in-place write copied stays: MADV_DONTNEED
        on this private map would bring back the file's bytes), in pieces of 256 MiB so that one written page
        keeps only its own piece. True when every piece was given back."""
        from .page_release import release_span

        lo = (addr - self.base) // _PAGE * _PAGE
        hi = min(self.size, -(-(addr - self.base + nbytes) // _PAGE) * _PAGE)
        return all([release_span(self, at, min(hi, at + _DROP_PIECE)) for at in range(lo, hi, _DROP_PIECE)])


class _FileMap(_Spool):
    """A file mapped privately as it is (a safetensors shard): a spool whose bytes were never copied."""

    def __init__(self, path: str, fd: int | None = None):
        """``fd``: the shard already opened by converter/untrusted.py's rule (the map keeps no descriptor)."""
        with open(path, "rb") if fd is None else os.fdopen(os.dup(fd), "rb") as f:
            self.size = os.fstat(f.fileno()).st_size
            # private, as the spool's: a write to a parameter never reaches the user's file
            self.map = mmap.mmap(f.fileno(), self.size, access=mmap.ACCESS_COPY) if self.size else None
        self.file = None
        self.base = np.frombuffer(self.map, np.uint8, count=1).ctypes.data if self.map is not None else 0
        _SPOOLS.add(self)


def drop_pages(array) -> bool:
    """If ``array`` views a spool, give its pages back to the kernel (they are re-read from the
    file if used again) and return True. Anything else is left alone (False): a no-op without a
    conversion's spool."""
    addr, n = _address(array)
    sp = spool_holding(addr, n)
    if sp is None:
        return False
    sp.release(addr, n)
    return True


def spool_holding(addr: int, nbytes: int):
    """The spool (or mapped shard) whose map holds all of [addr, addr + nbytes), or None."""
    if not nbytes:
        return None
    for sp in list(_SPOOLS):
        if sp.map is not None and sp.base <= addr and addr + nbytes <= sp.base + sp.size:
            return sp
    return None


def _address(array) -> tuple[int, int]:
    """(address, bytes) of an ndarray or a memoryview of one; (0, 0) for anything else."""
    if isinstance(array, memoryview):
        array = np.frombuffer(array, np.uint8) if array.nbytes else None
    if not isinstance(array, np.ndarray) or not array.nbytes:
        return 0, 0
    return array.__array_interface__["data"][0], array.nbytes


def drop_all_pages() -> None:
    """Give back every spool page read so far (after a computation read weights from them)."""
    for sp in list(_SPOOLS):
        if sp.map is not None:
            sp.release(sp.base, sp.size)


def load_one(loader, name: str, like: torch.Tensor) -> torch.Tensor | None:
    """The loader's tensor for parameter ``name`` (cast to ``like``'s dtype), or None when it has none."""
    got = None
    for key in dict.fromkeys((name, name.removeprefix("module."))):
        if callable(loader):
            try:
                got = loader(key)
            except (KeyError, TypeError):
                continue
        elif isinstance(loader, dict):
            got = loader.get(key)
        else:
            raise TypeError(f"weights_loader must be a callable name -> tensor or a dict, not {type(loader).__name__}")
        if got is not None:
            break
    if got is None:
        return None
    got = torch.as_tensor(got)
    if tuple(got.shape) != tuple(like.shape):
        raise WeightsLoaderError(f"weights_loader gave {name!r} the shape {tuple(got.shape)}, but the module's "
                                 f"parameter has {tuple(like.shape)}. Fix: give the loader the checkpoint this "
                                 "module was built for")
    return got.to(like.dtype) if got.dtype != like.dtype else got


def _named_tensors(module: torch.nn.Module):
    """(owner module, attribute, full name, tensor, is_parameter) for every parameter and buffer,
    shared ones (tied weights) under each of their names."""
    for mod_name, mod in module.named_modules(remove_duplicate=False):
        own = ((True, mod.named_parameters(recurse=False, remove_duplicate=False)),
               (False, mod.named_buffers(recurse=False, remove_duplicate=False)))  # None slots skipped
        for kind, named in own:
            for attr, t in named:
                yield mod, attr, f"{mod_name}.{attr}" if mod_name else attr, t, kind


def materialize(module: torch.nn.Module, loader, *, folder: str | None = None, progress=None):
    """Replace the module's tensors the loader has (and every meta one) by views of a spool file,
    loading one tensor at a time. Returns the undo list for ``restore``; raises
    WeightsLoaderError naming a meta parameter the loader lacks (nothing is changed then)."""
    spool = _Spool(folder)
    placed: dict[int, tuple[int, torch.Tensor]] = {}  # id(original) -> (offset, original)
    entries = []
    total = 0
    for mod, attr, name, t, is_param in _named_tensors(module):
        if id(t) not in placed:
            got = load_one(loader, name, t) if loader is not None else None
            if got is None:
                if t.is_meta:
                    raise WeightsLoaderError(
                        f"parameter {name!r} {tuple(t.shape)} is on the meta device and weights_loader has no "
                        "value for it. Fix: give the loader every parameter (names as in "
                        "module.named_parameters()), or create that one on the CPU")
                continue
            placed[id(t)] = (spool.append(got), t)
            total += got.numel() * got.element_size()
            del got
            if progress is not None:
                progress(len(placed), total)
        entries.append((mod, attr, t, is_param))
    spool.open()
    views: dict[int, torch.Tensor] = {}
    undo = []
    for mod, attr, t, is_param in entries:
        v = views.get(id(t))
        if v is None:
            v = spool.tensor(placed[id(t)][0], t)
            v = torch.nn.Parameter(v, requires_grad=False) if is_param else v
            views[id(t)] = v
        set_module_tensor(mod, attr, v, is_param)
        undo.append((mod, attr, t, is_param))
    return undo, spool


@contextlib.contextmanager
def params_on_meta():
    """Modules built inside get their parameters on the meta device and their buffers on the CPU, computed by
    their constructors (a rotary table, an embedding scale: non-persistent buffers no checkpoint holds, which a
    module built under ``torch.device("meta")`` would lack). For ``materialize`` to fill the parameters from a
    loader. Patches ``torch.nn.Module.register_parameter`` for the duration of the block (one thread)."""
    orig = torch.nn.Module.register_parameter

    def register(self, name, param):
        if param is not None and not param.is_meta:
            param = torch.nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)
        orig(self, name, param)

    torch.nn.Module.register_parameter = register
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = orig


def restore(undo) -> None:
    """Put back the tensors ``materialize`` replaced (the module is as the caller gave it)."""
    entries, _ = undo
    for mod, attr, t, is_param in entries:
        set_module_tensor(mod, attr, t, is_param)


class StorageReleaser:
    """``delete_in_memory_params``: empties each weight tensor (``t.data = torch.empty(0)``, as
    litert-torch does) once no array waiting to be written views its storage any more, so the
    storage is freed as soon as the writer drops its view. Built after lowering from the arrays
    a writer still holds (``pending``); storages none of them views are emptied at once.
    (``resize_(0)`` is no way: a storage numpy has viewed is marked not resizable.)"""

    def __init__(self, tensors, pending):
        import bisect

        self._bisect = bisect
        groups: dict[int, list] = {}
        sizes: dict[int, int] = {}
        for t in tensors:
            if isinstance(t, torch.Tensor) and not t.is_meta and t.device.type == "cpu":
                st = t.untyped_storage()
                if st.nbytes():
                    groups.setdefault(st.data_ptr(), []).append(t)
                    sizes[st.data_ptr()] = st.nbytes()
        self._starts = sorted(groups)
        self._ends = [s + sizes[s] for s in self._starts]
        self._owners = [groups[s] for s in self._starts]
        self._count = [0] * len(self._starts)
        for a in pending:
            k = self._find(a)
            if k is not None:
                self._count[k] += 1
        for k, c in enumerate(self._count):
            if c == 0:
                self._free(k)

    def _find(self, array):
        addr, n = _address(array)
        if not n:
            return None
        k = self._bisect.bisect_right(self._starts, addr) - 1
        return k if k >= 0 and addr < self._ends[k] else None

    def _free(self, k: int) -> None:
        for t in self._owners[k]:
            with torch.no_grad():
                t.data = torch.empty(0, dtype=t.dtype)
        self._owners[k] = []

    def __call__(self, array) -> None:
        k = self._find(array)
        if k is not None:
            self._count[k] -= 1
            if self._count[k] == 0:
                self._free(k)
