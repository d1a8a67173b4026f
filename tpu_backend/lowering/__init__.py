"""tpu_backend.lowering: the ATen -> JAX lowering table of the TPU backend.

``lower_signature(prog)`` turns one Program signature into a pure JAX function
``fn(weights, *inputs) -> outputs`` (jit- and jax.export-friendly). jax loads on first use.
"""

from __future__ import annotations

from converter.lazy_exports import lazy_getattr

__all__ = [
    "lower_signature",
    "LoweredSignature",
    "LoweringError",
    "is_supported",
    "unsupported",
    "JAX_LOWERINGS",
    "KERNEL_HOOKS",
    "kernel_hook",
    "LoweringContext",
    "LoweringOptions",
]

_WHERE = {
    "lower_signature": "interpreter",
    "LoweredSignature": "interpreter",
    "LoweringError": "interpreter",
    "is_supported": "interpreter",
    "unsupported": "interpreter",
    "JAX_LOWERINGS": "interpreter",  # via interpreter, so the table is filled
    "KERNEL_HOOKS": "interpreter",
    "kernel_hook": "registry",
    "LoweringContext": "context",
    "LoweringOptions": "context",
}


__getattr__ = lazy_getattr(__name__, _WHERE)
