"""TFLite's ``TFLite_Detection_PostProcess`` as a torch op: box decoding against anchors, then NMS, in one node.

SSD-style models exported by TensorFlow's object-detection tools end in this custom op, and GPU / NPU runtimes
and app libraries expect it there. ``detection_postprocess`` is a ``torch.library`` custom op
(``tpu_export::detection_postprocess``), so ``torch.export`` keeps it as one node; the LiteRT backend writes it as
the ``TFLite_Detection_PostProcess`` custom op (the interpreter's own kernel runs it) and the TPU backend as a
static-shape program with the same outputs. Its eager form below follows the kernel's rules:

- decoding: anchors are ``(ycenter, xcenter, h, w)``, encodings ``(ty, tx, th, tw)``; ``ycenter = ty / y_scale *
  ha + ya``, ``half_h = 0.5 * exp(th / h_scale) * ha`` (the same for x and w), in float64, rounded to float32,
  boxes ``(ymin, xmin, ymax, xmax)``;
- IoU in float32, zero when either box has no area; a box is suppressed when its IoU with a kept box is above
  ``iou_threshold``; a candidate's score must be at least ``score_threshold``; candidates are visited by score,
  ties by anchor index;
- fast NMS (``use_regular_nms=False``): each anchor's best class score (ties: the lower class) is its score, one
  NMS over anchors keeps up to ``max_detections``, and each kept anchor reports its ``max_classes_per_detection``
  best classes;
- regular NMS: one NMS per class keeping up to ``min(detections_per_class, max_detections)``, then the best
  ``max_detections`` of all classes by score (ties: the lower class, then the NMS order).

Scores that tie exactly are where the kernel's order is its own: ``max_classes_per_detection > 1`` ranks a box's
classes with an unstable partial sort, and a multi-threaded kernel merges the classes of regular NMS in another
order. Classes are numbered from 0 without the background column (``class_scores`` may carry one extra, first, column
for it). Slots past ``num_detections`` are zero here; the LiteRT kernel leaves them unwritten, so read only the
first ``num_detections``.
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["detection_postprocess"]


def _f32(v: float) -> float:
    # the kernel reads its float options as float32
    return float(np.float32(v))


def _decode(enc: torch.Tensor, anchors: torch.Tensor, scales) -> torch.Tensor:
    e, a = enc[:, :4].double(), anchors.double()
    ys, xs, hs, ws = (_f32(s) for s in scales)
    yc = (e[:, 0] / ys * a[:, 2] + a[:, 0]).float()
    xc = (e[:, 1] / xs * a[:, 3] + a[:, 1]).float()
    hh = (0.5 * torch.exp(e[:, 2] / hs) * a[:, 2]).float()
    hw = (0.5 * torch.exp(e[:, 3] / ws) * a[:, 3]).float()
    return torch.stack([yc - hh, xc - hw, yc + hh, xc + hw], dim=1)


def _iou_with(box: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU (float32) of one (ymin, xmin, ymax, xmax) box with each of ``b``, 0 where either box has no area."""
    area = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
    area0 = (box[2] - box[0]) * (box[3] - box[1])
    h = np.maximum(np.minimum(box[2], b[:, 2]) - np.maximum(box[0], b[:, 0]), np.float32(0))
    w = np.maximum(np.minimum(box[3], b[:, 3]) - np.maximum(box[1], b[:, 1]), np.float32(0))
    inter = h * w
    with np.errstate(divide="ignore", invalid="ignore"):
        iou = inter / (area0 + area - inter)
    return np.where((area0 <= 0) | (area <= 0), np.float32(0), iou)


def _nms(boxes: torch.Tensor, scores: torch.Tensor, score_threshold: float, iou_threshold: float,
         limit: int) -> torch.Tensor:
    """The anchors one class keeps, in the order kept (by score, ties by index), at most ``limit``."""
    cand = (scores >= _f32(score_threshold)).nonzero().flatten()
    order = cand[torch.sort(scores[cand], descending=True, stable=True).indices]
    b = boxes[order].numpy()  # float32: numpy's elementwise float32 arithmetic is torch's, bit for bit
    active = np.ones(len(order), dtype=bool)
    kept: list[int] = []
    i = 0
    while len(kept) < limit:  # one step per kept box: the next active candidate, then what it suppresses
        rest = np.flatnonzero(active[i:])
        if len(rest) == 0:
            break
        i += int(rest[0])
        kept.append(i)
        active &= ~(_iou_with(b[i], b) > np.float32(_f32(iou_threshold)))
        i += 1
    return order[torch.tensor(kept, dtype=torch.long)]


