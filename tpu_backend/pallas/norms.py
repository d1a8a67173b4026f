"""RMSNorm and LayerNorm: one fused, row-blocked Pallas kernel (ours) and the XLA reference.

The kernel reads each row once, reduces and normalises it in fp32 in VMEM and writes it
once: one HBM pass, where XLA may emit a reduction fusion and a separate elementwise one.
Math follows torch: statistics, weight and bias in fp32, one cast to the input dtype at the end.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from .config import PallasConfig, block_sizes
from .dispatch import is_static_shape, kernel_or_xla

__all__ = ["rms_norm", "layer_norm", "xla_rms_norm", "xla_layer_norm"]

_KERNEL_DTYPES = (jnp.float32, jnp.bfloat16, jnp.float16)


def _normalize_rows(x, kind: str, eps: float):
    """x: fp32 [rows, hidden] -> normalised fp32 rows (before weight/bias)."""
    if kind == "rms":
        return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps)
    mean = jnp.mean(x, axis=-1, keepdims=True)
    centred = x - mean
    return centred * jax.lax.rsqrt(jnp.mean(centred * centred, axis=-1, keepdims=True) + eps)


def _xla_norm(x, weight, bias, eps, kind, nd):
    axes = tuple(range(x.ndim - nd, x.ndim))
    x32 = x.astype(jnp.float32)
    if kind == "rms":
        y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=axes, keepdims=True) + eps)
    else:
        mean = jnp.mean(x32, axis=axes, keepdims=True)
        centred = x32 - mean
        y = centred * jax.lax.rsqrt(jnp.mean(centred * centred, axis=axes, keepdims=True) + eps)
    if weight is not None:
        y = y * weight.astype(jnp.float32)
    if bias is not None:
        y = y + bias.astype(jnp.float32)
    return y.astype(x.dtype)


def xla_rms_norm(x, weight, eps, *, normalized_ndim: int | None = None):
    """torch.rms_norm over the trailing ``normalized_ndim`` dims (default: weight.ndim or 1)."""
    if eps is None:
        eps = float(jnp.finfo(x.dtype).eps)
    return _xla_norm(x, weight, None, eps, "rms", normalized_ndim or (weight.ndim if weight is not None else 1))


def xla_layer_norm(x, weight, bias, eps, *, normalized_ndim: int | None = None):
    nd = normalized_ndim or (weight.ndim if weight is not None else 1)
    return _xla_norm(x, weight, bias, eps, "layer", nd)


def _norm_kernel(*refs, kind, eps, has_weight, has_bias):
    x_ref, o_ref = refs[0], refs[-1]
    y = _normalize_rows(x_ref[...].astype(jnp.float32), kind, eps)
    pos = 1
    if has_weight:
        y = y * refs[pos][...].astype(jnp.float32)
        pos += 1
    if has_bias:
        y = y + refs[pos][...].astype(jnp.float32)
    o_ref[...] = y.astype(o_ref.dtype)


def _pallas_norm(x2d, weight, bias, *, kind, eps, block_rows, interpret):
    rows, hidden = x2d.shape
    operands = [x2d]
    in_specs = [pl.BlockSpec((block_rows, hidden), lambda i: (i, 0))]
    for p in (weight, bias):
        if p is not None:
            operands.append(p.reshape(1, hidden))
            in_specs.append(pl.BlockSpec((1, hidden), lambda i: (0, 0)))
    kernel = functools.partial(
        _norm_kernel, kind=kind, eps=float(eps), has_weight=weight is not None, has_bias=bias is not None
    )
    itemsize = np.dtype(x2d.dtype).itemsize
    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct(x2d.shape, x2d.dtype),
        grid=(pl.cdiv(rows, block_rows),),  # the last block may hang over; rows are independent
        in_specs=in_specs,
        out_specs=pl.BlockSpec((block_rows, hidden), lambda i: (i, 0)),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)),
        cost_estimate=pl.CostEstimate(
            flops=8 * rows * hidden, transcendentals=rows, bytes_accessed=2 * rows * hidden * itemsize
        ),
        interpret=interpret,
    )(*operands)


def _norm_reason(x, nd, config: PallasConfig) -> str | None:
    if not is_static_shape(x):
        return f"dynamic shape {tuple(x.shape)} (Pallas kernels are specialised to static shapes)"
    if x.dtype not in _KERNEL_DTYPES:
        return f"dtype {x.dtype} (kernel takes float32, bfloat16, float16)"
    hidden = math.prod(x.shape[x.ndim - nd:])
    rows = math.prod(x.shape[: x.ndim - nd])
    if rows == 0 or hidden == 0:
        return "empty tensor"
    per_row_min = 8 * hidden * (4 * np.dtype(x.dtype).itemsize + 12)
    if per_row_min > config.tpu.vmem_budget // 2:
        return f"hidden size {hidden} too wide for one VMEM row block"
    if config.mode == "auto":
        # XLA fuses a row norm into one reduction fusion already, and each kernel is a Mosaic compile of its own:
        # ConvNeXt-T's 14 norm kernels took its TPU compile from 45 s to 124 s (bf16, one v6e chip), 2.3x a
        # JAX-native ConvNeXt's (bench/tpu_compile.py); use_pallas=True still takes the kernel
        return "auto mode: norms stay on XLA (one fusion already; a kernel per norm adds its own compile)"
    return None


def _norm(x, weight, bias, eps, kind, nd, config):
    reason = _norm_reason(x, nd, config)
    xla = lambda x, w, b: (_xla_norm(x, w, b, eps, kind, nd),)

    def kernel(x, w, b):
        hidden = math.prod(x.shape[x.ndim - nd:])
        x2d = x.reshape(-1, hidden)
        blocks = block_sizes("norm", config.generation, x2d.shape, x.dtype)
        w = None if w is None else w.reshape(hidden)
        b = None if b is None else b.reshape(hidden)
        out = _pallas_norm(x2d, w, b, kind=kind, eps=eps, interpret=config.interpret, **blocks)
        return (out.reshape(x.shape),)

    # None operands are closed over, not passed: the primitive takes arrays only.
    args = [a for a in (x, weight, bias) if a is not None]
    has = (True, weight is not None, bias is not None)

    def unpack(fn):
        def call(*arrays):
            it = iter(arrays)
            return fn(*[next(it) if h else None for h in has])

        return call

    (out,) = kernel_or_xla(f"{kind}_norm", unpack(kernel), unpack(xla), tuple(args), config, reason)
    return out


def rms_norm(x, weight, eps, *, config: PallasConfig, normalized_ndim: int | None = None):
    """torch.rms_norm over the trailing ``normalized_ndim`` dims (default: weight.ndim or 1).

    ``eps=None`` means torch's default, the input dtype's machine epsilon."""
    if eps is None:
        eps = float(jnp.finfo(x.dtype).eps)
    nd = normalized_ndim or (weight.ndim if weight is not None else 1)
    return _norm(x, weight, None, eps, "rms", nd, config)


def layer_norm(x, weight, bias, eps, *, config: PallasConfig, normalized_ndim: int | None = None):
    """torch.layer_norm over the trailing ``normalized_ndim`` dims (default: weight.ndim or 1)."""
    nd = normalized_ndim or (weight.ndim if weight is not None else 1)
    return _norm(x, weight, bias, eps, "layer", nd, config)
