"""edge: the LiteRT backend. Program -> LiteRT builtin operators -> .tflite flatbuffer.

Our own lowering (NHWC layout, fused activations, constant folding) and our own flatbuffer
writer over ai_edge_litert's schema; no TensorFlow, no MLIR converter. Heavy modules load
on first use.
"""

from __future__ import annotations

import importlib

__all__ = ["convert_program", "is_supported", "EDGE", "op_histogram", "run_tflite", "QuantConfig", "QuantizationError",
           "quantize_tflite", "calibration_feeds"]

_WHERE = {
    "convert_program": "convert",
    "is_supported": "convert",
    "EDGE": "ops",
    "op_histogram": "inspect",
    "run_tflite": "inspect",
    "QuantConfig": "quantize",
    "QuantizationError": "quantize",
    "quantize_tflite": "quantize",
    "calibration_feeds": "quantize",
}


def __getattr__(name):
    if name in _WHERE:
        return getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
    raise AttributeError(f"module 'edge' has no attribute {name!r}")