def _one_image(enc, scores, anchors, o: dict):
    boxes = _decode(enc, anchors, (o["y_scale"], o["x_scale"], o["h_scale"], o["w_scale"]))
    cls = scores[:, scores.shape[1] - o["num_classes"]:].float()  # without the background column
    m, per = o["max_detections"], o["max_classes_per_detection"]
    out_boxes = torch.zeros(m * per, 4)
    out_classes = torch.zeros(m * per)
    out_scores = torch.zeros(m * per)
    if o["use_regular_nms"]:
        limit = min(o["detections_per_class"], m)
        found = []  # (score, class, anchor) in class order, then each class's NMS order
        for c in range(cls.shape[1]):
            for a in _nms(boxes, cls[:, c], o["score_threshold"], o["iou_threshold"], limit).tolist():
                found.append((cls[a, c], c, a))
        if found:
            s = torch.stack([f[0] for f in found])
            pick = torch.sort(s, descending=True, stable=True).indices[:m]
            for slot, i in enumerate(pick.tolist()):
                _, c, a = found[i]
                out_boxes[slot], out_classes[slot], out_scores[slot] = boxes[a], c, cls[a, c]
        count = min(len(found), m)
    else:
        k = min(per, cls.shape[1])
        top_s, top_c = torch.sort(cls, dim=1, descending=True, stable=True)
        kept = _nms(boxes, top_s[:, 0], o["score_threshold"], o["iou_threshold"], m)
        for slot, a in enumerate(kept.tolist()):
            rows = slice(slot * per, slot * per + k)
            out_boxes[rows] = boxes[a]
            out_classes[rows] = top_c[a, :k].float()
            out_scores[rows] = top_s[a, :k]
        count = len(kept)
    return out_boxes, out_classes, out_scores, torch.tensor(float(count))


@torch.library.custom_op("tpu_export::detection_postprocess", mutates_args=())
def _detection_postprocess_op(box_encodings: torch.Tensor, class_scores: torch.Tensor, anchors: torch.Tensor,
                              max_detections: int, max_classes_per_detection: int, detections_per_class: int,
                              score_threshold: float, iou_threshold: float, num_classes: int, y_scale: float,
                              x_scale: float, h_scale: float, w_scale: float, use_regular_nms: bool
                              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    o = dict(max_detections=max_detections, max_classes_per_detection=max_classes_per_detection,
             detections_per_class=detections_per_class, score_threshold=score_threshold,
             iou_threshold=iou_threshold, num_classes=num_classes, y_scale=y_scale, x_scale=x_scale,
             h_scale=h_scale, w_scale=w_scale, use_regular_nms=use_regular_nms)
    with torch.no_grad():
        per_image = [_one_image(box_encodings[b].detach().cpu(), class_scores[b].detach().cpu(),
                                anchors.detach().cpu(), o) for b in range(box_encodings.shape[0])]
    dev = box_encodings.device
    return tuple(torch.stack([r[i] for r in per_image]).to(dev) for i in range(4))


@_detection_postprocess_op.register_fake
def _(box_encodings, class_scores, anchors, max_detections, max_classes_per_detection, detections_per_class,
      score_threshold, iou_threshold, num_classes, y_scale, x_scale, h_scale, w_scale, use_regular_nms):
    b, d = box_encodings.shape[0], max_detections * max_classes_per_detection
    f = torch.float32
    return (box_encodings.new_empty((b, d, 4), dtype=f), box_encodings.new_empty((b, d), dtype=f),
            box_encodings.new_empty((b, d), dtype=f), box_encodings.new_empty((b,), dtype=f))


def _positive_int(name: str, v) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"detection_postprocess: {name} must be a positive int, got {v!r}")
    return v


