"""litert_torch: the public, drop-in API (litert-torch 0.10 style) over tpu-export's edge backend.

    model = litert_torch.convert(module, sample_args)
    model(*sample_args); model.export("m.tflite"); litert_torch.load("m.tflite")
    litert_torch.signature("a", m1, args1).signature("b", m2, args2).convert()
"""

from __future__ import annotations

import importlib

__all__ = ["convert", "signature", "Converter", "Model", "load", "to_channel_last_io", "ModelExportError",
           "ModelRunError", "SignatureNotFoundError", "QuantConfig", "QuantizationError", "TfliteFormatError"]

_WHERE = {
    "convert": "_convert",
    "signature": "_convert",
    "Converter": "_convert",
    "Model": "_model",
    "load": "_model",
    "ModelExportError": "_model",
    "ModelRunError": "_model",
    "SignatureNotFoundError": "_model",
    "to_channel_last_io": "_channel_last",
}
# quantization and the .tflite check live in the edge backend; re-exported here
_EDGE = {"QuantConfig": "edge.quantize", "QuantizationError": "edge.quantize", "TfliteFormatError": "edge.tflite_check"}


def __getattr__(name):
    if name in _WHERE:
        return getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
    if name in _EDGE:
        return getattr(importlib.import_module(_EDGE[name]), name)
    raise AttributeError(f"module 'litert_torch' has no attribute {name!r}")
