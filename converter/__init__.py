"""converter: capture a torch model once and produce the Program both backends consume.

Knows torch, nothing of jax or LiteRT. Heavy modules load on first use.

The public names are this package's ``__all__``; its submodules are internal and may change between releases.
"""

from __future__ import annotations

from .lazy_exports import lazy_getattr

__all__ = [
    "capture",
    "prepare",
    "prepare_many",
    "SignatureRequest",
    "run_program",
    "Program",
    "Signature",
    "TensorSpec",
    "KEEP_WHOLE",
    "decompose_nodes",
    "check_support",
    "LoweringRegistry",
    "ConversionError",
    "ExportFailedError",
    "UnsupportedOpsError",
    "DtypePolicyError",
    "UnsupportedOutputError",
    "nms_padded",
    "batched_nms_padded",
    "static_detector",
    "yolo_nms_padded",
    "detection_postprocess",
]

_WHERE = {
    "capture": "capture",
    "prepare": "pipeline",
    "prepare_many": "pipeline",
    "SignatureRequest": "pipeline",
    "run_program": "pipeline",
    "Program": "program",
    "Signature": "program",
    "TensorSpec": "program",
    "KEEP_WHOLE": "decompositions",
    "decompose_nodes": "decompositions",
    "check_support": "support",
    "LoweringRegistry": "registry",
    "ConversionError": "errors",
    "ExportFailedError": "errors",
    "UnsupportedOpsError": "errors",
    "DtypePolicyError": "errors",
    "UnsupportedOutputError": "errors",
    "nms_padded": "detection",
    "batched_nms_padded": "detection",
    "static_detector": "detection",
    "yolo_nms_padded": "detection",
    "detection_postprocess": "detection_tflite",
}


__getattr__ = lazy_getattr(__name__, _WHERE)
