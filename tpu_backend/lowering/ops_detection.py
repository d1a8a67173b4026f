"""Detection ops with static shapes: non-maximum suppression with a fixed number of slots and a
valid mask (``tpu_export::nms_padded``), and ``torchvision::roi_align``.

NMS follows torchvision's kernel: boxes visited by score, descending (a stable sort, ties by index),
a box kept unless a kept box overlaps it by IoU > threshold. The IoU of every pair is computed at
once and the visit is a ``fori_loop`` over the sorted boxes; the kept ones are then compacted into the
first slots. ``torchvision::nms`` itself returns a data-dependent number of indices, which XLA cannot
express: it is refused by name, pointing at ``nms_padded``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch
from jax import lax

from tpu_export.converter import detection as _detection  # noqa: F401 - defines tpu_export::nms_padded
from tpu_export.converter import detection_tflite as _dpp  # noqa: F401 - defines tpu_export::detection_postprocess

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



# ---------------------------------------------------------------------------- TFLite_Detection_PostProcess
# The LiteRT kernel's rules (converter.detection_tflite) in static shapes: the IoU of every pair of decoded
# boxes once, then per class (regular NMS) or over each anchor's best class (fast NMS) a while_loop over the
# candidates by decreasing score, keeping one that no kept box overlaps, until the limit is reached (the kernel's
# two stops: a vmapped loop runs until every class is done).


def _dpp_decode(enc, anchors, ys, xs, hs, ws):
    e, a = enc[:, :4].astype(jnp.float32), anchors.astype(jnp.float32)
    yc = e[:, 0] / ys * a[:, 2] + a[:, 0]
    xc = e[:, 1] / xs * a[:, 3] + a[:, 1]
    hh = 0.5 * jnp.exp(e[:, 2] / hs) * a[:, 2]
    hw = 0.5 * jnp.exp(e[:, 3] / ws) * a[:, 3]
    return jnp.stack([yc - hh, xc - hw, yc + hh, xc + hw], axis=1)


def _dpp_iou(b):
    area = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
    h = jnp.maximum(jnp.minimum(b[:, None, 2], b[None, :, 2]) - jnp.maximum(b[:, None, 0], b[None, :, 0]), 0.0)
    w = jnp.maximum(jnp.minimum(b[:, None, 3], b[None, :, 3]) - jnp.maximum(b[:, None, 1], b[None, :, 1]), 0.0)
    inter = h * w
    iou = inter / (area[:, None] + area[None, :] - inter)
    return jnp.where((area[:, None] <= 0) | (area[None, :] <= 0), 0.0, iou)


def _dpp_nms(over, scores, score_threshold, limit: int):
    """One class: (kept anchors [limit] in the order kept, their count)."""
    n = scores.shape[0]
    cand = scores >= score_threshold
    order = jnp.argsort(jnp.where(cand, scores, -jnp.inf), descending=True, stable=True)

    candidates = jnp.sum(cand.astype(jnp.int32))

    def more(state):  # the kernel stops at the last candidate or once it has kept ``limit``
        i, _, count = state
        return (i < candidates) & (count < limit)

    def visit(state):
        i, keep, count = state
        a = order[i]
        take = ~jnp.any(keep & over[:, a])
        return i + 1, keep.at[a].set(take), count + take.astype(jnp.int32)

    _, keep, count = lax.while_loop(more, visit, (jnp.int32(0), jnp.zeros((n,), jnp.bool_), jnp.int32(0)))
    (pos,) = jnp.nonzero(keep[order], size=limit, fill_value=0)
    return order[pos], count


def detection_postprocess_fixed(enc, scores, anchors, max_detections: int, per: int, detections_per_class: int,
                                score_threshold: float, iou_threshold: float, num_classes: int, scales,
                                regular: bool):
    """One image: enc [N, 4], scores [N, C], anchors [N, 4] -> (boxes [D, 4], classes [D], scores [D], count)."""
    f32 = jnp.float32
    thr, iou_thr = jnp.float32(score_threshold), jnp.float32(iou_threshold)
    boxes = _dpp_decode(enc, anchors, *(jnp.float32(s) for s in scales))
    cls = scores[:, scores.shape[1] - num_classes:].astype(f32)
    over = _dpp_iou(boxes) > iou_thr
    m, d = max_detections, max_detections * per
    if regular:
        limit = min(detections_per_class, m)
        kept, counts = jax.vmap(lambda s: _dpp_nms(over, s, thr, limit))(cls.T)  # [C, limit], [C]
        valid = jnp.arange(limit)[None, :] < counts[:, None]
        label = jnp.broadcast_to(jnp.arange(num_classes)[:, None], kept.shape)
        score = jnp.where(valid, cls[kept, label], -jnp.inf).reshape(-1)  # class-major: ties keep the lower class
        top = jnp.argsort(score, descending=True, stable=True)[:m]
        count = jnp.minimum(jnp.sum(counts), m)
        slot_ok = jnp.arange(top.shape[0]) < count
        anchor, label = kept.reshape(-1)[top], label.reshape(-1)[top]
        out_b = jnp.where(slot_ok[:, None], boxes[anchor], 0.0)
        out_c = jnp.where(slot_ok, label.astype(f32), 0.0)
        out_s = jnp.where(slot_ok, cls[anchor, label], 0.0)
        pad = d - top.shape[0]
        out_b, out_c, out_s = (jnp.pad(x, [(0, pad)] + [(0, 0)] * (x.ndim - 1)) for x in (out_b, out_c, out_s))
    else:
        k = per  # detection_postprocess refuses max_classes_per_detection > num_classes
        top_s, top_c = lax.top_k(cls, k)  # ties: the lower class first, as the kernel's argmax
        kept, count = _dpp_nms(over, top_s[:, 0], thr, m)
        slot_ok = jnp.arange(m) < count
        rows_b = jnp.broadcast_to(boxes[kept][:, None, :], (m, k, 4))
        rows_c, rows_s = top_c[kept].astype(f32), top_s[kept]
        out_b = jnp.where(slot_ok[:, None, None], rows_b, 0.0).reshape(d, 4)
        out_c = jnp.where(slot_ok[:, None], rows_c, 0.0).reshape(d)
        out_s = jnp.where(slot_ok[:, None], rows_s, 0.0).reshape(d)
    return out_b, out_c, out_s, count.astype(f32)


# tpu_export::detection_postprocess(Tensor box_encodings, Tensor class_scores, Tensor anchors, int max_detections,
#     int max_classes_per_detection, int detections_per_class, float score_threshold, float iou_threshold,
#     int num_classes, float y_scale, float x_scale, float h_scale, float w_scale, bool use_regular_nms)
#     -> (Tensor, Tensor, Tensor, Tensor)
@lowering(torch.ops.tpu_export.detection_postprocess.default)
@supported_if(lambda n: all(isinstance(d, int) for a in n.args[:3] for d in a.meta["val"].shape))
def detection_postprocess(ctx, enc, scores, anchors, max_detections, max_classes_per_detection, detections_per_class,
                          score_threshold, iou_threshold, num_classes, y_scale, x_scale, h_scale, w_scale,
                          use_regular_nms):
    per_image = [detection_postprocess_fixed(enc[b], scores[b], anchors, max_detections, max_classes_per_detection,
                                             detections_per_class, score_threshold, iou_threshold, num_classes,
                                             (y_scale, x_scale, h_scale, w_scale), use_regular_nms)
                 for b in range(enc.shape[0])]
    return tuple(cast(jnp.stack([r[i] for r in per_image]), ctx.out_dtypes[i]) for i in range(4))
