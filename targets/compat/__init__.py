"""targets.compat: which LiteRT builtins each edge runtime's accelerator takes, from the runtimes' own code.

Tables: android_gpu (GPU delegate), ios_coreml (Core ML delegate), ios_metal (Metal delegate),
tflite_micro (TFLite Micro). ``compatibility(tflite_bytes, target)`` reads a .tflite and reports the
ops that run on the accelerator vs fall back, by count; ``strict=True`` makes any fallback an error.

The public names are this package's ``__all__``; its submodules are internal and may change between releases.
"""

from .report import CompatibilityError, Report, compatibility, delegates

__all__ = ["compatibility", "Report", "CompatibilityError", "delegates"]
