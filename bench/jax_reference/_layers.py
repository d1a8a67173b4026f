"""The building blocks the references share, in plain lax / jax.numpy on NHWC activations.

``precision`` is passed to every conv and matmul (None: lax's default; lax.Precision.HIGHEST: full float32).
Normalization statistics are taken in float32 even for bfloat16 activations, as flax's LayerNorm does.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

__all__ = ["conv", "dense", "layer_norm", "max_pool", "mean_hw", "ACTS", "attention"]

ACTS = {
    None: lambda x: x,
    "relu": jax.nn.relu,
    "relu6": jax.nn.relu6,
    "silu": jax.nn.silu,
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),  # torch's nn.GELU() default is the erf form
    "gelu_tanh": lambda x: jax.nn.gelu(x, approximate=True),
}


def conv(x, p, stride=1, padding=0, groups=1, precision=None):
    y = lax.conv_general_dilated(
        x, p["w"], (stride, stride), [(padding, padding), (padding, padding)],
        dimension_numbers=("NHWC", "HWIO", "NHWC"), feature_group_count=groups, precision=precision)
    return y + p["b"]


def dense(x, p, precision=None):
    return jnp.matmul(x, p["w"], precision=precision) + p["b"]


def layer_norm(x, p, eps):
    x32 = x.astype(jnp.float32)
    mean = jnp.mean(x32, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x32 - mean), axis=-1, keepdims=True)
    y = (x32 - mean) * lax.rsqrt(var + eps)
    return (y * p["g"].astype(jnp.float32) + p["b"].astype(jnp.float32)).astype(x.dtype)


def max_pool(x, k, stride, padding):
    init = jnp.array(-jnp.inf, x.dtype)
    pads = [(0, 0), (padding, padding), (padding, padding), (0, 0)]
    return lax.reduce_window(x, init, lax.max, (1, k, k, 1), (1, stride, stride, 1), pads)


def mean_hw(x):
    return jnp.mean(x, axis=(1, 2))


def attention(q, k, v, heads, bias=None, precision=None):
    """Multi-head scaled dot-product attention on (B, N, C) projections; ``bias`` broadcasts to the
    (B, heads, N, N) scores (an additive key mask)."""
    b, n, c = q.shape
    split = lambda t: t.reshape(b, t.shape[1], heads, c // heads)
    q, k, v = split(q), split(k), split(v)
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k, precision=precision) * (c // heads) ** -0.5
    if bias is not None:
        scores = scores + bias
    probs = jax.nn.softmax(scores, axis=-1)
    return jnp.einsum("bhqk,bkhd->bqhd", probs, v, precision=precision).reshape(b, n, c)
