"""Kernel-on-TPU, XLA-elsewhere dispatch that survives multi-platform export.

Why not ``jax.lax.platform_dependent``: in a multi-platform lowering (``jax.export`` with
``platforms=["tpu", "cpu"]``) jax 0.10.2 lowers *every* branch of the platform switch for
*every* platform, and ``pallas_call`` has no CPU lowering outside interpret mode, so export
fails with "Only interpret mode is supported on CPU backend". A primitive with per-platform
lowering rules is lowered through ``mlir.lower_per_platform``, which narrows the lowering
platforms of each rule (``LoweringRuleContext.platforms``): the TPU rule traces the Pallas
kernel for TPU alone and the default rule traces the XLA path for the other platforms. The
emitted StableHLO is the same platform-index ``case`` that ``platform_dependent`` emits, so
one artifact serves TPU (Mosaic kernel) and CPU/GPU (plain XLA), and loading it needs no
code from this module.
"""

from __future__ import annotations

import logging

import jax
from jax.extend.core import Primitive
from jax.interpreters import mlir

from .config import LOG, PallasConfig

__all__ = ["kernel_or_xla", "is_static_shape"]

_kernel_or_xla_p = Primitive("tpu_export_kernel_or_xla")
_kernel_or_xla_p.multiple_results = True


def _abstract_eval(*avals, kernel, xla, name):
    outs = jax.eval_shape(xla, *[jax.ShapeDtypeStruct(a.shape, a.dtype) for a in avals])
    return [jax.core.ShapedArray(o.shape, o.dtype) for o in outs]


def _impl(*args, kernel, xla, name):
    # Eager call: compile the primitive for the arrays' platform, which picks the rule.
    return jax.jit(lambda *a: _kernel_or_xla_p.bind(*a, kernel=kernel, xla=xla, name=name))(*args)


_kernel_or_xla_p.def_abstract_eval(_abstract_eval)
_kernel_or_xla_p.def_impl(_impl)
mlir.register_lowering(
    _kernel_or_xla_p,
    mlir.lower_fun(lambda *a, kernel, xla, name: kernel(*a), multiple_results=True),
    platform="tpu",
)
mlir.register_lowering(
    _kernel_or_xla_p, mlir.lower_fun(lambda *a, kernel, xla, name: xla(*a), multiple_results=True)
)


def is_static_shape(*arrays) -> bool:
    return all(isinstance(d, int) for a in arrays if a is not None for d in a.shape)


def kernel_or_xla(name: str, kernel, xla, args: tuple, config: PallasConfig, reason: str | None):
    """Run ``kernel(*args)`` on TPU and ``xla(*args)`` elsewhere; both return a tuple of arrays.

    ``reason``: why the kernel cannot (or, in "auto" mode, should not) take these shapes;
    when set, the XLA path is used everywhere and the reason is logged. With
    ``config.interpret`` the kernel itself runs (the caller built it with interpret=True).
    """
    if config.mode is False:
        return xla(*args)
    if reason is not None:
        # A kernel asked for explicitly (mode=True) and not taken is worth a warning.
        level = logging.WARNING if config.mode is True else logging.INFO
        LOG.log(level, "pallas %s: using the XLA path: %s", name, reason)
        return xla(*args)
    if config.interpret:
        return kernel(*args)
    return tuple(_kernel_or_xla_p.bind(*args, kernel=kernel, xla=xla, name=name))
