"""edge: the LiteRT backend. Program -> LiteRT builtin operators -> .tflite flatbuffer.

Our own lowering (NHWC layout, fused activations, constant folding) and our own flatbuffer
writer over ai_edge_litert's schema; no TensorFlow, no MLIR converter. Heavy modules load
on first use.

``@edge.lowering(op)`` registers a LiteRT lowering for an op (a user's ``torch.library`` custom
op, or an ATen op with ``override=True``), ``@edge.supported_if(pred)`` limits it to the nodes it
takes: the contract of converter.registry, the same as the TPU backend's
(``tpu_backend.lowering.lowering``). Reading either name fills the table first.

The public names are this package's ``__all__``; its submodules are internal and may change between releases.
"""

from __future__ import annotations

from tpu_export.converter.lazy_exports import lazy_getattr

__all__ = ["convert_program", "is_supported", "EDGE", "lowering", "supported_if", "op_histogram", "run_tflite",
           "QuantConfig", "QuantizationError", "quantize_tflite", "calibration_feeds"]

_WHERE = {
    "convert_program": "convert",
    "is_supported": "convert",
    "EDGE": "ops",
    "lowering": "ops",  # via ops, so the table is filled before a user registers
    "supported_if": "ops",
    "op_histogram": "inspect",
    "run_tflite": "inspect",
    "QuantConfig": "quantize",
    "QuantizationError": "quantize",
    "quantize_tflite": "quantize",
    "calibration_feeds": "quantize",
}


__getattr__ = lazy_getattr(__name__, _WHERE)
