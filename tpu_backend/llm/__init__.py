"""TPU output of an LLM exported with converter.llm's cache protocol (prefill_<L> / decode, explicit KV cache).

- ``export_lm``: the artifact with its caches donated (each ``kv_cache_*`` input aliased to its output), float32,
  bfloat16 (weights, compute and caches bf16; logits float32) or weight-only int8;
- ``OnDeviceLM``: a runtime adapter for ``tpu_export.generate`` that keeps the caches on the device between calls,
  so each step updates them in place;
- ``lm_report``: bytes per decode token against the lower bound (weights + KV cache read), the tokens/s per chip
  they imply at the chip's HBM bandwidth, and prefill FLOPs and MFU, from a compiled target's cost analysis.

The public names are this package's ``__all__``; its submodules are internal and may change between releases.
"""

from __future__ import annotations

from tpu_export.converter.lazy_exports import lazy_getattr

__all__ = ["export_lm", "OnDeviceLM", "lm_report", "cache_inputs"]

__getattr__ = lazy_getattr(__name__, {"export_lm": "export", "OnDeviceLM": "runner", "lm_report": "report",
                                      "cache_inputs": "report"})
