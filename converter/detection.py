"""Static-shape non-maximum suppression for export: a fixed number of kept boxes and a valid mask.

``torchvision.ops.nms`` returns as many indices as it keeps, a number known only at run time. The
LiteRT backend lowers it as it is (NON_MAX_SUPPRESSION_V5, then a run-time slice to the valid count);
XLA needs static shapes, so for the TPU backend (and for a LiteRT model whose outputs should keep one
shape) a model calls ``nms_padded`` / ``batched_nms_padded`` instead: the same boxes in the same order
(by score, descending), padded to ``max_output_size``, with a mask of the valid slots. The op is a
``torch.library`` custom op (``tpu_export::nms_padded``): it runs in torch eager (through torchvision's
kernel when torchvision is installed, otherwise a greedy loop in torch) and both backends lower it
whole.
"""

from __future__ import annotations

import contextlib
import functools
import math

import torch

__all__ = ["nms_padded", "batched_nms_padded", "static_detector", "StaticDetector", "TFLiteSSD", "yolo_nms_padded"]


def _iou(boxes: torch.Tensor) -> torch.Tensor:
    area = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    lt = torch.maximum(boxes[:, None, :2], boxes[None, :, :2])
    rb = torch.minimum(boxes[:, None, 2:], boxes[None, :, 2:])
    wh = (rb - lt).clamp(min=0)
    inter = wh[..., 0] * wh[..., 1]
    return inter / (area[:, None] + area[None, :] - inter)


def _nms_eager(boxes: torch.Tensor, scores: torch.Tensor, iou_threshold: float) -> torch.Tensor:
    try:
        op = torch.ops.torchvision.nms.default
    except (AttributeError, RuntimeError):
        op = None
    if op is not None:
        return op(boxes, scores, iou_threshold)
    # torchvision's rule without torchvision: visit boxes by score, keep one unless a kept box overlaps it
    # by IoU > iou_threshold
    order = torch.sort(scores, descending=True, stable=True).indices
    over = _iou(boxes[order].float()) > iou_threshold
    suppressed = torch.zeros(len(order), dtype=torch.bool)
    kept = []
    for i in range(len(order)):
        if not suppressed[i]:
            kept.append(i)
            suppressed |= over[i]
    return order[torch.tensor(kept, dtype=torch.long)]


