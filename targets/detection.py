"""Host-side decoding of a detector's static outputs, in numpy only (no torch at run time).

Keypoint R-CNN's last step, torchvision's ``heatmaps_to_keypoints``, resizes each box's heatmaps to the box's own
size (``ceil`` of its width and height) before taking the argmax: a size known only at run time, which an exported
graph cannot have. ``converter.static_detector`` therefore returns the heatmaps of each detection slot, and
``decode_keypoints`` finishes the job on the host with torchvision's arithmetic, step by step in float32:
``torch.nn.functional.interpolate(mode="bicubic", align_corners=False)`` as torch's CPU kernel computes it (the
cubic convolution with A = -0.75, source taps clamped to the border, the four column taps summed in order, then
the four row taps), the first maximum of each keypoint's map, ``(index + 0.5) * (box size / resized size) + box
corner``, then the ratio of the input image to the model's resized image (torchvision's ``resize_keypoints``).
"""

from __future__ import annotations

import numpy as np

__all__ = ["decode_keypoints"]

_F32 = np.float32
_A = _F32(-0.75)  # torch's bicubic coefficient


def _fma(a, b, c):
    """float32 ``a * b + c`` rounded once, as the fused multiply-add torch's vectorized CPU kernels (AVX2, AVX512)
    compile to: the float32 product is exact in float64."""
    return (a.astype(np.float64) * b + c).astype(_F32)


def _cubic1(x):
    return (_fma(_A + _F32(2), x, -(_A + _F32(3))) * x) * x + _F32(1)


def _cubic2(x):
    return _fma(_fma(_A, x, -(_F32(5) * _A)), x, _F32(8) * _A) * x - _F32(4) * _A


def _taps(in_size: int, out_size: int) -> tuple[np.ndarray, np.ndarray]:
    """The source indices ``[4, out_size]`` and weights ``[4, out_size]`` (float32) of torch's bicubic resize
    along one axis (align_corners=False, no scale factor given)."""
    scale = _F32(in_size) / _F32(out_size)
    real = _fma(np.full(out_size, scale, _F32), np.arange(out_size, dtype=_F32) + _F32(0.5), _F32(-0.5))
    index = np.minimum(np.floor(real), _F32(in_size - 1))
    t = np.clip(real - index, _F32(0), _F32(1))
    t2 = _F32(1) - t
    weights = np.stack([_cubic2(t + _F32(1)), _cubic1(t), _cubic1(t2), _cubic2(t2 + _F32(1))]).astype(_F32)
    index = index.astype(np.int64)
    taps = np.stack([np.clip(index + j - 1, 0, in_size - 1) for j in range(4)])
    return taps, weights


def _sum4(terms, weights):
    """``sum(t * w)`` over four taps in the order and with the fused multiply-adds of torch's kernel (compiled for
    AVX2 / AVX512): the second product rounded, the first fused onto it, then the third and fourth fused on."""
    out = _fma(terms[0], weights[0], terms[1] * weights[1])
    for j in (2, 3):
        out = _fma(terms[j], weights[j], out)
    return out


def _resize(maps: np.ndarray, h: int, w: int) -> np.ndarray:
    """``maps`` ``[K, S, S]`` float32 resized bicubically to ``[K, h, w]`` as torch's CPU kernel does: per output
    pixel, the four column taps of each of the four rows, then the four rows."""
    ys, wy = _taps(maps.shape[-2], h)
    xs, wx = _taps(maps.shape[-1], w)
    cols = _sum4([maps[:, :, xs[j]] for j in range(4)], wx)  # [K, S, w]
    return _sum4([cols[:, ys[j], :] for j in range(4)], [wy[j][:, None] for j in range(4)])


def _check(name: str, a, shape_doc: str, ndim: int, lead: tuple) -> np.ndarray:
    a = np.asarray(a)
    if a.ndim != ndim or a.shape[:len(lead)] != lead:
        raise ValueError(f"decode_keypoints: {name} must be {shape_doc}, got shape {a.shape}")
    return a


