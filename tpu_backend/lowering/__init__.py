"""tpu_backend.lowering: the ATen -> JAX lowering table of the TPU backend.

``lower_signature(prog)`` turns one Program signature into a pure JAX function
``fn(weights, *inputs) -> outputs`` (jit- and jax.export-friendly). jax loads on first use.

``@lowering(op)`` registers a JAX lowering for an op (a user's ``torch.library`` custom op, or an
ATen op with ``override=True``), ``@supported_if(pred)`` limits it to the nodes it takes: the
contract of converter.registry, the same as the edge backend's (``edge.lowering``). Reading
either name fills the table first, so a user's registration meets the built-in ones.

The public names are this package's ``__all__``; its submodules are internal and may change between releases.
"""

from __future__ import annotations

from tpu_export.converter.lazy_exports import lazy_getattr

__all__ = [
    "lower_signature",
    "LoweredSignature",
    "LoweringError",
    "is_supported",
    "unsupported",
    "JAX_LOWERINGS",
    "KERNEL_HOOKS",
    "kernel_hook",
    "lowering",
    "supported_if",
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
    "lowering": "all_ops",  # via all_ops, so the table is filled before a user registers
    "supported_if": "all_ops",
    "LoweringContext": "context",
    "LoweringOptions": "context",
}


__getattr__ = lazy_getattr(__name__, _WHERE)
