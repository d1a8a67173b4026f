"""Pallas kernels for the hot patterns of the TPU artifact.

Each op runs a Pallas (Mosaic) kernel when the artifact runs on TPU and its plain XLA
path on every other platform, from one exported module (see ``dispatch``). Shapes a
kernel cannot take fall back to the XLA path with a reason logged on
``logging.getLogger("tpu_export.pallas")``.

- ``attention``: jax's shipped TPU splash (no mask / causal, grouped-query) and flash
  (mask tensor) kernels;
- ``rms_norm`` / ``layer_norm``: our fused row-blocked kernel;
- ``int8_linear``: our weight-only int8 matmul that dequantizes in VMEM;
- ``match_rms_norm`` / ``match_layer_norm`` / ``find_norm_patterns``: spelled-out norms in
  a core-ATen graph, so the lowering can send them to the fused kernel.

jax loads on first use of a kernel; ``PallasConfig``, ``block_sizes`` and the pattern
matchers import without it.

The public names are this package's ``__all__``; its submodules are internal and may change between releases.
"""

from __future__ import annotations

from tpu_export.converter.lazy_exports import lazy_getattr

__all__ = [
    "PallasConfig",
    "GENERATIONS",
    "block_sizes",
    "attention",
    "xla_attention",
    "rms_norm",
    "layer_norm",
    "xla_rms_norm",
    "xla_layer_norm",
    "int8_linear",
    "xla_int8_linear",
    "quantize_int8_per_channel",
    "NormMatch",
    "match_rms_norm",
    "match_layer_norm",
    "find_norm_patterns",
]

_WHERE = {
    "PallasConfig": "config",
    "GENERATIONS": "config",
    "block_sizes": "config",
    "attention": "sdpa",
    "xla_attention": "sdpa",
    "rms_norm": "norms",
    "layer_norm": "norms",
    "xla_rms_norm": "norms",
    "xla_layer_norm": "norms",
    "int8_linear": "int8_matmul",
    "xla_int8_linear": "int8_matmul",
    "quantize_int8_per_channel": "int8_matmul",
    "NormMatch": "patterns",
    "match_rms_norm": "patterns",
    "match_layer_norm": "patterns",
    "find_norm_patterns": "patterns",
}


__getattr__ = lazy_getattr(__name__, _WHERE)
