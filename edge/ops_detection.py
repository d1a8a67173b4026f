"""Detection ops: non-maximum suppression as NON_MAX_SUPPRESSION_V5, roi_align as dense bilinear weights.

``torchvision.ops.nms`` keeps a number of boxes known only at run time: NON_MAX_SUPPRESSION_V5 with
room for every box (``max_output_size`` = N, so none is ever cut off) and no score threshold gives the
kept indices by decreasing score and their count; a SLICE to that count gives torch's result, a tensor
whose length the LiteRT interpreter sets at run time. ``tpu_export::nms_padded`` (converter.detection)
keeps its static shape: the indices padded with zeros and the mask ``RANGE < count``.

The kernel's box convention (corners in any order, IoU from the normalized box) equals torchvision's
for boxes with x1 <= x2 and y1 <= y2, the form torchvision requires; both drop a box whose IoU with a
kept one is above the threshold (the kernel's test is >=: it is given the next float32 above the
threshold). The kernel drops boxes scored at or below its score threshold, torchvision none: the
threshold is -inf and -inf scores are raised to the lowest float32 (still last in the order). A
zero-area box, which the kernel would select over and over, is given a unit box far from the others
first (``_kernel_safe_boxes``).

``torchvision::roi_align`` (a fixed ``sampling_ratio``) is written as matrix products: per RoI, bilinear
weights [samples, H] and [samples, W] (each row two taps, as torchvision's CPU kernel places them, zero
outside [-1, size]) around the RoI's image, which a one-hot row picks out of the batch; the samples of a
bin are then averaged. It is traced from torch (``_roi_align_dense``) and its ATen ops lowered here, so it
uses only builtins the other lowerings use (BATCH_MATMUL, FLOOR, compares, MEAN).

torchvision's ops exist only once torchvision is imported, so they are registered by name
(``lowering_by_name``) and bound when a graph meets them.
"""

from __future__ import annotations

import operator

import numpy as np
import torch

from tpu_export.converter import detection as _detection  # noqa: F401 - defines tpu_export::nms_padded
from tpu_export.converter import detection_tflite as _dpp  # noqa: F401 - defines tpu_export::detection_postprocess
from tpu_export.converter.decompositions import KEEP_WHOLE, decomposition_table, trace_decomposition
from tpu_export.converter.registry import bind_args, op_name

from .lower import _try_fold
from .registry import EDGE, lowering, supported_if
from .values import Val

__all__ = []

_LOWEST = np.finfo(np.float32).min


def _static_boxes(node) -> bool:
    boxes, scores = (a.meta.get("val") for a in node.args[:2])
    # a static, non-zero number of boxes (no box: nothing to lower)
    return (boxes is not None and scores is not None and boxes.dim() == 2 and isinstance(boxes.shape[0], int)
            and boxes.shape[0] > 0
            and boxes.shape[-1] == 4 and boxes.dtype == torch.float32 and scores.dtype == torch.float32)


def _strict(iou_threshold: float) -> np.ndarray:
    # the kernel drops a box at IoU >= threshold, torchvision at IoU > threshold: the next float32 up
    # makes the two the same for every float32 IoU
    return np.nextafter(np.float32(iou_threshold), np.float32(np.inf))


def _kernel_safe_boxes(boxes, *_):
    """Each zero-area box moved to a unit box of its own, away from every other box.

    torchvision keeps a zero-area box and lets it suppress nothing (its IoU with anything is 0, or NaN with
    another empty box). The kernel's IoU is 0 for it too, even against itself, which is what stops a selected
    box from being selected again: it would fill every remaining slot. A unit box that overlaps nothing is
    kept and suppresses nothing, in the same score order."""
    n = boxes.shape[0]
    wh = boxes[:, 2:] - boxes[:, :2]
    empty = (wh[:, 0] * wh[:, 1]) <= 0
    far = torch.floor(boxes.max()) + 2 + 2 * torch.arange(n, dtype=boxes.dtype)
    unit = torch.stack([far, far, far + 1, far + 1], dim=1)
    return torch.where(empty[:, None], unit, boxes)


def _nms_v5(lw, boxes: Val, scores: Val, iou_threshold: float, max_output_size: int):
    """(selected indices [max_output_size] int32, zero-padded; valid count, a 0-d int32)."""
    f32 = np.float32
    boxes = _lower_traced(lw, _kernel_safe_boxes, [boxes, scores])
    # the kernel keeps a box only when its score is above the score threshold: -inf as that threshold and
    # -inf scores raised to the lowest float keep every box, as torchvision does
    scores = lw.op("MAXIMUM", [lw.tensor(scores, (0,)), lw.const_tensor(np.array(_LOWEST, f32))], scores.shape, f32)
    ins = [lw.tensor(boxes, (0, 1)), lw.tensor(scores), lw.const_tensor(np.array(max_output_size, np.int32)),
           lw.const_tensor(_strict(iou_threshold)), lw.const_tensor(np.array(-np.inf, f32)),
           lw.const_tensor(np.array(0.0, f32))]  # soft_nms_sigma 0: hard NMS, torchvision's
    (idx, _, count), _ = lw.emit("NON_MAX_SUPPRESSION_V5", ins, [(max_output_size,), (max_output_size,), ()],
                                 [np.int32, f32, np.int32], lw.options("NonMaxSuppressionV5"), suffix="nms")
    return Val((max_output_size,), np.dtype(np.int32), (0,), tensor=idx), Val((), np.dtype(np.int32), (), tensor=count)


