"""ONNX importer: an ``.onnx`` file (or onnx.ModelProto) -> a torch module the capture pipeline takes.

``import_onnx(path_or_proto, dim_sizes={"batch": 1})`` returns the module, its sample inputs and its
dynamic shapes; ``converter.prepare`` / ``tpu_export.convert`` / ``litert_torch.convert`` take
``.onnx`` paths and ModelProtos directly through it. ``onnx`` is imported on first use only.

The public names are this package's ``__all__``; its submodules are internal and may change between releases.
"""

from __future__ import annotations

import os

from ..lazy_exports import lazy_getattr

__all__ = ["import_onnx", "capture_inputs", "is_onnx", "ImportedOnnx", "OnnxImportError", "UnsupportedOnnxOpsError",
           "onnx_ops"]

_WHERE = {
    "import_onnx": "importer",
    "capture_inputs": "importer",
    "ImportedOnnx": "importer",
    "UnsupportedOnnxOpsError": "graph",
    "OnnxImportError": "load",
}

__getattr__ = lazy_getattr(__name__, _WHERE)


def is_onnx(model) -> bool:
    """True for a path ending in .onnx or an onnx.ModelProto (without importing onnx for anything else)."""
    if isinstance(model, (str, os.PathLike)):
        return os.fspath(model).lower().endswith(".onnx")
    return type(model).__name__ == "ModelProto" and type(model).__module__.startswith("onnx")


def onnx_ops():
    """The table of imported ONNX ops (every family registered)."""
    from .registry import load_ops

    return load_ops()
