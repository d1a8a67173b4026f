"""Model: a converted .tflite with the PyTorch calling convention, run by the LiteRT interpreter."""

from __future__ import annotations

import os
import threading
from typing import Any

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
    """A converted ``.tflite``, called like the PyTorch module it came from.

    ``model(*args, signature_name=..., **kwargs)`` runs a signature on the LiteRT interpreter (XNNPACK) and
    returns torch tensors in the structure the module returned. The inputs are checked first (names, rank,
    dims and their ranges, dtype), as the TPU runtime checks them. ``litert_torch.convert`` returns a Model;
    ``litert_torch.load(path)`` reads one from a file. One Model may be shared by threads (one call runs at a
    time).

    The ``.tflite`` is checked before the interpreter reads it: a truncated or corrupt file is refused with a
    ``TfliteFormatError`` naming it, never handed to the interpreter.

    Args:
        tflite_model: The ``.tflite`` bytes, or the path of a ``.tflite`` file, which is memory-mapped (the
            weights are never read into memory; the interpreter maps the same file). A file in the large-model
            form (past 2 GiB: weights after the flatbuffer) loads only from a path.

    Raises:
        tpu_export.litert_torch.TfliteFormatError: The bytes or file are not a valid ``.tflite`` (a ValueError).

    Examples:
        >>> import torch
        >>> from tpu_export import litert_torch
        >>> m = torch.nn.Linear(4, 2).eval()
        >>> model = litert_torch.convert(m, (torch.ones(1, 4),))
        >>> copy = litert_torch.Model(model.tflite_model())      # from the bytes
        >>> copy.signature_names()
        ['serving_default']
        >>> torch.allclose(copy(torch.ones(1, 4)), m(torch.ones(1, 4)), atol=1e-6)
        True
        >>> litert_torch.Model(b"not a model")
        Traceback (most recent call last):
        ...
        tpu_export.edge.tflite_check.TfliteFormatError: the .tflite bytes given to Model: not a valid .tflite: ...
    """

    def __init__(self, tflite_model: bytes | str | os.PathLike[str], *, _source: str | None = None) -> None:
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
        """The ``.tflite``'s bytes (for a Model on a file: read from its map, the whole file).

        Returns:
            The flatbuffer's bytes.
        """
        return self._data if isinstance(self._data, bytes) else bytes(self._data)

    @property
    def path(self) -> str | None:
        """The file this Model maps, or None for a Model built from bytes."""
        return self._path

    def signature_names(self) -> list[str]:
        """The model's signature names, in the order they were converted.

        Returns:
            The names (``["serving_default"]`` for a single-signature conversion).
        """
        return list(self._signatures)

    def export(self, path: str | os.PathLike[str]) -> None:
        """Write the ``.tflite`` to ``path``, atomically: a temporary file in the same folder, then a rename.

        Args:
            path: The file to write (its folder must exist). The file's mode follows the umask.

        Raises:
            tpu_export.litert_torch.ModelExportError: The file cannot be written there (an OSError; nothing was
                left behind).

        Examples:
            >>> import os, tempfile
            >>> import torch
            >>> from tpu_export import litert_torch
            >>> model = litert_torch.convert(torch.nn.Linear(4, 2).eval(), (torch.ones(1, 4),))
            >>> path = os.path.join(tempfile.mkdtemp(), "linear.tflite")
            >>> model.export(path)
            >>> litert_torch.load(path).signature_names()
            ['serving_default']
        """
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

    def __call__(self, *args: Any, signature_name: str = "serving_default", **kwargs: Any) -> Any:
        """Run a signature on the LiteRT interpreter.

        Args:
            *args: The positional inputs, as the module took them (torch tensors or numpy arrays).
            signature_name: The signature to run; the default also runs a model's only signature whatever its
                name.
            **kwargs: The keyword inputs, as the module took them.

        Returns:
            The outputs as torch tensors, in the structure the module returned (a tensor, a tuple, a dict...).

        Raises:
            tpu_export.litert_torch.SignatureNotFoundError: The model has no signature of that name (a KeyError;
                the message lists the ones it has).
            tpu_export.converter.input_check.InputValueError: An input's name, rank, dims, dim range or dtype does
                not match the signature (a ValueError).
            tpu_export.litert_torch.ModelRunError: The interpreter failed to prepare or run the signature.
        """
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


def load(path: str | os.PathLike[str]) -> Model:
    """Load a ``.tflite`` file as a Model (only the flatbuffer is read; nothing in it is executed).

    A file of 64 MiB or more (the large-model form past 2 GiB included) is memory-mapped, its weights paged
    in by the interpreter as it runs; a smaller one is read into memory.

    Args:
        path: The ``.tflite`` file (written by ``Model.export``, or by any LiteRT converter).

    Returns:
        The Model, called like the module it was converted from.

    Raises:
        tpu_export.litert_torch.TfliteFormatError: The file is missing, truncated or not a valid ``.tflite`` (a
            ValueError naming the file).

    Examples:
        >>> import os, tempfile
        >>> import torch
        >>> from tpu_export import litert_torch
        >>> path = os.path.join(tempfile.mkdtemp(), "m.tflite")
        >>> litert_torch.convert(torch.nn.Linear(4, 2).eval(), (torch.ones(1, 4),)).export(path)
        >>> model = litert_torch.load(path)
        >>> model(torch.ones(1, 4)).shape
        torch.Size([1, 2])
    """
    from tpu_export.edge.tflite_check import read_tflite

    path = os.fspath(path)
    try:
        big = os.stat(path).st_size >= _MAP_FROM
    except OSError:
        big = False  # read_tflite names the error
    if big:
        return Model(path)
    return Model(read_tflite(path, check=False), _source=path)  # Model checks the bytes, naming the path
