"""The TPU backend's op table: op (ATen overload, custom op, or Python operator on SymInts) -> JAX lowering.

The contract is converter.registry's, the same as the edge backend's: ``fn(ctx, *args)`` with
the op's schema arguments in schema order (defaults filled, tensors as jax arrays), ``ctx`` a
``LoweringContext``; ``@supported_if(pred)`` for nodes a lowering takes only in some forms.
"""

from __future__ import annotations

from tpu_export.converter.registry import LoweringRegistry, supported_if

__all__ = ["JAX_LOWERINGS", "lowering", "supported_if", "KERNEL_HOOKS", "kernel_hook"]

JAX_LOWERINGS = LoweringRegistry("tpu")
lowering = JAX_LOWERINGS.lowering

# Kernel hooks (Pallas): consulted only when lower_signature(..., use_pallas=...) is set. A hook
# has a lowering's signature and runs before the table's lowering of the same overload; it
# returns NotImplemented for shapes it does not take, and the table's lowering runs instead.
# Hooks register on import of the module that defines them (before lower_signature is called).
KERNEL_HOOKS = LoweringRegistry("tpu-kernels")
kernel_hook = KERNEL_HOOKS.lowering
