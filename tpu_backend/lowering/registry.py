"""The TPU backend's op table: ATen overload (or Python operator on SymInts) -> JAX lowering.

Every lowering is ``fn(ctx, *args)`` where ``args`` are the op's schema arguments in schema
order (defaults filled, tensors as jax arrays) and ``ctx`` is a ``LoweringContext``.
"""

from __future__ import annotations

from converter.registry import LoweringRegistry

__all__ = ["JAX_LOWERINGS", "lowering", "supports", "KERNEL_HOOKS", "kernel_hook"]

JAX_LOWERINGS = LoweringRegistry("tpu")
lowering = JAX_LOWERINGS.lowering

# Kernel hooks (Pallas): consulted only when lower_signature(..., use_pallas=...) is set. A hook
# has a lowering's signature and runs before the table's lowering of the same overload; it
# returns NotImplemented for shapes it does not take, and the table's lowering runs instead.
# Hooks register on import of the module that defines them (before lower_signature is called).
KERNEL_HOOKS = LoweringRegistry("tpu-kernels")
kernel_hook = KERNEL_HOOKS.lowering


def supports(predicate):
    """Decorator: attach ``predicate(node) -> bool`` to a lowering, for arguments it cannot handle
    (a boolean mask index, a data-dependent shape). The support check consults it before
    anything is written, so such nodes are reported with the others."""

    def attach(fn):
        fn.supports = predicate
        return fn

    return attach
