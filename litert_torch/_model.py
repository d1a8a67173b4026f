"""Model: a converted .tflite with the PyTorch calling convention, run by the LiteRT interpreter."""

from __future__ import annotations

import os
import threading

import numpy as np
import torch

from tpu_export.converter._torch_compat import tree_unflatten
from tpu_export.converter.errors import one_line
from tpu_export.converter.input_check import check_inputs

from ._signatures import bind, quantize_floats, read_signatures

__all__ = ["Model", "load", "ModelExportError", "ModelRunError", "SignatureNotFoundError"]


class ModelExportError(OSError):
    """The .tflite could not be written where asked (nothing was left behind)."""


class ModelRunError(RuntimeError):
    """The LiteRT interpreter refused to prepare or run a signature; the message names the model and the signature."""


class SignatureNotFoundError(KeyError):
    """The model has no signature of that name; the message lists the ones it has."""

    def __str__(self) -> str:  # KeyError would print the message quoted
        return str(self.args[0]) if self.args else ""


class Model:
    """``model(*args, signature_name=..., **kwargs)`` runs a signature on the LiteRT interpreter
    (XNNPACK) and returns torch tensors in the structure the PyTorch module returned."""

    def __init__(self, tflite_model, *, _source: str | None = None):
        """``tflite_model``: the .tflite bytes, or the path of a .tflite file, which is memory-mapped
        (the weights are never read into memory; the interpreter maps the same file). A file in the
        large-model form (past 2 GiB: weights after the flatbuffer) loads only from a path."""
        from tpu_export.edge.tflite_check import TfliteFormatError, check_tflite, map_tflite

        self._path = None
        if isinstance(tflite_model, (str, os.PathLike)):
            self._path = os.path.abspath(os.fspath(tflite_model))
            _source = _source or self._path
            self._data = map_tflite(self._path)  # a read-only map of a regular file, size-checked
        else:
            self._data = bytes(tflite_model)
            _source = _source or "the .tflite bytes given to Model"
        self._source = _source
        # the interpreter trusts the flatbuffer (a corrupt one can crash the process): refuse it first
        check_tflite(self._data, _source)
        self._interpreter = None
        self._runners: dict = {}
        # One interpreter, one call at a time: set inputs, invoke and read (copied) outputs under
        # the lock, so threads sharing a Model never see each other's tensors.
        self._lock = threading.Lock()
        try:
            self._signatures = read_signatures(self._data)
            for key, sig in self._signatures.items():
                spec = sig.get("out_spec")
                if spec is not None and spec.num_leaves != len(sig["outputs"]):
                    raise ValueError(f"signature {key!r}: the output structure holds {spec.num_leaves} tensors, "
                                     f"the signature {len(sig['outputs'])}")
        except (ValueError, KeyError, TypeError, AttributeError, IndexError) as e:  # its metadata is corrupt
            raise TfliteFormatError(f"{_source}: not a valid .tflite: its signature metadata is unreadable "
                                    f"({type(e).__name__}: {one_line(e, 160)}). Fix: convert the model "
                                    "again; this file is corrupt") from e

    # ------------------------------------------------------------------ API
    def tflite_model(self) -> bytes:
        """The .tflite's bytes (for a Model on a file: read from its map, the whole file)."""
        return self._data if isinstance(self._data, bytes) else bytes(self._data)

    @property
    def path(self) -> str | None:
        """The file this Model maps, or None for a Model built from bytes."""
        return self._path

    def signature_names(self) -> list[str]:
        return list(self._signatures)

    def export(self, path) -> None:
        """Write the .tflite atomically (a temp file in the same folder, then a rename; mode from the umask)."""
        from tpu_export.converter.atomic import write_file

        path = os.fspath(path)
        try:
            if self._path is not None and os.path.abspath(path) == self._path:
                return  # already there: rewriting the file the interpreter maps would change it under it
            write_file(path, self._data if isinstance(self._data, bytes) else _copier(self._data))
        except OSError as e:
            raise ModelExportError(
                f"cannot write the .tflite to {path!r}: {e.strerror or e}. Nothing was written. "
                "Fix: pick a path in an existing, writable folder."
            ) from e

    def __call__(self, *args, signature_name: str = "serving_default", **kwargs):
        if signature_name not in self._signatures:
            if len(self._signatures) == 1 and signature_name == "serving_default":
                signature_name = next(iter(self._signatures))
            else:
                raise SignatureNotFoundError(
                    f"no signature {signature_name!r}; this model has {sorted(self._signatures)}"
                )
        sig = self._signatures[signature_name]
        flat = quantize_floats(sig, bind(signature_name, sig, args, kwargs))
        # the same check the TPU runtime runs (names, rank, dims and their ranges, dtype, embedding ids)
        arrays = check_inputs(signature_name, sig["specs"], flat, sig["dim_ranges"])
        feeds = dict(zip(sig["inputs"], arrays))
        with self._lock:
            runner = self._runner(signature_name)
            try:
                out = runner(**feeds)  # outputs come back as copies
            except (RuntimeError, ValueError) as e:  # the interpreter's prepare/invoke failures
                raise ModelRunError(f"{self._source}: signature {signature_name!r}: the LiteRT interpreter failed: "
                                    f"{one_line(e)}") from e
        leaves = [torch.from_numpy(o if o.flags.writeable else np.array(o)) for o in (out[n] for n in sig["outputs"])]
        spec = sig.get("out_spec")
        if spec is None:
            return leaves[0] if len(leaves) == 1 else tuple(leaves)
        return tree_unflatten(leaves, spec)

    def _runner(self, name):
        """The signature's runner on the Model's one interpreter; call it holding ``self._lock``."""
        if self._interpreter is None:
            from tpu_export.edge.tflite_check import open_interpreter

            # from a path the interpreter maps the file itself (large-model form included)
            self._interpreter = (open_interpreter(self._source, path=self._path) if self._path is not None
                                 else open_interpreter(self._source, content=self._data))
        if name not in self._runners:
            self._runners[name] = self._interpreter.get_signature_runner(name)
        return self._runners[name]


def _copier(data):
    """Write a mapped file out in 64 MiB pieces (never the whole of it in memory at once)."""
    def write(f):
        view = memoryview(data)
        for i in range(0, len(view), 64 << 20):
            f.write(view[i:i + (64 << 20)])
    return write


# Files from this size up are memory-mapped by load(); smaller ones are read (cheap either way).
_MAP_FROM = 64 << 20


def load(path) -> Model:
    """A Model from a .tflite file (only the flatbuffer is read; nothing in it is executed).

    A file of 64 MiB or more (the large-model form past 2 GiB included) is memory-mapped, its
    weights paged in by the interpreter as it runs. A truncated or corrupt file raises
    TfliteFormatError (a ValueError) naming it."""
    from tpu_export.edge.tflite_check import read_tflite

    path = os.fspath(path)
    try:
        big = os.stat(path).st_size >= _MAP_FROM
    except OSError:
        big = False  # read_tflite names the error
    if big:
        return Model(path)
    return Model(read_tflite(path, check=False), _source=path)  # Model checks the bytes, naming the path