@torch.library.custom_op("tpu_export::nms_padded", mutates_args=())
def _nms_padded_op(boxes: torch.Tensor, scores: torch.Tensor, iou_threshold: float,
                   max_output_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    keep = _nms_eager(boxes, scores, iou_threshold)[:max_output_size]
    out = torch.zeros(max_output_size, dtype=torch.long, device=boxes.device)
    out[: len(keep)] = keep
    valid = torch.arange(max_output_size, device=boxes.device) < len(keep)
    return out, valid


@_nms_padded_op.register_fake
def _(boxes, scores, iou_threshold, max_output_size):
    return (boxes.new_empty((max_output_size,), dtype=torch.long),
            boxes.new_empty((max_output_size,), dtype=torch.bool))


def _check(boxes: torch.Tensor, scores: torch.Tensor, max_output_size, fn: str) -> int:
    if boxes.dim() != 2 or boxes.shape[-1] != 4:
        raise ValueError(f"{fn}: boxes must be [N, 4] (x1, y1, x2, y2), got {tuple(boxes.shape)}")
    if scores.dim() != 1 or scores.shape[0] != boxes.shape[0]:
        raise ValueError(f"{fn}: scores must be [N] with N = len(boxes), got {tuple(scores.shape)} for "
                         f"{tuple(boxes.shape)} boxes")
    if max_output_size is None:
        return boxes.shape[0]
    if not isinstance(max_output_size, int) or max_output_size < 1:
        raise ValueError(f"{fn}: max_output_size must be a positive int (a static bound), got {max_output_size!r}")
    return max_output_size


def nms_padded(boxes: torch.Tensor, scores: torch.Tensor, iou_threshold: float,
               max_output_size: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``torchvision.ops.nms`` with a static output shape.

    Args:
        boxes: ``[N, 4]`` float boxes ``(x1, y1, x2, y2)`` with ``x1 <= x2`` and ``y1 <= y2``.
        scores: ``[N]`` float scores.
        iou_threshold: A box is dropped when its IoU with a kept, higher-scored box is above this.
        max_output_size: The number of slots (a static int); None for ``N`` (every box could be kept, so
            nothing is ever cut off). Kept boxes beyond it are dropped, the lowest-scored first.

    Returns:
        ``(keep, valid)``: ``keep`` ``[max_output_size]`` int64, the kept indices by decreasing score
        (exactly ``torchvision.ops.nms``'s, then zeros); ``valid`` ``[max_output_size]`` bool, true for the
        slots holding a kept index. ``int(valid.sum())`` is the number kept.

    Raises:
        ValueError: ``boxes`` is not ``[N, 4]``, ``scores`` not ``[N]``, or ``max_output_size`` not a positive
            int.
    """
    m = _check(boxes, scores, max_output_size, "nms_padded")
    return torch.ops.tpu_export.nms_padded(boxes, scores, float(iou_threshold), m)


def batched_nms_padded(boxes: torch.Tensor, scores: torch.Tensor, idxs: torch.Tensor, iou_threshold: float,
                       max_output_size: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``torchvision.ops.batched_nms`` (boxes of different ``idxs`` never suppress each other) with a static
    output shape, by torchvision's coordinate trick: each category's boxes are moved apart before one NMS.

    Args:
        boxes: ``[N, 4]`` float boxes ``(x1, y1, x2, y2)``.
        scores: ``[N]`` float scores.
        idxs: ``[N]`` int category of each box.
        iou_threshold: As in ``nms_padded``.
        max_output_size: As in ``nms_padded``.

    Returns:
        ``(keep, valid)`` as ``nms_padded``'s: the indices ``torchvision.ops.batched_nms`` keeps, by decreasing
        score, padded with zeros, and the mask of the valid slots.

    Raises:
        ValueError: As ``nms_padded``, or ``idxs`` is not ``[N]``.
    """
    m = _check(boxes, scores, max_output_size, "batched_nms_padded")
    if idxs.shape != scores.shape:
        raise ValueError(f"batched_nms_padded: idxs must be [N] like scores, got {tuple(idxs.shape)}")
    offsets = idxs.to(boxes.dtype) * (boxes.max() + 1)
    return torch.ops.tpu_export.nms_padded(boxes + offsets[:, None], scores, float(iou_threshold), m)


# ---------------------------------------------------------------------------- torchvision detection models


def _clip(boxes: torch.Tensor, size) -> torch.Tensor:
    h, w = size
    x = boxes[..., 0::2].clamp(min=0, max=w)
    y = boxes[..., 1::2].clamp(min=0, max=h)
    return torch.stack((x, y), dim=-1).reshape(boxes.shape)


def _above(scores: torch.Tensor, threshold: float) -> torch.Tensor:
    # the boxes torchvision filters out (score <= threshold) stay, scored -inf: after every kept one in any order
    return torch.where(scores > threshold, scores, torch.full_like(scores, float("-inf")))


def _slots(boxes, scores, labels, iou_threshold: float, slots: int) -> dict:
    keep, valid = batched_nms_padded(boxes, scores, labels, iou_threshold, slots)
    s = scores[keep]
    valid = valid & (s > float("-inf"))
    zero = torch.zeros_like(s)
    return {"boxes": boxes[keep] * valid[:, None].to(boxes.dtype), "scores": torch.where(valid, s, zero),
            "labels": labels[keep] * valid.to(labels.dtype), "valid": valid}


def _ssd_post(model, slots, head_outputs, image_anchors, image_shapes):
    """SSD.postprocess_detections with static shapes (per class: score filter as -inf, top-k of all anchors)."""
    scores_all = torch.softmax(head_outputs["cls_logits"], dim=-1)
    out = []
    for reg, scores, anchors, shape in zip(head_outputs["bbox_regression"], scores_all, image_anchors, image_shapes):
        boxes = _clip(model.box_coder.decode_single(reg, anchors), shape)
        k = min(model.topk_candidates, scores.shape[0])
        bs, ss, ls = [], [], []
        for label in range(1, scores.shape[-1]):
            s, idx = _above(scores[:, label], model.score_thresh).topk(k)
            bs.append(boxes[idx])
            ss.append(s)
            ls.append(torch.full((k,), label, dtype=torch.int64, device=s.device))
        out.append(_slots(torch.cat(bs), torch.cat(ss), torch.cat(ls), model.nms_thresh, slots))
    return out


def _dense_post(model, slots, head_outputs, anchors, image_shapes):
    """RetinaNet / FCOS postprocess_detections with static shapes (per level: score filter as -inf, top-k)."""
    fcos = "bbox_ctrness" in head_outputs
    out = []
    for i, shape in enumerate(image_shapes):
        bs, ss, ls = [], [], []
        for lvl, anchors_lvl in enumerate(anchors[i]):
            logits = head_outputs["cls_logits"][lvl][i]
            reg = head_outputs["bbox_regression"][lvl][i]
            num_classes = logits.shape[-1]
            scores = torch.sigmoid(logits)
            if fcos:
                scores = torch.sqrt(scores * torch.sigmoid(head_outputs["bbox_ctrness"][lvl][i]))
            scores = _above(scores.flatten(), model.score_thresh)
            s, idx = scores.topk(min(model.topk_candidates, scores.shape[0]))
            a = torch.div(idx, num_classes, rounding_mode="floor")
            decode = model.box_coder.decode if fcos else model.box_coder.decode_single
            bs.append(_clip(decode(reg[a], anchors_lvl[a]), shape))
            ss.append(s)
            ls.append(idx % num_classes)
        out.append(_slots(torch.cat(bs), torch.cat(ss), torch.cat(ls), model.nms_thresh, slots))
    return out


def _rpn_filter(rpn, store, proposals, objectness, image_shapes, num_anchors_per_level):
    """RegionProposalNetwork.filter_proposals with static shapes: ``post_nms_top_n`` proposals per image, the
    removed ones (small, under ``score_thresh``, suppressed) marked invalid in ``store``."""
    num_images = proposals.shape[0]
    objectness = objectness.detach().reshape(num_images, -1)
    levels = torch.cat([torch.full((n,), i, dtype=torch.int64, device=proposals.device)
                        for i, n in enumerate(num_anchors_per_level)]).reshape(1, -1).expand_as(objectness)
    top = rpn._get_top_n_idx(objectness, num_anchors_per_level)
    batch = torch.arange(num_images, device=proposals.device)[:, None]
    prob = torch.sigmoid(objectness[batch, top])
    out_boxes, out_scores = [], []
    for boxes, scores, lvl, shape in zip(proposals[batch, top], prob, levels[batch, top], image_shapes):
        boxes = _clip(boxes, shape)
        wh = boxes[:, 2:] - boxes[:, :2]
        ok = (wh[:, 0] >= rpn.min_size) & (wh[:, 1] >= rpn.min_size) & (scores >= rpn.score_thresh)
        s = torch.where(ok, scores, torch.full_like(scores, float("-inf")))
        keep, valid = batched_nms_padded(boxes, s, lvl, rpn.nms_thresh, rpn.post_nms_top_n())
        store.append(valid & (s[keep] > float("-inf")))
        out_boxes.append(boxes[keep])
        out_scores.append(s[keep])
    return out_boxes, out_scores


def _roi_pool(pool, x, boxes, image_shapes):
    """MultiScaleRoIAlign with static shapes: every RoI pooled at every level, each keeping its own level's
    (torchvision's level rule and scales, from torchvision.ops.poolers)."""
    roi_align = torch.ops.torchvision.roi_align.default  # registered: the model is torchvision's
    feats = [v for k, v in x.items() if k in pool.featmap_names]  # torchvision's order: the dict's
    rois = torch.cat([torch.cat((torch.full_like(b[:, :1], i), b), dim=1) for i, b in enumerate(boxes)])
    h = max(s[0] for s in image_shapes)
    # each level's scale: feature size / image size, rounded to a power of two
    scales = [2.0 ** round(math.log2(f.shape[-2] / h)) for f in feats]
    ph, pw = pool.output_size
    pooled = [roi_align(f, rois, sc, ph, pw, pool.sampling_ratio, False) for f, sc in zip(feats, scales)]
    if len(feats) == 1:
        return pooled[0]
    k_min, k_max = int(-math.log2(scales[0])), int(-math.log2(scales[-1]))
    wh = rois[:, 3:] - rois[:, 1:3]
    size = torch.sqrt(wh[:, 0] * wh[:, 1])
    lvl = torch.floor(pool.canonical_level + torch.log2(size / pool.canonical_scale)
                      + torch.tensor(1e-6, dtype=size.dtype))
    level = torch.clamp(lvl, min=k_min, max=k_max).to(torch.int64) - k_min
    out = pooled[0]
    for i, r in enumerate(pooled[1:], 1):
        out = torch.where((level == i)[:, None, None, None], r, out)
    return out


def _is_multiscale_roi_align(m) -> bool:
    return type(m).__name__ == "MultiScaleRoIAlign" and type(m).__module__.startswith("torchvision.")


@contextlib.contextmanager
def static_roi_pools(module: torch.nn.Module):
    """While open, each torchvision ``MultiScaleRoIAlign`` in ``module`` pools in static shapes (``_roi_pool``).

    torchvision picks each RoI's level with ``torch.where(levels == level)`` and writes the level's results back
    by those indices, sizes known only at run time, which neither backend lowers. Pooling every RoI at every
    level and keeping its own level's result gives the same values for a fixed number of boxes. ``capture``
    holds this open while ``torch.export`` traces; a pool whose ``forward`` is already replaced is left alone.
    """
    pools = [m for m in module.modules() if _is_multiscale_roi_align(m) and "forward" not in vars(m)]
    for p in pools:
        p.forward = functools.partial(_roi_pool, p)
    try:
        yield
    finally:
        for p in pools:
            if isinstance(vars(p).get("forward"), functools.partial):
                del p.forward


def _rcnn_post(heads, store, slots, class_logits, box_regression, proposals, image_shapes):
    """RoIHeads.postprocess_detections with static shapes (invalid proposals' detections scored -inf)."""
    num_classes = class_logits.shape[-1]
    per_image = [len(p) for p in proposals]
    boxes_all = heads.box_coder.decode(box_regression, proposals).split(per_image, 0)
    scores_all = torch.softmax(class_logits, -1).split(per_image, 0)
    out = {"boxes": [], "scores": [], "labels": []}
    valid_rpn = list(store)
    store.clear()
    for boxes, scores, shape, pvalid in zip(boxes_all, scores_all, image_shapes, valid_rpn):
        # explicit ends: an open slice's end (int64 max) would not pass the int32 dtype policy
        boxes = _clip(boxes, shape)[:, 1:num_classes].reshape(-1, 4)
        labels = torch.arange(1, num_classes, device=scores.device).view(1, -1).expand(len(scores), -1).reshape(-1)
        pvalid = pvalid[:, None].expand(-1, num_classes - 1).reshape(-1)
        scores = scores[:, 1:num_classes].reshape(-1)
        wh = boxes[:, 2:] - boxes[:, :2]
        ok = pvalid & (scores > heads.score_thresh) & (wh[:, 0] >= 1e-2) & (wh[:, 1] >= 1e-2)
        det = _slots(boxes, torch.where(ok, scores, torch.full_like(scores, float("-inf"))), labels,
                     heads.nms_thresh, slots)
        store.append(det["valid"])
        for k in out:
            out[k].append(det[k])
    return out["boxes"], out["scores"], out["labels"]


def _paste_masks(masks: torch.Tensor, boxes: torch.Tensor, im_h: int, im_w: int) -> torch.Tensor:
    """torchvision's paste_masks_in_image (padding 1) with static shapes: masks [D, 1, M, M] resized to their
    (expanded, truncated) boxes by align_corners=False bilinear rules and pasted into [D, 1, im_h, im_w]."""
    m = masks.shape[-1]
    padded = torch.nn.functional.pad(masks, (1, 1, 1, 1))[:, 0]  # [D, M + 2, M + 2]
    mp = m + 2
    scale = float(mp) / m
    w_half = (boxes[:, 2] - boxes[:, 0]) * 0.5
    h_half = (boxes[:, 3] - boxes[:, 1]) * 0.5
    x_c = (boxes[:, 2] + boxes[:, 0]) * 0.5
    y_c = (boxes[:, 3] + boxes[:, 1]) * 0.5
    w_half = w_half * scale
    h_half = h_half * scale
    # the int64 cast truncates toward zero; the values stay small integers in float
    x0, x1 = torch.trunc(x_c - w_half), torch.trunc(x_c + w_half)
    y0, y1 = torch.trunc(y_c - h_half), torch.trunc(y_c + h_half)

    def axis(lo, hi, size):
        # per box: the pixels pasted along one axis, and the two source rows (columns) and weights of each
        n = torch.clamp(hi - lo + 1, min=1.0)  # the resized mask's size
        pix = torch.arange(size, dtype=masks.dtype)[None, :]  # [1, size]
        inside = (pix >= torch.clamp(lo, min=0.0)[:, None]) & (pix < torch.clamp(hi + 1, max=float(size))[:, None])
        src = (float(mp) / n)[:, None] * (pix - lo[:, None] + 0.5) - 0.5
        src = torch.clamp(src, min=0.0)
        i0 = torch.clamp(torch.floor(src), max=float(mp - 1))
        frac = torch.clamp(src - i0, min=0.0, max=1.0)
        i1 = torch.where(i0 < mp - 1, i0 + 1, i0)
        return inside, i0, i1, 1.0 - frac, frac

    iny, y_lo, y_hi, wy0, wy1 = axis(y0, y1, im_h)  # [D, im_h]
    inx, x_lo, x_hi, wx0, wx1 = axis(x0, x1, im_w)  # [D, im_w]
    flat = padded.reshape(padded.shape[0], mp * mp)

    def tap(yi, xi):
        idx = (yi[:, :, None] * mp + xi[:, None, :]).to(torch.int64).reshape(flat.shape[0], -1)
        return torch.gather(flat, 1, idx).reshape(flat.shape[0], im_h, im_w)

    v = (wy0[:, :, None] * (wx0[:, None, :] * tap(y_lo, x_lo) + wx1[:, None, :] * tap(y_lo, x_hi))
         + wy1[:, :, None] * (wx0[:, None, :] * tap(y_hi, x_lo) + wx1[:, None, :] * tap(y_hi, x_hi)))
    return torch.where(iny[:, :, None] & inx[:, None, :], v, torch.zeros_like(v))[:, None]


def _transform_post(transform, result, image_shapes, original_sizes):
    """GeneralizedRCNNTransform.postprocess with the masks pasted in static shapes, and for keypoint heads the
    ratios torchvision's resize_keypoints scales the decoded keypoints by (original / resized size, float32)."""
    masks = [r.pop("masks", None) for r in result]
    result = type(transform).postprocess(transform, result, image_shapes, original_sizes)
    for r, mk, (h, w), (rh, rw) in zip(result, masks, original_sizes, image_shapes):
        if mk is not None:
            r["masks"] = _paste_masks(mk, r["boxes"], int(h), int(w))
        if "keypoint_heatmaps" in r:  # (x, y); an output of its own, so that the host decode needs no model facts
            ratio = (torch.tensor([float(w), float(h)], dtype=torch.float32)
                     / torch.tensor([float(rw), float(rh)], dtype=torch.float32))
            r["keypoint_scale"] = ratio.to(r["boxes"].device)
    return result


def _keypoint_heads(heads, features, proposals, image_shapes, targets=None):
    """RoIHeads.forward with the keypoint head run on the final (static) detection slots and its heatmaps
    returned as they are: torchvision's keypointrcnn_inference resizes each box's heatmaps to the box's size."""
    predictor = heads.keypoint_predictor
    heads.keypoint_predictor = None  # torchvision's own keypoint branch is skipped
    try:
        result, losses = type(heads).forward(heads, features, proposals, image_shapes, targets)
    finally:
        heads.keypoint_predictor = predictor
    boxes = [r["boxes"] for r in result]
    x = _roi_pool(heads.keypoint_roi_pool, features, boxes, image_shapes)
    heatmaps = predictor(heads.keypoint_head(x)).split([len(b) for b in boxes])
    for r, b, hm in zip(result, boxes, heatmaps):
        r["keypoint_heatmaps"], r["keypoint_boxes"] = hm, b
    return result, losses


_POSTPROCESS = {"SSD": _ssd_post, "RetinaNet": _dense_post, "FCOS": _dense_post}


class StaticDetector(torch.nn.Module):
    """A torchvision detector whose detections have static shapes (see ``static_detector``)."""

    def __init__(self, model: torch.nn.Module, post, slots: int):
        super().__init__()
        self.model, self._post, self.slots = model, post, slots

    def forward(self, images: torch.Tensor):
        """images ``[B, 3, H, W]`` -> ``(boxes [B, D, 4], scores [B, D], labels [B, D], valid [B, D])``, then
        ``masks [B, D, 1, H, W]`` for Mask R-CNN, then ``keypoint_heatmaps [B, D, K, S, S]``, ``keypoint_boxes
        [B, D, 4]`` and ``keypoint_scale [B, 2]`` for Keypoint R-CNN (see ``static_detector``)."""
        m = self.model
        if self._post is None:  # two-stage: the proposals' and the detections' validity pass through ``store``
            store: list = []
            patches = [(m.rpn, "filter_proposals", lambda *a: _rpn_filter(m.rpn, store, *a)),
                       (m.roi_heads.box_roi_pool, "forward", lambda *a: _roi_pool(m.roi_heads.box_roi_pool, *a)),
                       (m.roi_heads, "postprocess_detections",
                        lambda *a: _rcnn_post(m.roi_heads, store, self.slots, *a))]
            if m.roi_heads.has_mask():
                patches.append((m.roi_heads.mask_roi_pool, "forward",
                                lambda *a: _roi_pool(m.roi_heads.mask_roi_pool, *a)))
            if m.roi_heads.has_keypoint():
                patches.append((m.roi_heads, "forward", lambda *a: _keypoint_heads(m.roi_heads, *a)))
            if m.roi_heads.has_mask() or m.roi_heads.has_keypoint():
                patches.append((m.transform, "postprocess", lambda *a: _transform_post(m.transform, *a)))
        else:
            patches = [(m, "postprocess_detections", lambda *a: self._post(m, self.slots, *a))]
        for obj, name, fn in patches:
            setattr(obj, name, fn)
        try:
            dets = m(list(images.unbind(0)))
        finally:
            for obj, name, _ in patches:
                delattr(obj, name)
        if self._post is None:
            for d, valid in zip(dets, store):
                d["valid"] = valid
        keys = ("boxes", "scores", "labels", "valid") + (("masks",) if "masks" in dets[0] else ())
        if "keypoint_heatmaps" in dets[0]:
            keys += ("keypoint_heatmaps", "keypoint_boxes", "keypoint_scale")
        return tuple(torch.stack([d[k] for d in dets]) for k in keys)


class TFLiteSSD(torch.nn.Module):
    """A torchvision SSD / SSDlite ending in ``TFLite_Detection_PostProcess`` (see ``static_detector``)."""

    def __init__(self, model: torch.nn.Module, slots: int, regular: bool):
        super().__init__()
        self.model, self.slots, self.regular = model, slots, regular
        fixed = getattr(model.transform, "fixed_size", None)
        if not fixed:
            raise ValueError(f"static_detector: postprocess='tflite' needs an SSD whose transform resizes to a fixed "
                             f"size (torchvision's SSD and SSDlite do); {type(model).__name__} has none")
        h, w = int(fixed[0]), int(fixed[1])
        with torch.no_grad():  # the anchors of the fixed input size, once: a constant of the exported model
            images, _ = model.transform([torch.zeros(3, h, w)])
            feats = model.backbone(images.tensors)
            feats = list(feats.values()) if isinstance(feats, dict) else [feats]
            xyxy = model.anchor_generator(images, feats)[0].float()
        ih, iw = images.tensors.shape[-2:]
        ah, aw = (xyxy[:, 3] - xyxy[:, 1]), (xyxy[:, 2] - xyxy[:, 0])
        # (ycenter, xcenter, h, w) in units of the image size: the kernel's boxes come out in [0, 1], as TFLite
        # SSD models give them (IoU is the same in either unit)
        anchors = torch.stack([(xyxy[:, 1] + 0.5 * ah) / ih, (xyxy[:, 0] + 0.5 * aw) / iw, ah / ih, aw / iw], 1)
        self.register_buffer("anchors", anchors, persistent=False)
        self.num_anchors = anchors.shape[0]

    def forward(self, images: torch.Tensor):
        """images ``[B, 3, H, W]`` -> ``(boxes [B, D, 4] (ymin, xmin, ymax, xmax) in [0, 1] of the image, classes
        [B, D] (label - 1), scores [B, D], num_detections [B])``, all float32."""
        from .detection_tflite import detection_postprocess

        m = self.model
        x, _ = m.transform(list(images.unbind(0)))
        feats = m.backbone(x.tensors)
        feats = list(feats.values()) if isinstance(feats, dict) else [feats]
        head = m.head(feats)
        if head["bbox_regression"].shape[1] != self.num_anchors:
            raise ValueError(f"TFLiteSSD: the head gave {head['bbox_regression'].shape[1]} boxes for "
                             f"{self.num_anchors} anchors; pass images the transform resizes to its fixed size")
        wx, wy, ww, wh = (float(v) for v in m.box_coder.weights)
        reg = head["bbox_regression"]
        clip = m.box_coder.bbox_xform_clip  # torchvision clamps dw / weight and dh / weight before exp
        enc = torch.stack([reg[..., 1], reg[..., 0], reg[..., 3].clamp(max=clip * wh),
                           reg[..., 2].clamp(max=clip * ww)], dim=-1)
        scores = torch.softmax(head["cls_logits"], dim=-1)
        return detection_postprocess(
            enc, scores, self.anchors, max_detections=self.slots, detections_per_class=self.slots,
            score_threshold=m.score_thresh, iou_threshold=m.nms_thresh, y_scale=wy, x_scale=wx, h_scale=wh,
            w_scale=ww, use_regular_nms=self.regular, num_classes=scores.shape[-1] - 1)


_POSTPROCESS_KINDS = ("static", "tflite", "tflite_fast")


def static_detector(model: torch.nn.Module, max_detections: int | None = None,
                    postprocess: str = "static") -> torch.nn.Module:
    """A torchvision detection model with static-shape post-processing, for export to either backend.

    The model's own backbone, heads, anchors, box decoding and image transform run unchanged; the steps that
    filter by data are replaced by the same steps in static shapes: a candidate under ``score_thresh`` (or too
    small) is scored -inf instead of removed, top-k runs over every candidate, and NMS is ``batched_nms_padded``.
    For Faster / Mask R-CNN the RPN keeps ``rpn_post_nms_top_n_test`` proposal slots with a valid mask,
    ``MultiScaleRoIAlign`` pools every proposal at every level, keeping its own level's result, and Mask R-CNN's
    masks are pasted into the image by gathers at the bilinear taps torchvision's per-box resize reads. The first
    slots hold exactly the detections torchvision returns, in its order. Keypoint R-CNN's keypoint head runs on
    the ``D`` detection slots and its heatmaps are returned undecoded: torchvision resizes each box's heatmaps
    bicubically to the box's own size before the argmax, a size known only at run time, so the decoding runs on
    the host, ``tpu_export.targets.decode_keypoints(keypoint_heatmaps, keypoint_boxes, valid, keypoint_scale)``
    (numpy only), which gives torchvision's ``keypoints`` and ``keypoints_scores``.

    Args:
        model: An eval-mode ``torchvision.models.detection`` SSD / SSDlite, RetinaNet, FCOS, Faster R-CNN,
            Mask R-CNN or Keypoint R-CNN (or a subclass).
        max_detections: The number of slots; None for the model's ``detections_per_img``.
        postprocess: ``"static"``: torchvision's post-processing in static shapes (above). ``"tflite"`` (SSD and
            SSDlite only): the model ends in ``detection_postprocess`` (TFLite's ``TFLite_Detection_PostProcess``
            custom op on LiteRT) with regular, per-class NMS; ``"tflite_fast"``: the same with the kernel's fast
            NMS (each anchor's best class only). Its anchors are the anchor generator's for the transform's fixed
            size, the box coder's weights are the scales, scores are the softmax with the background column.

    Returns:
        A module taking images ``[B, 3, H, W]``. ``"static"``: it returns ``(boxes [B, D, 4], scores [B, D],
        labels [B, D], valid [B, D])``, then ``masks [B, D, 1, H, W]`` for Mask R-CNN, then for Keypoint R-CNN
        ``keypoint_heatmaps [B, D, K, S, S]`` (the keypoint predictor's logits per slot, ``S`` = 56 for
        torchvision's), ``keypoint_boxes [B, D, 4]`` (the boxes in the frame of the model's resized image, where
        the heatmaps were pooled) and ``keypoint_scale [B, 2]`` (float32 ``(x, y)`` ratios of the input image's
        size to the resized one); boxes, scores and labels are zero where ``valid`` is false, the heatmaps of
        invalid slots mean nothing. ``"tflite"``: the op's ``(boxes [B, D, 4] (ymin, xmin, ymax, xmax) in
        [0, 1] of the image, classes [B, D] (torchvision's label - 1), scores [B, D], num_detections [B])``.

    Raises:
        ValueError: The model is not one of those detectors, a two-stage model pools with something other than
            torchvision's ``MultiScaleRoIAlign``, ``max_detections`` is not a positive int, or ``postprocess`` is
            unknown or ``"tflite"`` for a model that is not an SSD.
    """
    if postprocess not in _POSTPROCESS_KINDS:
        raise ValueError(f"static_detector: postprocess must be one of {', '.join(_POSTPROCESS_KINDS)}, got "
                         f"{postprocess!r}")
    names = [c.__name__ for c in type(model).__mro__]
    kinds = [n for n in names if n in _POSTPROCESS]
    two_stage = "GeneralizedRCNN" in names
    if not kinds and not two_stage:
        raise ValueError(f"static_detector: {type(model).__name__} is not supported; pass a torchvision SSD / "
                         "SSDlite, RetinaNet, FCOS, Faster, Mask or Keypoint R-CNN model")
    if two_stage:
        heads = model.roi_heads
        pools = [("box_roi_pool", heads.box_roi_pool)]
        pools += [("mask_roi_pool", heads.mask_roi_pool)] if heads.has_mask() else []
        pools += [("keypoint_roi_pool", heads.keypoint_roi_pool)] if heads.has_keypoint() else []
        for name, pool in pools:
            if not _is_multiscale_roi_align(pool):
                raise ValueError(f"static_detector: {type(model).__name__}.roi_heads.{name} "
                                 f"({type(pool).__name__}) is not torchvision's MultiScaleRoIAlign, the only pooler "
                                 "with a static-shape form here; pass one, as torchvision's own models do")
    detections_per_img = model.roi_heads.detections_per_img if two_stage else model.detections_per_img
    slots = detections_per_img if max_detections is None else max_detections
    if not isinstance(slots, int) or slots < 1:
        raise ValueError(f"static_detector: max_detections must be a positive int, got {max_detections!r}")
    if postprocess != "static":
        if kinds != ["SSD"]:
            raise ValueError(f"static_detector: postprocess={postprocess!r} is for torchvision's SSD and SSDlite "
                             f"(whose post-processing TFLite_Detection_PostProcess matches), not "
                             f"{type(model).__name__}; use postprocess='static'")
        return TFLiteSSD(model, slots, regular=postprocess == "tflite")
    return StaticDetector(model, None if two_stage else _POSTPROCESS[kinds[0]], slots)


# ---------------------------------------------------------------------------- ultralytics YOLO heads


def yolo_nms_padded(pred: torch.Tensor, conf_thres: float = 0.25, iou_thres: float = 0.45, max_det: int = 300,
                    agnostic: bool = False, max_wh: float = 7680.0) -> tuple[torch.Tensor, torch.Tensor]:
    """ultralytics' ``non_max_suppression`` (best class per box) for a YOLO Detect head's output, with static shapes.

    Args:
        pred: ``[B, 4 + nc, A]``, the Detect head's inference output (``model(x)[0]`` in eval mode): boxes
            (cx, cy, w, h) then the class scores.
        conf_thres: A box is a candidate when its best class score is above this.
        iou_thres: The NMS IoU threshold.
        max_det: The number of slots per image.
        agnostic: Suppress across classes too.
        max_wh: The per-class box offset (ultralytics' ``max_wh``), for class-wise NMS.

    Returns:
        ``(dets, valid)``: ``dets`` ``[B, max_det, 6]`` rows (x1, y1, x2, y2, score, class) in ultralytics' order,
        zero where ``valid`` ``[B, max_det]`` is false; the first ``valid.sum(1)`` rows of each image are the rows
        ``non_max_suppression`` returns.

    Raises:
        ValueError: ``pred`` is not ``[B, 4 + nc, A]`` with nc >= 1.
    """
    if pred.dim() != 3 or pred.shape[1] < 5:
        raise ValueError(f"yolo_nms_padded: pred must be [B, 4 + nc, A], got {tuple(pred.shape)}")
    p = pred.transpose(-1, -2)
    xy, wh = p[..., :2], p[..., 2:4] / 2
    boxes = torch.cat((xy - wh, xy + wh), dim=-1)  # xywh2xyxy, in its arithmetic
    conf, cls = p[..., 4:].max(-1)
    score = _above(conf, conf_thres)
    rows, masks = [], []
    for b in range(p.shape[0]):
        offset = cls[b].to(boxes.dtype)[:, None] * (0.0 if agnostic else max_wh)
        keep, valid = nms_padded(boxes[b] + offset, score[b], iou_thres, max_det)
        valid = valid & (score[b][keep] > float("-inf"))
        det = torch.cat((boxes[b][keep], conf[b][keep, None], cls[b][keep, None].to(boxes.dtype)), dim=-1)
        rows.append(det * valid[:, None].to(det.dtype))
        masks.append(valid)
    return torch.stack(rows), torch.stack(masks)
