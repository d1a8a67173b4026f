"""torch -> numpy weight conversions for the JAX references: conv kernels OIHW -> HWIO, linear weights
(out, in) -> (in, out), and BatchNorm folded into the conv before it.

Folding is done in float64 and rounded once to float32, so the folded kernel differs from torch's unfolded
conv + BN by a single rounding, not by two chained float32 ones.
"""

from __future__ import annotations

import numpy as np

__all__ = ["np64", "hwio", "dense", "conv_bn", "conv_bias", "layer_norm", "vector"]


def np64(t) -> np.ndarray:
    return t.detach().cpu().double().numpy()


def hwio(weight) -> np.ndarray:
    """A torch conv weight (O, I/groups, H, W) as lax's HWIO (H, W, I/groups, O): lax reads a grouped
    kernel's input axis per group, as torch does."""
    return np64(weight).transpose(2, 3, 1, 0)


def dense(linear) -> dict:
    """nn.Linear as {"w": (in, out), "b": (out,)}; a missing bias is zeros so every dense has the same keys."""
    w = np64(linear.weight).T
    b = np64(linear.bias) if linear.bias is not None else np.zeros(w.shape[1])
    return {"w": w, "b": b}


def conv_bias(conv) -> dict:
    """A conv with its own bias (no BN after it) as {"w": HWIO, "b": (O,)}."""
    w = hwio(conv.weight)
    b = np64(conv.bias) if conv.bias is not None else np.zeros(w.shape[-1])
    return {"w": w, "b": b}


def conv_bn(conv, bn) -> dict:
    """conv -> BatchNorm (eval) as one conv: kernel scaled per output channel by gamma / sqrt(var + eps),
    bias = beta - mean * scale (plus the conv's own bias, scaled, where it has one)."""
    scale = np64(bn.weight) / np.sqrt(np64(bn.running_var) + bn.eps)
    bias = np64(bn.bias) - np64(bn.running_mean) * scale
    if conv.bias is not None:
        bias = bias + np64(conv.bias) * scale
    return {"w": hwio(conv.weight) * scale, "b": bias}


def layer_norm(ln) -> dict:
    return {"g": np64(ln.weight), "b": np64(ln.bias)}


def vector(t) -> np.ndarray:
    return np64(t)
