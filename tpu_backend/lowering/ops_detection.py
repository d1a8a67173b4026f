"""Detection ops with static shapes: non-maximum suppression with a fixed number of slots and a
valid mask (``tpu_export::nms_padded``), and ``torchvision::roi_align``.

NMS follows torchvision's kernel: boxes visited by score, descending (a stable sort, ties by index),
a box kept unless a kept box overlaps it by IoU > threshold. The IoU of every pair is computed at
once and the visit is a ``fori_loop`` over the sorted boxes; the kept ones are then compacted into the
first slots. ``torchvision::nms`` itself returns a data-dependent number of indices, which XLA cannot
express: it is refused by name, pointing at ``nms_padded``.
"""

from __future__ import annotations

import jax.numpy as jnp
import torch
from jax import lax

from tpu_export.converter import detection as _detection  # noqa: F401 - defines tpu_export::nms_padded

from .helpers import cast
from .registry import JAX_LOWERINGS, lowering, supported_if


def _static_boxes(node) -> bool:
    boxes = node.args[0].meta.get("val")
    return (boxes is not None and boxes.dim() == 2 and isinstance(boxes.shape[0], int) and boxes.shape[0] > 0
            and boxes.shape[-1] == 4)


def _pairwise_iou(b):
    area = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
    lt = jnp.maximum(b[:, None, :2], b[None, :, :2])
    rb = jnp.minimum(b[:, None, 2:], b[None, :, 2:])
    wh = jnp.maximum(rb - lt, 0)
    inter = wh[..., 0] * wh[..., 1]
    return inter / (area[:, None] + area[None, :] - inter)


def nms_fixed(boxes, scores, iou_threshold: float, max_output_size: int):
    """(kept indices [max_output_size] int32 by decreasing score, zero-padded; valid mask [max_output_size])."""
    n = boxes.shape[0]
    order = jnp.argsort(scores, descending=True, stable=True)
    over = _pairwise_iou(boxes.astype(jnp.float32)[order]) > iou_threshold
    before = jnp.arange(n)

    def visit(i, keep):
        return keep.at[i].set(~jnp.any(keep & over[:, i] & (before < i)))

    keep = lax.fori_loop(0, n, visit, jnp.zeros((n,), jnp.bool_))
    (pos,) = jnp.nonzero(keep, size=max_output_size, fill_value=0)
    valid = jnp.arange(max_output_size) < jnp.sum(keep)
    return jnp.where(valid, order[pos], 0).astype(jnp.int32), valid


# tpu_export::nms_padded(Tensor boxes, Tensor scores, float iou_threshold, int max_output_size)
#     -> (Tensor, Tensor)
@lowering(torch.ops.tpu_export.nms_padded.default)
@supported_if(_static_boxes)
def nms_padded(ctx, boxes, scores, iou_threshold, max_output_size):
    keep, valid = nms_fixed(boxes, scores, iou_threshold, max_output_size)
    return cast(keep, ctx.out_dtypes[0]), valid


# torchvision::roi_align(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height,
#     SymInt pooled_width, int sampling_ratio, bool aligned) -> Tensor
@JAX_LOWERINGS.lowering_by_name("torchvision.roi_align.default")
@supported_if(lambda n: isinstance(n.args[5], int) and n.args[5] > 0 and n.args[0].meta["val"].dim() == 4)
def roi_align(ctx, x, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned):
    return cast(roi_align_fixed(x, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned),
                ctx.out_dtype)


def roi_align_fixed(x, rois, spatial_scale, ph: int, pw: int, sr: int, aligned: bool):
    """torchvision's roi_align with a fixed ``sampling_ratio`` (sr x sr samples per bin), as its CPU kernel:
    x [N, C, H, W], rois [K, 5] (batch index, x1, y1, x2, y2) -> [K, C, ph, pw]."""
    acc = jnp.float32
    x, rois = x.astype(acc), rois.astype(acc)
    _, c, h, w = x.shape
    offset = 0.5 if aligned else 0.0
    bidx = rois[:, 0].astype(jnp.int32)
    x1, y1, x2, y2 = (rois[:, i] * spatial_scale - offset for i in range(1, 5))
    rw, rh = x2 - x1, y2 - y1
    if not aligned:
        rw, rh = jnp.maximum(rw, 1.0), jnp.maximum(rh, 1.0)
    bw, bh = rw / pw, rh / ph
    # sample coordinates: [K, ph * sr] along y, [K, pw * sr] along x
    sy = (jnp.arange(ph)[:, None] + (jnp.arange(sr)[None, :] + 0.5) / sr).reshape(-1)
    sx = (jnp.arange(pw)[:, None] + (jnp.arange(sr)[None, :] + 0.5) / sr).reshape(-1)
    ys = y1[:, None] + sy[None, :] * bh[:, None]
    xs = x1[:, None] + sx[None, :] * bw[:, None]

    def axis(coord, size):
        # torchvision's bilinear_interpolate along one axis: out of [-1, size] -> weight 0; clamp to [0, size-1]
        inside = (coord >= -1.0) & (coord <= size)
        coord = jnp.maximum(coord, 0.0)
        lo = jnp.floor(coord).astype(jnp.int32)
        at_end = lo >= size - 1
        lo = jnp.where(at_end, size - 1, lo)
        hi = jnp.where(at_end, size - 1, lo + 1)
        coord = jnp.where(at_end, lo.astype(acc), coord)
        frac = coord - lo
        return lo, hi, (1.0 - frac) * inside, frac * inside

    ylo, yhi, wylo, wyhi = axis(ys, h)  # [K, ph*sr]
    xlo, xhi, wxlo, wxhi = axis(xs, w)  # [K, pw*sr]
    img = x[bidx]  # [K, C, H, W]

    def gather(yi, xi):  # -> [K, C, ph*sr, pw*sr]
        rows = jnp.take_along_axis(img, yi[:, None, :, None], axis=2)
        return jnp.take_along_axis(rows, xi[:, None, None, :], axis=3)

    def wt(a, b):
        return (a[:, :, None] * b[:, None, :])[:, None]

    v = (gather(ylo, xlo) * wt(wylo, wxlo) + gather(ylo, xhi) * wt(wylo, wxhi)
         + gather(yhi, xlo) * wt(wyhi, wxlo) + gather(yhi, xhi) * wt(wyhi, wxhi))
    k = rois.shape[0]
    return v.reshape(k, c, ph, sr, pw, sr).mean(axis=(3, 5))