# torchvision::nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor
@EDGE.lowering_by_name("torchvision.nms.default")
@supported_if(_static_boxes)
def nms(lw, dets, scores, iou_threshold):
    n = dets.shape[0]
    idx, count = _nms_v5(lw, dets, scores, iou_threshold, n)
    size = lw.op("RESHAPE", [lw.tensor(count), lw.const_tensor(np.array([1], np.int32))], (1,), np.int32,
                 opts=lw.options("Reshape", newShape=[1]))
    kept = lw.op("SLICE", [lw.tensor(idx), lw.const_tensor(np.array([0], np.int32)), lw.tensor(size)], (None,),
                 np.int32)
    return lw.cast(kept, lw.out_dtype)


# tpu_export::nms_padded(Tensor boxes, Tensor scores, float iou_threshold, int max_output_size)
#     -> (Tensor, Tensor)
@lowering(torch.ops.tpu_export.nms_padded.default)
@supported_if(_static_boxes)
def nms_padded(lw, boxes, scores, iou_threshold, max_output_size):
    idx, count = _nms_v5(lw, boxes, scores, iou_threshold, max_output_size)
    slots = lw.op("RANGE", [lw.const_tensor(np.array(v, np.int32)) for v in (0, max_output_size, 1)],
                  (max_output_size,), np.int32)
    valid = lw.op("LESS", [lw.tensor(slots), lw.tensor(count)], (max_output_size,), np.bool_)
    return lw.cast(idx, lw.out_dtypes[0]), valid


def _roi_align_dense(x, rois, spatial_scale: float, ph: int, pw: int, sr: int, aligned: bool):
    """torchvision's roi_align (CPU kernel rules, ``sampling_ratio`` sr > 0) in float ops and matrix products."""
    n, c, h, w = x.shape
    k = rois.shape[0]
    f32 = torch.float32
    off = 0.5 if aligned else 0.0
    x1, y1, x2, y2 = (rois[:, i:i + 1] * spatial_scale - off for i in range(1, 5))  # [K, 1] each
    rw, rh = x2 - x1, y2 - y1
    if not aligned:  # torchvision makes a malformed RoI 1x1
        rw, rh = rw.clamp(min=1.0), rh.clamp(min=1.0)

    def taps(start, extent, bins, size):
        # [K, bins * sr, size]: the bilinear weight of each pixel row (column) for each sample
        i = torch.arange(bins * sr, dtype=f32)
        b = torch.floor(i / sr)
        at = start + (b + (i - b * sr + 0.5) / sr) * (extent / bins)  # [K, bins * sr]
        inside = ((at >= -1.0) & (at <= float(size))).to(f32)
        at = at.clamp(min=0.0)
        lo = torch.floor(at)
        end = lo >= size - 1
        lo = torch.where(end, torch.full_like(lo, size - 1), lo)
        hi = torch.where(end, lo, lo + 1)
        frac = torch.where(end, torch.zeros_like(at), at - lo)
        grid = torch.arange(size, dtype=f32)
        return ((grid == lo[..., None]).to(f32) * ((1.0 - frac) * inside)[..., None]
                + (grid == hi[..., None]).to(f32) * (frac * inside)[..., None])

    wy, wx = taps(y1, rh, ph, h), taps(x1, rw, pw, w)
    pick = (torch.arange(n, dtype=f32) == rois[:, 0:1]).to(f32)  # [K, N], one-hot batch index
    img = (pick @ x.reshape(n, c * h * w).to(f32)).reshape(k, c, h, w)
    v = wy[:, None] @ img @ wx[:, None].transpose(-1, -2)  # [K, C, ph*sr, pw*sr]
    return v.reshape(k, c, ph, sr, pw, sr).mean((3, 5)).to(x.dtype)


