"""ViT (torchvision's vit_b_16 layout) in JAX: patchify conv on NHWC, class token, learned position embedding,
pre-LayerNorm encoder blocks (fused qkv projection), final LayerNorm and the head on the class token."""

from __future__ import annotations

import jax.numpy as jnp

from . import _layers as L
from . import _weights as W

__all__ = ["vit"]


def vit(m, precision=None):
    heads = m.layers[0].self_attention.heads
    blocks, eps = [], []
    for blk in m.layers:
        fc1, gelu, fc2 = blk.mlp[0], blk.mlp[1], blk.mlp[3]
        assert gelu.approximate == "none"
        blocks.append({"ln1": W.layer_norm(blk.ln_1), "qkv": W.dense(blk.self_attention.qkv),
                       "proj": W.dense(blk.self_attention.proj), "ln2": W.layer_norm(blk.ln_2),
                       "fc1": W.dense(fc1), "fc2": W.dense(fc2)})
        eps.append((blk.ln_1.eps, blk.ln_2.eps))
    params = {"patch": W.conv_bias(m.conv_proj), "cls": W.vector(m.class_token), "pos": W.vector(m.pos_embedding),
              "blocks": blocks, "ln": W.layer_norm(m.ln), "head": W.dense(m.head)}
    patch = m.conv_proj.stride[0]

    def fn(params, x):
        x = L.conv(x, params["patch"], patch, precision=precision)  # (n, h, w, dim)
        n, h, w, d = x.shape
        x = x.reshape(n, h * w, d)  # row-major patches, torch's flatten(2) order
        cls = jnp.broadcast_to(params["cls"], (n, 1, d)).astype(x.dtype)
        x = jnp.concatenate([cls, x], axis=1) + params["pos"]
        for p, (eps1, eps2) in zip(params["blocks"], eps):
            y = L.dense(L.layer_norm(x, p["ln1"], eps1), p["qkv"], precision)
            q, k, v = jnp.split(y, 3, axis=-1)
            x = x + L.dense(L.attention(q, k, v, heads, precision=precision), p["proj"], precision)
            y = L.ACTS["gelu"](L.dense(L.layer_norm(x, p["ln2"], eps2), p["fc1"], precision))
            x = x + L.dense(y, p["fc2"], precision)
        x = L.layer_norm(x, params["ln"], m.ln.eps)
        return L.dense(x[:, 0], params["head"], precision)

    return params, fn
