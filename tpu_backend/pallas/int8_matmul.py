"""Weight-only int8 linear: a Pallas matmul that dequantizes the weight tile in VMEM.

HBM holds the weight as int8 (a quarter of its f32 size, half of bf16) and the kernel widens
each tile to the activation dtype right before the MXU dot; the per-output-channel scale is
applied once to the fp32 accumulator (``(x @ q.T) * s == x @ (q * s).T`` for a scale per
output row), then the bias. Weight layout is torch's: [out_features, in_features].
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from .config import LANES, PallasConfig, block_sizes, matmul_precision
from .dispatch import is_static_shape, kernel_or_xla

__all__ = ["int8_linear", "xla_int8_linear", "quantize_int8_per_channel"]

_TRANS_B = (((1,), (1,)), ((), ()))  # contract x's last dim with w's last dim: x @ w.T


def quantize_int8_per_channel(w):
    """w [N, K] float (numpy, torch or jax) -> (w_int8 [N, K], scale [N] float32), symmetric.

    scale = max|w[n, :]| / 127 (1 for an all-zero row); returns jax arrays for jax input,
    numpy arrays otherwise."""
    if isinstance(w, jax.Array):
        w32 = w.astype(jnp.float32)
        amax = jnp.max(jnp.abs(w32), axis=1)
        scale = jnp.where(amax > 0, amax / 127.0, 1.0).astype(jnp.float32)
        q = jnp.clip(jnp.round(w32 / scale[:, None]), -127, 127).astype(jnp.int8)
        return q, scale
    w32 = np.asarray(w.detach().cpu().float() if hasattr(w, "detach") else w, dtype=np.float32)
    amax = np.abs(w32).max(axis=1)
    scale = np.where(amax > 0, amax / 127.0, 1.0).astype(np.float32)
    q = np.clip(np.round(w32 / scale[:, None]), -127, 127).astype(np.int8)
    return q, scale


def xla_int8_linear(x, w_int8, scale, bias=None):
    """x [..., K] @ dequant(w_int8 [N, K], scale [N]).T + bias [N], accumulated in fp32."""
    acc = jax.lax.dot_general(x, w_int8.astype(x.dtype), (((x.ndim - 1,), (1,)), ((), ())),
                              precision=matmul_precision(x.dtype), preferred_element_type=jnp.float32)
    y = acc * scale.astype(jnp.float32)
    if bias is not None:
        y = y + bias.astype(jnp.float32)
    return y.astype(x.dtype)


def _int8_matmul_kernel(*refs, has_bias, k_steps):
    x_ref, w_ref, s_ref = refs[:3]
    b_ref = refs[3] if has_bias else None
    o_ref, acc_ref = refs[-2], refs[-1]
    k = pl.program_id(2)

    @pl.when(k == 0)
    def _init():
        acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

    w = w_ref[...].astype(x_ref.dtype)  # dequantize in VMEM: int8 values are exact in bf16/f32
    acc_ref[...] += jax.lax.dot_general(x_ref[...], w, _TRANS_B, precision=matmul_precision(x_ref.dtype),
                                        preferred_element_type=jnp.float32)

    @pl.when(k == k_steps - 1)
    def _finish():
        y = acc_ref[...] * s_ref[...]
        if b_ref is not None:
            y = y + b_ref[...]
        o_ref[...] = y.astype(o_ref.dtype)


def _pallas_int8_matmul(x2d, w_int8, scale, bias, *, block_m, block_n, block_k, interpret):
    m, kdim = x2d.shape
    n = w_int8.shape[0]
    k_steps = kdim // block_k
    operands = [x2d, w_int8, scale.reshape(1, n).astype(jnp.float32)]
    in_specs = [
        pl.BlockSpec((block_m, block_k), lambda i, j, k: (i, k)),
        pl.BlockSpec((block_n, block_k), lambda i, j, k: (j, k)),
        pl.BlockSpec((1, block_n), lambda i, j, k: (0, j)),
    ]
    if bias is not None:
        operands.append(bias.reshape(1, n).astype(jnp.float32))
        in_specs.append(pl.BlockSpec((1, block_n), lambda i, j, k: (0, j)))
    itemsize = np.dtype(x2d.dtype).itemsize
    return pl.pallas_call(
        functools.partial(_int8_matmul_kernel, has_bias=bias is not None, k_steps=k_steps),
        out_shape=jax.ShapeDtypeStruct((m, n), x2d.dtype),
        grid=(pl.cdiv(m, block_m), pl.cdiv(n, block_n), k_steps),
        in_specs=in_specs,
        out_specs=pl.BlockSpec((block_m, block_n), lambda i, j, k: (i, j)),
        scratch_shapes=[pltpu.VMEM((block_m, block_n), jnp.float32)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary")),
        cost_estimate=pl.CostEstimate(
            flops=2 * m * n * kdim,
            transcendentals=0,
            bytes_accessed=m * kdim * itemsize * pl.cdiv(n, block_n) + n * kdim * pl.cdiv(m, block_m)
            + m * n * itemsize,
        ),
        interpret=interpret,
    )(*operands)


def _int8_reason(x, w_int8, config: PallasConfig) -> str | None:
    if not is_static_shape(x, w_int8):
        return "dynamic shapes (Pallas kernels are specialised to static shapes)"
    if w_int8.dtype != jnp.int8:
        return f"weight dtype {w_int8.dtype} is not int8"
    if x.dtype not in (jnp.float32, jnp.bfloat16):
        return f"activation dtype {x.dtype} (kernel takes float32 or bfloat16)"
    n, kdim = w_int8.shape
    if math.prod(x.shape[:-1]) == 0:
        return "empty input"
    if kdim % LANES and kdim > 4096:
        return f"in_features {kdim} is not a multiple of {LANES} and too wide for one block"
    if config.mode == "auto" and (kdim % LANES or n % LANES):
        return f"auto mode: in/out features {kdim}/{n} are not multiples of {LANES}"
    return None


def int8_linear(x, w_int8, scale, bias=None, *, config: PallasConfig):
    """F.linear(x, w_int8 * scale[:, None], bias): x [..., K], w_int8 [N, K] int8, scale [N].

    TPU: the Pallas dequantizing matmul; elsewhere ``xla_int8_linear``."""
    reason = _int8_reason(x, w_int8, config)
    xla = lambda x, w, s, *b: (xla_int8_linear(x, w, s, b[0] if b else None),)

    def kernel(x, w, s, *b):
        kdim, n = w.shape[1], w.shape[0]
        x2d = x.reshape(-1, kdim)
        blocks = block_sizes("int8_linear", config.generation, (x2d.shape[0], kdim, n), x.dtype)
        out = _pallas_int8_matmul(x2d, w, s, b[0] if b else None, interpret=config.interpret, **blocks)
        return (out.reshape(*x.shape[:-1], n),)

    args = (x, w_int8, scale) + ((bias,) if bias is not None else ())
    (out,) = kernel_or_xla("int8_linear", kernel, xla, args, config, reason)
    return out
