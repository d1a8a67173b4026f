"""edge: the LiteRT backend. Program -> LiteRT builtin operators -> .tflite flatbuffer.

Our own lowering (NHWC layout, fused activations, constant folding) and our own flatbuffer
writer over ai_edge_litert's schema; no TensorFlow, no MLIR converter. Heavy modules load
on first use.
"""

from __future__ import annotations

from converter.lazy_exports import lazy_getattr

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


__getattr__ = lazy_getattr(__name__, _WHERE)
