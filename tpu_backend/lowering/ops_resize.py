"""Upsampling: nearest (legacy and exact), (bi/tri)linear and bicubic, with align_corners and
explicit scale factors, following torch's source-index rules exactly.

Every spatial axis is resized separately: nearest is a static gather, the others a product with
a static (out, in) interpolation matrix (XLA fuses it; on TPU it runs on the MXU).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import torch

from .helpers import acc_dtype, cast
from .registry import lowering

aten = torch.ops.aten
_F = np.float32  # torch computes source indices in float for float inputs


def _scale(in_size, out_size, align_corners, scale_factor):
    if align_corners:
        return _F((in_size - 1) / (out_size - 1)) if out_size > 1 else _F(0)
    if scale_factor is not None and scale_factor > 0:
        return _F(1.0 / scale_factor)
    return _F(in_size / out_size)


def _nearest_index(in_size, out_size, scale_factor, exact):
    scale = _F(1.0 / scale_factor) if scale_factor else _F(in_size / out_size)
    dst = np.arange(out_size, dtype=_F)
    src = np.floor((dst + _F(0.5)) * scale if exact else dst * scale).astype(np.int64)
    return np.minimum(src, in_size - 1)


def _linear_matrix(in_size, out_size, align_corners, scale_factor):
    scale = _scale(in_size, out_size, align_corners, scale_factor)
    dst = np.arange(out_size, dtype=_F)
    src = dst * scale if align_corners else np.maximum(scale * (dst + _F(0.5)) - _F(0.5), _F(0))
    i0 = src.astype(np.int64)
    i1 = np.minimum(i0 + 1, in_size - 1)
    l1 = src - i0.astype(_F)
    m = np.zeros((out_size, in_size), np.float64)
    np.add.at(m, (np.arange(out_size), i0), 1.0 - l1)
    np.add.at(m, (np.arange(out_size), i1), l1)
    return m


def _cubic_weights(t, a=-0.75):
    def near(x):  # |x| <= 1
        return ((a + 2) * x - (a + 3)) * x * x + 1

    def far(x):  # 1 < |x| < 2
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a

    return [far(t + 1), near(t), near(1 - t), far(2 - t)]


def _cubic_matrix(in_size, out_size, align_corners, scale_factor):
    scale = _scale(in_size, out_size, align_corners, scale_factor)
    dst = np.arange(out_size, dtype=_F)
    src = dst * scale if align_corners else scale * (dst + _F(0.5)) - _F(0.5)
    i = np.floor(src).astype(np.int64)
    t = (src - i).astype(np.float64)
    m = np.zeros((out_size, in_size), np.float64)
    for k, w in zip(range(-1, 3), _cubic_weights(t)):
        np.add.at(m, (np.arange(out_size), np.clip(i + k, 0, in_size - 1)), w)
    return m


def _resize(ctx, x, out_sizes, scale_factors, mode, align_corners=False):
    nd = len(out_sizes)
    lead = x.ndim - nd
    scale_factors = list(scale_factors) if scale_factors else [None] * nd
    if mode in ("nearest", "nearest-exact"):
        for i in range(nd):
            idx = _nearest_index(int(x.shape[lead + i]), out_sizes[i], scale_factors[i], mode == "nearest-exact")
            x = jnp.take(x, jnp.asarray(idx.astype(np.int32)), axis=lead + i)
        return x
    acc = acc_dtype(ctx.out_dtype)
    y = cast(x, acc)
    build = _cubic_matrix if mode == "cubic" else _linear_matrix
    for i in range(nd):
        axis = lead + i
        m = jnp.asarray(build(int(x.shape[axis]), out_sizes[i], align_corners, scale_factors[i]), acc)
        y = jnp.moveaxis(jnp.tensordot(y, m, axes=([axis], [1]), precision=ctx.precision(acc)), -1, axis)
    return y


def _out_sizes(ctx, nd):
    return [int(d) for d in ctx.out_shape[-nd:]]


# aten::upsample_nearest{1,2,3}d.vec(Tensor input, SymInt[]? output_size, float[]? scale_factors) -> Tensor
def _nearest_vec(nd, exact=False):
    def lower(ctx, x, output_size, scale_factors):
        sf = None if output_size is not None else scale_factors
        return _resize(ctx, x, _out_sizes(ctx, nd), sf, "nearest-exact" if exact else "nearest")

    return lower


lowering(aten.upsample_nearest1d.vec)(_nearest_vec(1))
lowering(aten.upsample_nearest2d.vec)(_nearest_vec(2))
lowering(aten.upsample_nearest3d.vec)(_nearest_vec(3))
lowering(aten._upsample_nearest_exact1d.vec)(_nearest_vec(1, exact=True))
lowering(aten._upsample_nearest_exact2d.vec)(_nearest_vec(2, exact=True))
lowering(aten._upsample_nearest_exact3d.vec)(_nearest_vec(3, exact=True))


# aten::upsample_{linear1d,bilinear2d,trilinear3d,bicubic2d}.vec(Tensor input, SymInt[]? output_size,
#     bool align_corners, float[]? scale_factors) -> Tensor
def _interp_vec(nd, mode):
    def lower(ctx, x, output_size, align_corners, scale_factors):
        sf = None if output_size is not None else scale_factors
        return _resize(ctx, x, _out_sizes(ctx, nd), sf, mode, align_corners)

    return lower


lowering(aten.upsample_linear1d.vec)(_interp_vec(1, "linear"))
lowering(aten.upsample_bilinear2d.vec)(_interp_vec(2, "linear"))
lowering(aten.upsample_trilinear3d.vec)(_interp_vec(3, "linear"))
lowering(aten.upsample_bicubic2d.vec)(_interp_vec(2, "cubic"))


# aten::upsample_nearest2d(Tensor self, SymInt[2] output_size, float? scales_h=None, float? scales_w=None)
@lowering(aten.upsample_nearest2d.default)
def upsample_nearest2d(ctx, x, output_size, scales_h=None, scales_w=None):
    return _resize(ctx, x, list(output_size), [scales_h, scales_w], "nearest")


# aten::upsample_bilinear2d(Tensor self, SymInt[2] output_size, bool align_corners, float? scales_h=None,
#     float? scales_w=None) -> Tensor
@lowering(aten.upsample_bilinear2d.default)
def upsample_bilinear2d(ctx, x, output_size, align_corners, scales_h=None, scales_w=None):
    return _resize(ctx, x, list(output_size), [scales_h, scales_w], "linear", align_corners)