def detection_postprocess(box_encodings: torch.Tensor, class_scores: torch.Tensor, anchors: torch.Tensor, *,
                          max_detections: int, max_classes_per_detection: int = 1, detections_per_class: int = 100,
                          score_threshold: float, iou_threshold: float, y_scale: float, x_scale: float,
                          h_scale: float, w_scale: float, use_regular_nms: bool = False,
                          num_classes: int | None = None
                          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """TFLite's ``TFLite_Detection_PostProcess``: decode boxes against anchors, then multi-class NMS.

    The LiteRT backend writes it as that custom op (what GPU / NPU delegates and detection app libraries expect
    at the end of an SSD model); the TPU backend lowers it to static shapes. In eager it follows the kernel's
    rules (see the module docstring).

    Args:
        box_encodings: ``[B, N, 4]`` float32 ``(ty, tx, th, tw)`` per anchor.
        class_scores: ``[B, N, C]`` float32 scores (already through sigmoid / softmax); with ``num_classes =
            C - 1`` the first column is the background and is ignored.
        anchors: ``[N, 4]`` float32 ``(ycenter, xcenter, h, w)``.
        max_detections: Detections kept per image.
        max_classes_per_detection: Classes reported per kept box (fast NMS), each in its own slot.
        detections_per_class: Boxes kept per class before the classes are merged (regular NMS).
        score_threshold: A candidate's score must be at least this.
        iou_threshold: In (0, 1]: a box whose IoU with a kept box is above this is dropped.
        y_scale: Divides ``ty`` (the box coder's weight; 10 for SSD).
        x_scale: Divides ``tx``.
        h_scale: Divides ``th`` (5 for SSD).
        w_scale: Divides ``tw``.
        use_regular_nms: True: NMS per class; False: one NMS over each anchor's best class (the kernel's fast
            form).
        num_classes: The classes without the background; None for ``C`` (no background column).

    Returns:
        ``(boxes [B, D, 4] (ymin, xmin, ymax, xmax), classes [B, D], scores [B, D], num_detections [B])``, all
        float32, ``D = max_detections * max_classes_per_detection``, in the anchors' units; classes count from
        0 without the background. Only the first ``num_detections`` slots (times ``max_classes_per_detection``)
        hold detections.

    Raises:
        ValueError: A shape or an option the kernel does not accept (named), e.g. ``num_classes`` neither ``C``
            nor ``C - 1``, or ``iou_threshold`` outside (0, 1].
    """
    fn = "detection_postprocess"
    if box_encodings.dim() != 3 or box_encodings.shape[-1] != 4:
        raise ValueError(f"{fn}: box_encodings must be [B, N, 4] (ty, tx, th, tw), got {tuple(box_encodings.shape)}")
    b, n = box_encodings.shape[:2]
    if class_scores.dim() != 3 or tuple(class_scores.shape[:2]) != (b, n):
        raise ValueError(f"{fn}: class_scores must be [B, N, C] with B, N = {b}, {n} as box_encodings, got "
                         f"{tuple(class_scores.shape)}")
    if tuple(anchors.shape) != (n, 4):
        raise ValueError(f"{fn}: anchors must be [N, 4] (ycenter, xcenter, h, w) with N = {n}, got "
                         f"{tuple(anchors.shape)}")
    for name, t in (("box_encodings", box_encodings), ("class_scores", class_scores), ("anchors", anchors)):
        if t.dtype != torch.float32:
            raise ValueError(f"{fn}: {name} must be float32, got {t.dtype}")
    c = class_scores.shape[-1]
    num_classes = c if num_classes is None else num_classes
    if num_classes not in (c, c - 1) or num_classes < 1:
        raise ValueError(f"{fn}: num_classes must be C = {c} (no background column) or C - 1 = {c - 1} (the first "
                         f"column is the background), got {num_classes!r}")
    m = _positive_int("max_detections", max_detections)
    per = _positive_int("max_classes_per_detection", max_classes_per_detection)
    if per > num_classes:
        raise ValueError(f"{fn}: max_classes_per_detection ({per}) must be at most num_classes ({num_classes}); the "
                         "kernel leaves the extra slots unwritten")
    dpc = _positive_int("detections_per_class", detections_per_class)
    if not 0.0 < float(iou_threshold) <= 1.0:
        raise ValueError(f"{fn}: iou_threshold must be in (0, 1], got {iou_threshold!r}")
    for name, v in (("y_scale", y_scale), ("x_scale", x_scale), ("h_scale", h_scale), ("w_scale", w_scale)):
        if not float(v) > 0:
            raise ValueError(f"{fn}: {name} must be positive, got {v!r}")
    return torch.ops.tpu_export.detection_postprocess(
        box_encodings, class_scores, anchors, m, per, dpc, float(score_threshold), float(iou_threshold),
        int(num_classes), float(y_scale), float(x_scale), float(h_scale), float(w_scale), bool(use_regular_nms))
