"""targets: named deployment targets (tpu-v5e ... android, web, iot) and their checks and packaging.

Heavy modules (edge, ai_edge_litert, ai_edge_quantizer, tflite_micro, tpu_backend) load on first use.

The public names are this package's ``__all__``; its submodules are internal and may change between releases.
"""

from __future__ import annotations

from tpu_export.converter.lazy_exports import lazy_getattr

from .options import EdgeOptions, IotOptions, OptionsError, TpuOptions, XlaOptions, options_for
from .registry import TARGETS, Target, UnknownTargetError, get_target

__all__ = ["TARGETS", "Target", "UnknownTargetError", "get_target", "check_for_target", "package",
           "compatibility", "Report", "CompatibilityError", "BudgetError", "QuantizationError",
           "chip_facts", "check_topology", "options_for", "OptionsError", "EdgeOptions", "IotOptions",
           "XlaOptions", "TpuOptions", "decode_keypoints"]

_WHERE = {
    "check_for_target": "checks", "package": "checks",
    "compatibility": "compat", "Report": "compat", "CompatibilityError": "compat",
    "BudgetError": "iot", "QuantizationError": "quantize",
    "chip_facts": "tpu", "check_topology": "tpu",
    "decode_keypoints": "detection",
}


__getattr__ = lazy_getattr(__name__, _WHERE)