def _lower_traced(lw, fn, tensor_args):
    """``fn`` (with the node's op's signature) traced to ATen on the node's fake values, each op lowered with
    this table's lowerings into the current subgraph; ``tensor_args`` are the node's lowered tensor arguments."""
    node = lw.node
    sub, _ = trace_decomposition(node, fn, decomposition_table(KEEP_WHOLE))
    env, inputs = {}, iter(tensor_args)
    result = None
    try:
        for n in sub.graph.nodes:
            if n.op == "placeholder":
                env[n] = next(inputs)
            elif n.op == "call_function":
                lw.node = n
                args = torch.fx.node.map_arg(bind_args(n), lambda a: env[a])
                if n.target is operator.getitem:
                    res = args[0][args[1]]
                else:
                    res = _try_fold(lw, n, args)
                    if res is None:
                        fn_n = EDGE.get(n.target)
                        if fn_n is None or not EDGE.is_supported(n):
                            raise NotImplementedError(f"{op_name(n.target)} (in the traced form) is not lowered")
                        res = EDGE.call(fn_n, lw, args)
                if isinstance(res, Val):
                    res.users = len(n.users)
                env[n] = res
            elif n.op == "output":
                result = torch.fx.node.map_arg(n.args[0], lambda a: env[a])
            else:
                raise NotImplementedError(f"the traced form has a {n.op} node")
    finally:
        lw.node = node
    return result[0] if isinstance(result, (list, tuple)) and len(result) == 1 else result


def _roi_supported(node) -> bool:
    x, rois = (a.meta.get("val") for a in node.args[:2])
    sr = node.args[5] if len(node.args) > 5 else node.kwargs.get("sampling_ratio")
    return (isinstance(sr, int) and sr > 0 and x is not None and rois is not None and x.dim() == 4
            and x.dtype == torch.float32 and all(isinstance(d, int) for d in (*x.shape, *rois.shape)))


# torchvision::roi_align(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height,
#     SymInt pooled_width, int sampling_ratio, bool aligned) -> Tensor
@EDGE.lowering_by_name("torchvision.roi_align.default")
@supported_if(_roi_supported)
def roi_align(lw, x, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned):
    return _lower_traced(lw, _roi_align_dense, [x, rois])


# ---------------------------------------------------------------------------- TFLite_Detection_PostProcess
# tpu_export::detection_postprocess(Tensor box_encodings, Tensor class_scores, Tensor anchors, int max_detections,
#     int max_classes_per_detection, int detections_per_class, float score_threshold, float iou_threshold,
#     int num_classes, float y_scale, float x_scale, float h_scale, float w_scale, bool use_regular_nms)
#     -> (Tensor, Tensor, Tensor, Tensor)
# The interpreter's own kernel, as the custom op GPU / NPU delegates and detection app libraries look for. It takes
# one image: a batch is sliced, one op per image, and the outputs concatenated.


def _dpp_supported(node) -> bool:
    vals = [a.meta.get("val") for a in node.args[:3]]
    return all(v is not None and v.dtype == torch.float32 and all(isinstance(d, int) for d in v.shape)
               for v in vals) and vals[0].shape[1] > 0


@lowering(torch.ops.tpu_export.detection_postprocess.default)
@supported_if(_dpp_supported)
def detection_postprocess(lw, enc, scores, anchors, max_detections, max_classes_per_detection, detections_per_class,
                          score_threshold, iou_threshold, num_classes, y_scale, x_scale, h_scale, w_scale,
                          use_regular_nms):
    from flatbuffers import flexbuffers

    from .builder import schema

    options = bytes(flexbuffers.Dumps({
        "max_detections": int(max_detections), "max_classes_per_detection": int(max_classes_per_detection),
        "detections_per_class": int(detections_per_class), "use_regular_nms": bool(use_regular_nms),
        "nms_score_threshold": float(score_threshold), "nms_iou_threshold": float(iou_threshold),
        "num_classes": int(num_classes), "y_scale": float(y_scale), "x_scale": float(x_scale),
        "h_scale": float(h_scale), "w_scale": float(w_scale)}))
    f32 = np.dtype(np.float32)
    b, n, _ = enc.shape
    c = scores.shape[-1]
    d = max_detections * max_classes_per_detection
    enc_t, scores_t, anchors_t = (lw.tensor(v, tuple(range(len(v.shape)))) for v in (enc, scores, anchors))
    per_image = []
    for i in range(b):
        ins = [enc_t, scores_t]
        if b > 1:
            ins = [lw.op("SLICE", [t, lw.const_tensor(np.array([i, 0, 0], np.int32)),
                                   lw.const_tensor(np.array([1, n, k], np.int32))], (1, n, k), f32).tensor
                   for t, k in ((enc_t, 4), (scores_t, c))]
        outs = [lw.sg.tensor(lw.name(f"detection_{part}"), shape, f32)
                for part, shape in (("boxes", (1, d, 4)), ("classes", (1, d)), ("scores", (1, d)), ("count", (1,)))]
        lw.sg.op(schema().BuiltinOperator.CUSTOM, ins + [anchors_t], outs, custom_code="TFLite_Detection_PostProcess",
                 custom_options=options)
        per_image.append(outs)
    shapes = ((b, d, 4), (b, d), (b, d), (b,))
    result = []
    for k, shape in enumerate(shapes):
        if b == 1:
            t = per_image[0][k]
        else:
            (t,), _ = lw.emit("CONCATENATION", [o[k] for o in per_image], [shape], [f32],
                              lw.options("Concatenation", axis=0), suffix="concat")
        result.append(Val(shape, f32, tuple(range(len(shape))), tensor=t))
    return tuple(result)