def decode_keypoints(heatmaps, boxes, valid=None, scale=None) -> tuple[np.ndarray, np.ndarray]:
    """torchvision's Keypoint R-CNN keypoints from ``static_detector``'s outputs, in numpy.

    Args:
        heatmaps: ``keypoint_heatmaps``, ``[B, D, K, S, S]`` (or ``[D, K, S, S]`` for one image): the keypoint
            predictor's logits per detection slot.
        boxes: ``keypoint_boxes``, ``[B, D, 4]`` ``(x1, y1, x2, y2)`` in the frame the heatmaps were pooled in
            (the model's resized image), not the ``boxes`` output.
        valid: ``[B, D]`` bool, the slots holding a detection; None for all. Invalid slots come out zero and
            are not decoded.
        scale: ``keypoint_scale``, ``[B, 2]`` (or ``[2]``) float ``(x, y)`` ratios of the input image's size
            to the resized image's; None for 1 (an input the transform does not resize).

    Returns:
        ``(keypoints, scores)``: ``keypoints`` ``[B, D, K, 3]`` float32 rows ``(x, y, 1)`` in the input image's
        pixels (torchvision's ``keypoints``), ``scores`` ``[B, D, K]`` float32, the resized heatmap's value at
        each keypoint (torchvision's ``keypoints_scores``); both zero where ``valid`` is false. Without a batch
        dimension in ``heatmaps``, none in the results.

    Raises:
        ValueError: An argument's shape does not match ``heatmaps``' (named in the message).

    Examples:
        >>> import numpy as np
        >>> from tpu_export.targets import decode_keypoints
        >>> heatmaps = np.zeros((1, 1, 2, 56, 56), np.float32)
        >>> heatmaps[0, 0, 0, 10, 20] = heatmaps[0, 0, 1, 40, 5] = 1.0
        >>> kps, scores = decode_keypoints(heatmaps, np.array([[[0.0, 0.0, 56.0, 56.0]]]))
        >>> kps[0, 0].tolist()
        [[20.5, 10.5, 1.0], [5.5, 40.5, 1.0]]
    """
    heatmaps = np.asarray(heatmaps)
    one = heatmaps.ndim == 4
    if one:
        heatmaps = heatmaps[None]
    if heatmaps.ndim != 5:
        raise ValueError(f"decode_keypoints: heatmaps must be [B, D, K, S, S] (or [D, K, S, S]), got shape "
                         f"{heatmaps.shape}")
    b, d, k = heatmaps.shape[:3]
    boxes = _check("boxes", boxes if not one else np.asarray(boxes)[None], "[B, D, 4] like heatmaps' [B, D]", 3,
                   (b, d))
    if boxes.shape[-1] != 4:
        raise ValueError(f"decode_keypoints: boxes must be [B, D, 4], got shape {boxes.shape}")
    valid = (np.ones((b, d), bool) if valid is None else
             _check("valid", valid if not one else np.asarray(valid)[None], "[B, D] like heatmaps' [B, D]", 2,
                    (b, d)).astype(bool))
    if scale is None:
        scale = np.ones((b, 2), _F32)
    scale = np.asarray(scale, dtype=_F32)
    if scale.shape == (2,):
        scale = np.broadcast_to(scale, (b, 2))
    if scale.shape != (b, 2):
        raise ValueError(f"decode_keypoints: scale must be [B, 2] (x, y) or [2], got shape {scale.shape}")
    heatmaps = heatmaps.astype(_F32, copy=False)
    boxes = boxes.astype(_F32, copy=False)

    keypoints = np.zeros((b, d, k, 3), _F32)
    scores = np.zeros((b, d, k), _F32)
    for i, j in zip(*np.nonzero(valid)):
        x1, y1, x2, y2 = boxes[i, j]
        width, height = max(x2 - x1, _F32(1)), max(y2 - y1, _F32(1))  # torchvision clamps them to 1
        w, h = int(np.ceil(width)), int(np.ceil(height))
        roi = _resize(heatmaps[i, j], h, w)
        pos = roi.reshape(k, -1).argmax(axis=1)
        xi = pos % w
        yi = (pos - xi) // w
        x = (xi.astype(_F32) + _F32(0.5)) * (width / _F32(w)) + x1
        y = (yi.astype(_F32) + _F32(0.5)) * (height / _F32(h)) + y1
        keypoints[i, j, :, 0] = x * scale[i, 0]
        keypoints[i, j, :, 1] = y * scale[i, 1]
        keypoints[i, j, :, 2] = 1
        scores[i, j] = roi[np.arange(k), yi, xi]
    return (keypoints[0], scores[0]) if one else (keypoints, scores)
