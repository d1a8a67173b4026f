"""Model: a converted .tflite with the PyTorch calling convention, run by the LiteRT interpreter."""

from __future__ import annotations

import json
import os
import tempfile

import numpy as np
import torch
import torch.utils._pytree as pytree

__all__ = ["Model", "load", "ModelExportError"]

_STRUCTURE = "tpu_export.structure"  # written by edge.convert (JSON pytree specs, never code)


class ModelExportError(OSError):
    """The .tflite could not be written where asked (nothing was left behind)."""


class Model:
    """``model(*args, signature_name=..., **kwargs)`` runs a signature on the LiteRT interpreter
    (XNNPACK) and returns torch tensors in the structure the PyTorch module returned."""

    def __init__(self, tflite_model: bytes):
        self._data = bytes(tflite_model)
        self._interpreter = None
        self._signatures = _read_signatures(self._data)

    # ------------------------------------------------------------------ API
    def tflite_model(self) -> bytes:
        return self._data

    def signature_names(self) -> list[str]:
        return list(self._signatures)

    def export(self, path) -> None:
        """Write the .tflite atomically: a temp file in the same folder, then a rename."""
        path = os.fspath(path)
        folder = os.path.dirname(os.path.abspath(path))
        tmp = None
        try:
            fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".tflite", dir=folder)
            with os.fdopen(fd, "wb") as f:
                f.write(self._data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
            tmp = None
        except OSError as e:
            raise ModelExportError(
                f"cannot write the .tflite to {path!r}: {e.strerror or e}. Nothing was written. "
                "Fix: pick a path in an existing, writable folder."
            ) from e
        finally:
            if tmp is not None and os.path.exists(tmp):
                os.unlink(tmp)

    def __call__(self, *args, signature_name: str = "serving_default", **kwargs):
        if signature_name not in self._signatures:
            if len(self._signatures) == 1 and signature_name == "serving_default":
                signature_name = next(iter(self._signatures))
            else:
                raise KeyError(f"no signature {signature_name!r}; this model has {sorted(self._signatures)}")
        sig = self._signatures[signature_name]
        flat = _flatten(args, kwargs, sig.get("in_spec"))
        names = sig["inputs"]
        if len(flat) != len(names):
            raise TypeError(f"signature {signature_name!r} takes {len(names)} tensors ({names}); got {len(flat)}")
        runner = self._runner(signature_name)
        details = runner.get_input_details()
        feeds = {}
        for name, x in zip(names, flat):
            a = x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)
            feeds[name] = _to_input_dtype(a, details[name])
        out = runner(**feeds)
        leaves = [torch.from_numpy(np.array(out[n])) for n in sig["outputs"]]
        spec = sig.get("out_spec")
        if spec is None:
            return leaves[0] if len(leaves) == 1 else tuple(leaves)
        return pytree.tree_unflatten(leaves, spec)

    def _runner(self, name):
        if self._interpreter is None:
            from ai_edge_litert.interpreter import Interpreter

            self._interpreter = Interpreter(model_content=self._data)
            self._runners = {}
        if name not in self._runners:
            self._runners[name] = self._interpreter.get_signature_runner(name)
        return self._runners[name]


def _to_input_dtype(a: np.ndarray, detail: dict) -> np.ndarray:
    """Cast to the input's dtype; a float array fed to a quantized (int8/uint8) input is
    quantized with that input's scale and zero point, as the model's own QUANTIZE would."""
    want = detail["dtype"]
    if a.dtype == want:
        return a
    scale, zero = (detail.get("quantization") or (0.0, 0))[:2]
    if np.issubdtype(a.dtype, np.floating) and np.issubdtype(want, np.integer) and scale:
        info = np.iinfo(want)
        return np.clip(np.round(a / scale) + zero, info.min, info.max).astype(want)
    return a.astype(want, copy=False)


def load(path) -> Model:
    """A Model from a .tflite file (only the flatbuffer is read; nothing in it is executed)."""
    with open(os.fspath(path), "rb") as f:
        return Model(f.read())


def _flatten(args, kwargs, in_spec):
    if in_spec is not None and kwargs:
        try:
            keys = in_spec.children_specs[1].context
            if set(keys) == set(kwargs):
                kwargs = {k: kwargs[k] for k in keys}
        except (AttributeError, IndexError):
            pass
    return pytree.tree_leaves((tuple(args), dict(kwargs)))


def _read_signatures(data: bytes) -> dict:
    from ai_edge_litert import schema_py_generated as s

    m = s.Model.GetRootAs(data, 0)
    structure = {}
    for i in range(m.MetadataLength()):
        md = m.Metadata(i)
        if md.Name() and md.Name().decode() == _STRUCTURE:
            raw = m.Buffers(md.Buffer()).DataAsNumpy()
            structure = json.loads(bytes(raw).decode())
    sigs = {}
    for i in range(m.SignatureDefsLength()):
        sd = m.SignatureDefs(i)
        key = sd.SignatureKey().decode()
        entry = {
            "inputs": [sd.Inputs(j).Name().decode() for j in range(sd.InputsLength())],
            "outputs": [sd.Outputs(j).Name().decode() for j in range(sd.OutputsLength())],
        }
        extra = structure.get(key, {})
        if extra.get("inputs") and sorted(extra["inputs"]) == sorted(entry["inputs"]):
            entry["inputs"] = extra["inputs"]
        if extra.get("outputs") and sorted(extra["outputs"]) == sorted(entry["outputs"]):
            entry["outputs"] = extra["outputs"]
        for k in ("in_spec", "out_spec"):
            if k in extra:
                try:
                    entry[k] = pytree.treespec_loads(extra[k])
                except Exception:  # noqa: BLE001 - unknown node types: flat tuple instead
                    pass
        sigs[key] = entry
    return sigs
