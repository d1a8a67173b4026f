"""grid_sampler_2d (F.grid_sample) and _cdist_forward (torch.cdist): gathers at computed
coordinates and pairwise distances, following torch's coordinate rules."""

from __future__ import annotations

import jax.numpy as jnp
import torch

from .helpers import acc_dtype, cast
from .registry import lowering, supported_if

aten = torch.ops.aten
_BILINEAR, _NEAREST = 0, 1
_ZEROS, _BORDER, _REFLECTION = 0, 1, 2


def _unnormalize(coord, size, align_corners):
    if align_corners:
        return (coord + 1) / 2 * (size - 1)
    return ((coord + 1) * size - 1) / 2


def _reflect(coord, twice_low, twice_high):
    if twice_low == twice_high:
        return jnp.zeros_like(coord)
    low, span = twice_low / 2, (twice_high - twice_low) / 2
    coord = jnp.abs(coord - low)
    extra = jnp.fmod(coord, span)
    flips = jnp.floor(coord / span)
    return jnp.where(jnp.fmod(flips, 2) == 0, extra + low, span - extra + low)


def _source_coord(coord, size, padding_mode, align_corners):
    coord = _unnormalize(coord, size, align_corners)
    if padding_mode == _BORDER:
        coord = jnp.clip(coord, 0, size - 1)
    elif padding_mode == _REFLECTION:
        coord = _reflect(coord, 0, 2 * (size - 1)) if align_corners else _reflect(coord, -1, 2 * size - 1)
        coord = jnp.clip(coord, 0, size - 1)
    return coord


def _gather(x_flat, iy, ix, h, w):
    """x_flat [N, C, H*W]; integer iy/ix [N, Ho, Wo] -> [N, C, Ho, Wo], zero where out of range."""
    valid = (iy >= 0) & (iy < h) & (ix >= 0) & (ix < w)
    flat = jnp.where(valid, iy * w + ix, 0).reshape(iy.shape[0], 1, -1)
    vals = jnp.take_along_axis(x_flat, flat, axis=2).reshape(x_flat.shape[:2] + iy.shape[1:])
    return vals * valid[:, None].astype(vals.dtype)


# aten::grid_sampler_2d(Tensor input, Tensor grid, int interpolation_mode, int padding_mode,
#     bool align_corners) -> Tensor
@lowering(aten.grid_sampler_2d.default)
@supported_if(lambda n: n.args[2] in (_BILINEAR, _NEAREST))
def grid_sampler_2d(ctx, x, grid, interpolation_mode, padding_mode, align_corners):
    acc = acc_dtype(ctx.out_dtype)
    x, grid = cast(x, acc), cast(grid, acc)
    n, c, h, w = x.shape
    gx = _source_coord(grid[..., 0], w, padding_mode, align_corners)
    gy = _source_coord(grid[..., 1], h, padding_mode, align_corners)
    x_flat = x.reshape(n, c, h * w)
    if interpolation_mode == _NEAREST:
        ix, iy = jnp.round(gx).astype(jnp.int32), jnp.round(gy).astype(jnp.int32)  # half to even, as torch
        return _gather(x_flat, iy, ix, h, w)
    x0, y0 = jnp.floor(gx), jnp.floor(gy)
    tx, ty = gx - x0, gy - y0
    x0, y0 = x0.astype(jnp.int32), y0.astype(jnp.int32)
    out = 0
    for dy, wy in ((0, 1 - ty), (1, ty)):
        for dx, wx in ((0, 1 - tx), (1, tx)):
            out = out + _gather(x_flat, y0 + dy, x0 + dx, h, w) * (wy * wx)[:, None]
    return out


# aten::_cdist_forward(Tensor x1, Tensor x2, float p, int? compute_mode) -> Tensor
@lowering(aten._cdist_forward.default)
def cdist(ctx, x1, x2, p, compute_mode=None):
    acc = acc_dtype(ctx.out_dtype)
    diff = jnp.abs(cast(x1, acc)[..., :, None, :] - cast(x2, acc)[..., None, :, :])
    if p == 0:
        return jnp.sum((diff != 0).astype(acc), axis=-1)
    if p == float("inf"):
        return jnp.max(diff, axis=-1)
    if p == 1:
        return jnp.sum(diff, axis=-1)
    if p == 2:
        return jnp.sqrt(jnp.sum(diff * diff, axis=-1))
    return jnp.sum(diff**p, axis=-1) ** (1.0 / p)
