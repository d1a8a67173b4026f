"""Upsampling: RESIZE_BILINEAR / RESIZE_NEAREST_NEIGHBOR, channel-last (NHWC).
"""

from __future__ import annotations

import numpy as np
import torch

from .helpers import NHWC
from .registry import lowering, supported_if

__all__ = []

aten = torch.ops.aten


def _resize_support(n):
    return n.args[0].meta["val"].dim() == 4


def _size(lw):
    """The output's H, W: a constant, or computed at run time from the inputs' dynamic dims."""
    out = lw.out_shape
    if None not in out[2:]:
        return lw.const_tensor(list(out[2:]), np.int32)
    return lw.shape_tensor(lw.out_dims[2:], infer=False)


# upsample_bilinear2d.vec(Tensor input, SymInt[]? output_size, bool align_corners, float[]? scale_factors) -> Tensor
@lowering(aten.upsample_bilinear2d.vec)
@supported_if(_resize_support)
def upsample_bilinear2d(lw, x, output_size, align_corners, scale_factors=None):
    out = lw.out_shape
    ins = [lw.tensor(x, NHWC), _size(lw)]
    opts = lw.options("ResizeBilinear", alignCorners=bool(align_corners), halfPixelCenters=not align_corners)
    return lw.op("RESIZE_BILINEAR", ins, out, x.dtype, NHWC, opts, version=1 if align_corners else 3)


# upsample_nearest2d.vec(Tensor input, SymInt[]? output_size, float[]? scale_factors) -> Tensor
@lowering(aten.upsample_nearest2d.vec)
@supported_if(_resize_support)
def upsample_nearest2d(lw, x, output_size, scale_factors=None):
    out = lw.out_shape
    ins = [lw.tensor(x, NHWC), _size(lw)]
    opts = lw.options("ResizeNearestNeighbor", alignCorners=False, halfPixelCenters=False)
    return lw.op("RESIZE_NEAREST_NEIGHBOR", ins, out, x.dtype, NHWC, opts)
