"""Large-model conversion for convert(): weights loaded from a weights_loader into a file-backed
map, streamed into the output file, freed as they are written, and a memory check before work."""

from __future__ import annotations

import contextlib
import os
import tempfile
import weakref

import torch

from tpu_export.converter.machine import mem_available

__all__ = ["check_memory", "materialized", "write_or_bytes", "InsufficientMemoryError", "weight_bytes",
           "streams_quantization"]


class InsufficientMemoryError(MemoryError):
    """The conversion would need more memory than the machine has available; nothing was started."""


def _modules(modules):
    return [m for m in modules if isinstance(m, torch.nn.Module)]


def _tensors(module):
    seen = set()
    for t in list(module.parameters()) + list(module.buffers()):
        if id(t) not in seen:
            seen.add(id(t))
            yield t


def weight_bytes(modules) -> tuple[int, int]:
    """(bytes in memory, bytes on the meta device) of the modules' parameters and buffers, each once."""
    real = meta = 0
    seen = set()
    for m in _modules(modules):
        for t in _tensors(m):
            if id(t) in seen:
                continue
            seen.add(id(t))
            n = t.numel() * t.element_size()
            if t.is_meta:
                meta += n
            else:
                real += n
    return real, meta


# Extra memory a conversion needs on top of the module's weights, per weight byte, measured with
# bench/large.py on a 0.49 B Llama (1.81 GB): the classic in-memory result (the lowering's folded
# copies, the flatbuffer builder, its bytes) peaked 4.6 GB above the loaded model (2.5x); a
# streamed write (folded copies spilled to disk) 0.06 GB above it, so 0.3x is a generous bound.
_EXTRA_IN_MEMORY = 2.6
_EXTRA_STREAMED = 0.3
_FIXED = 1 << 30  # torch.export, the graphs, the interpreter


def estimate_peak(modules, *, to_file: bool, loader) -> int:
    real, meta = weight_bytes(modules)
    if loader is not None:  # what the loader gives goes to a file-backed spool, not to memory
        return _FIXED + int(real * _EXTRA_STREAMED)
    return _FIXED + int(real * (_EXTRA_STREAMED if to_file else _EXTRA_IN_MEMORY))


def check_memory(modules, *, to_file: bool, loader) -> None:
    """Raise InsufficientMemoryError before any work when the estimated extra memory exceeds
    /proc/meminfo's MemAvailable."""
    avail = mem_available()
    if avail is None:
        return
    need = estimate_peak(modules, to_file=to_file, loader=loader)
    if need > avail:
        real, _ = weight_bytes(modules)
        fix = ("pass output_file_path=... (weights streamed into the file) and delete_in_memory_params=True"
               if not to_file else "build the module on the meta device and pass weights_loader=... (weights read "
               "one tensor at a time), or free memory")
        raise InsufficientMemoryError(
            f"converting this model ({real / 2**30:.2f} GiB of weights in memory) needs about {need / 2**30:.1f} GiB "
            f"more, but the machine has {avail / 2**30:.1f} GiB available (/proc/meminfo MemAvailable). "
            f"Fix: {fix}")


@contextlib.contextmanager
def materialized(modules, loader, output_file_path, progress):
    """Meta (or loader-given) parameters backed by a file-backed spool for the conversion, then put back."""
    from tpu_export.converter.lazy_weights import materialize, restore

    folder = os.path.dirname(os.path.abspath(os.fspath(output_file_path))) if output_file_path else None
    handles = []
    try:
        for m in _modules(modules):
            if loader is not None or any(t.is_meta for t in _tensors(m)):
                handles.append(materialize(m, loader, folder=folder, progress=_loaded(progress)))
        yield
    finally:
        for h in reversed(handles):
            restore(h)


def _loaded(progress):
    if progress is None:
        return None
    step = [0]

    def report(k, total):
        if total - step[0] >= 1 << 30:
            step[0] = total
            progress(f"weights_loader: {k} tensors, {total / 2**20:,.0f} MiB spooled")

    return report


# Past this many bytes of weights, a file-bound conversion to a scheme of edge.quantize_stream.STREAM_SCHEMES
# (dynamic_int8, weight_only_int8, dynamic_int4_block32) quantizes while streaming (ai-edge-quantizer works on the
# whole model in memory, several times its size).
_STREAM_QUANT_FROM = 1 << 30


def streams_quantization(quant, modules, to_file: bool) -> str | None:
    """The scheme to apply while streaming, or None for ai-edge-quantizer's in-memory pass."""
    from tpu_export.edge.quantize_stream import STREAM_SCHEMES

    if quant is None or not to_file or quant.recipe is not None or quant.scheme not in STREAM_SCHEMES:
        return None
    real, meta = weight_bytes(modules)
    return quant.scheme if real + meta > _STREAM_QUANT_FROM else None


def write_or_bytes(prog, modules, *, output_file_path, lightweight, delete_params, progress, stream_quant=None):
    """Lower ``prog``; the classic bytes for a small in-memory conversion (as before), otherwise a
    Model over the file the weights were streamed into (``output_file_path``, or a temp file
    removed with the Model when lightweight or past 2 GiB)."""
    from tpu_export.converter.lazy_weights import StorageReleaser
    from tpu_export.edge.builder import CLASSIC_LIMIT
    from tpu_export.edge.convert import lower_program, write_model

    from ._model import Model

    to_file = output_file_path is not None or lightweight
    big = sum(w.numel() * w.element_size() for w in prog.weights.values()) > CLASSIC_LIMIT // 2
    folder = os.path.dirname(os.path.abspath(os.fspath(output_file_path))) if output_file_path is not None else None
    model = lower_program(prog, spill=to_file or big, spill_folder=folder)
    if stream_quant is not None:
        from tpu_export.edge.quantize_stream import quantize_weights

        quantize_weights(model, stream_quant)
    owned = [t for m in _modules(modules) for t in _tensors(m)] + list(prog.weights.values())
    if output_file_path is None and not lightweight and not model.is_large():
        data = model.finish()
        if delete_params:
            del model
            StorageReleaser(owned, [])
        return data
    release = StorageReleaser(owned, [b.data for b in model.buffers]) if delete_params else None
    del owned
    temp = output_file_path is None
    if temp:
        fd, path = tempfile.mkstemp(suffix=".tflite", prefix="tpu-export-")
        os.close(fd)
    else:
        path = os.fspath(output_file_path)
    try:
        path = write_model(model, path, progress=progress, release=release)
    except BaseException:
        if temp:
            with contextlib.suppress(OSError):
                os.remove(path)
        raise
    del model
    out = Model(path)
    if temp:
        weakref.finalize(out, _remove, path)
    return out


def _remove(path: str) -> None:
    with contextlib.suppress(OSError):
        os.remove(path)
