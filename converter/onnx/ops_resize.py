"""ONNX Resize (and the old Upsample): the variants torch expresses.

- nearest: every coordinate_transformation_mode except tf_crop_and_resize, with every nearest_mode:
  (asymmetric, floor) is F.interpolate's "nearest"; the rest gather rows/columns (index_select) at
  indices computed here from the static sizes.
- linear: half_pixel / pytorch_half_pixel (align_corners=False) and align_corners.
- cubic: half_pixel / pytorch_half_pixel and align_corners with cubic_coeff_a=-0.75 and
  exclude_outside=0 (torch's bicubic).
Everything else (antialias, tf_crop_and_resize, linear/cubic with asymmetric or half_pixel_symmetric,
another cubic_coeff_a, keep_aspect_ratio_policy other than stretch) is refused with the attribute named.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from .common import axis_of, ints
from .registry import TABLE as T

__all__: list[str] = []

_ATTRS = {"antialias": 0, "axes": None, "coordinate_transformation_mode": "half_pixel", "cubic_coeff_a": -0.75,
          "exclude_outside": 0, "extrapolation_value": 0.0, "keep_aspect_ratio_policy": "stretch",
          "mode": "nearest", "nearest_mode": "round_prefer_floor"}
_COORD = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric",
          "tf_crop_and_resize")
_NEAREST = {
    "round_prefer_floor": lambda v: np.ceil(v - 0.5),
    "round_prefer_ceil": lambda v: np.floor(v + 0.5),
    "floor": np.floor,
    "ceil": np.ceil,
}


def _src_coord(mode, out_idx, scale, n_in, n_out):
    if mode == "half_pixel":
        return (out_idx + 0.5) / scale - 0.5
    if mode == "pytorch_half_pixel":
        return (out_idx + 0.5) / scale - 0.5 if n_out > 1 else np.zeros_like(out_idx)
    if mode == "align_corners":
        return out_idx * (n_in - 1) / (n_out - 1) if n_out > 1 else np.zeros_like(out_idx)
    if mode == "asymmetric":
        return out_idx / scale
    # half_pixel_symmetric
    adj = n_out / (scale * n_in)
    center = n_in / 2
    offset = center * (1 - adj)
    return offset + (out_idx + 0.5) / scale - 0.5


def _nearest_by_gather(x, sizes, scales, coord, nearest_mode):
    for d in range(2, x.dim()):
        n_in, n_out = x.shape[d], sizes[d]
        if n_in == n_out and scales[d] == 1.0:
            continue
        src = _src_coord(coord, np.arange(n_out, dtype=np.float64), scales[d], n_in, n_out)
        idx = np.clip(_NEAREST[nearest_mode](src), 0, n_in - 1).astype(np.int64)
        x = torch.index_select(x, d, torch.from_numpy(idx))
    return x


def _resize(ctx, x, scales, sizes, *, mode, coord, nearest_mode, cubic_coeff_a, exclude_outside, antialias,
            keep_aspect_ratio_policy):
    rank = x.dim()
    in_shape = list(x.shape)
    if any(isinstance(s, torch.SymInt) for s in in_shape[2:]):
        ctx.fail("Resize of a dynamic spatial size is not supported; give those dims a size (dim_sizes)")
    from_sizes = sizes is not None
    if from_sizes:
        scales = [o / i for o, i in zip(sizes, in_shape)]
    else:
        sizes = [int(math.floor(i * s)) for i, s in zip(in_shape, scales)]
    if sizes[:2] != in_shape[:2]:
        ctx.fail(f"resizing the batch or channel dims ({in_shape[:2]} -> {sizes[:2]}) is not supported")
    if antialias:
        ctx.fail("antialias=1 is not supported")
    if keep_aspect_ratio_policy != "stretch":
        ctx.fail(f"keep_aspect_ratio_policy={keep_aspect_ratio_policy!r} is not supported (stretch is)")
    if coord not in _COORD:
        ctx.fail(f"coordinate_transformation_mode={coord!r}; ONNX defines {', '.join(_COORD)}")
    if coord == "tf_crop_and_resize":
        ctx.fail("coordinate_transformation_mode='tf_crop_and_resize' is not supported")
    nsp = rank - 2
    if nsp < 1 or nsp > 3:
        ctx.fail(f"a rank-{rank} input: Resize of 1 to 3 spatial dims is supported")
    # torch maps coordinates with in/out for a size and with 1/scale for a scale factor, as ONNX does for each;
    # a scale that gives a whole size is that size (the form every backend lowers the same way)
    exact = all(abs(i * s - o) < 1e-9 for i, s, o in zip(in_shape[2:], scales[2:], sizes[2:]))
    kw = {"size": sizes[2:]} if from_sizes or exact else {"scale_factor": scales[2:], "recompute_scale_factor": False}
    if mode == "nearest":
        if nearest_mode not in _NEAREST:
            ctx.fail(f"nearest_mode={nearest_mode!r}; ONNX defines {', '.join(_NEAREST)}")
        if coord == "asymmetric" and nearest_mode == "floor":
            return F.interpolate(x, mode="nearest", **kw)
        # the rest (nearest-exact among them: torch exports it as an index the edge backend refuses) gather
        return _nearest_by_gather(x, sizes, scales, coord, nearest_mode)
    if mode in ("linear", "cubic"):
        if coord not in ("half_pixel", "pytorch_half_pixel", "align_corners"):
            ctx.fail(f"mode={mode!r} with coordinate_transformation_mode={coord!r} is not supported "
                     "(half_pixel, pytorch_half_pixel and align_corners are)")
        if coord == "half_pixel" and any(s == 1 for s in sizes[2:]) and any(i != 1 for i in in_shape[2:]):
            ctx.fail("half_pixel to an output size of 1 differs from torch's; use pytorch_half_pixel")
        if coord == "pytorch_half_pixel" and any(s == 1 for s in sizes[2:]):
            # ONNX samples coordinate 0 for an output size of 1 (torch would sample the middle): take row 0 first
            for d in range(2, rank):
                if sizes[d] == 1:
                    x = x.narrow(d, 0, 1)
            if "size" not in kw:
                kw = {"size": sizes[2:]}
        if mode == "cubic":
            if abs(cubic_coeff_a + 0.75) > 1e-6 or exclude_outside:
                ctx.fail(f"cubic with cubic_coeff_a={cubic_coeff_a}, exclude_outside={exclude_outside} is not "
                         "supported (torch's bicubic is -0.75, 0)")
            if nsp != 2:
                ctx.fail("cubic Resize of other than 2 spatial dims is not supported")
            tmode = "bicubic"
        else:
            tmode = {1: "linear", 2: "bilinear", 3: "trilinear"}[nsp]
        return F.interpolate(x, mode=tmode, align_corners=coord == "align_corners", **kw)
    ctx.fail(f"mode={mode!r}; ONNX defines nearest, linear and cubic")


def _with_axes(ctx, rank, axes, values, fill):
    if axes is None:
        return list(values)
    full = [fill] * rank
    for a, v in zip(axes, values):
        full[axis_of(ctx, a, rank)] = v
    return full


# ai.onnx::Resize(X, roi?, scales?, sizes?) -> Y  attrs: antialias, axes, coordinate_transformation_mode,
#   cubic_coeff_a, exclude_outside, extrapolation_value, keep_aspect_ratio_policy, mode, nearest_mode
@T.op("Resize", since=13, attrs=_ATTRS, static=(1, 2, 3))
def resize(ctx, x, roi=None, scales=None, sizes=None, *, antialias, axes, coordinate_transformation_mode,
           cubic_coeff_a, exclude_outside, extrapolation_value, keep_aspect_ratio_policy, mode, nearest_mode):
    rank = x.dim()
    sc = [float(v) for v in np.asarray(scales).reshape(-1)] if scales is not None and np.asarray(scales).size else None
    sz = ints(ctx, sizes, "sizes") if sizes is not None and np.asarray(sizes).size else None
    if (sc is None) == (sz is None):
        ctx.fail("exactly one of scales and sizes must be given")
    sc = _with_axes(ctx, rank, axes, sc, 1.0) if sc is not None else None
    sz = _with_axes(ctx, rank, axes, sz, None) if sz is not None else None
    if sz is not None:
        sz = [v if v is not None else x.shape[i] for i, v in enumerate(sz)]
    return _resize(ctx, x, sc, sz, mode=mode, coord=coordinate_transformation_mode, nearest_mode=nearest_mode,
                   cubic_coeff_a=cubic_coeff_a, exclude_outside=exclude_outside, antialias=antialias,
                   keep_aspect_ratio_policy=keep_aspect_ratio_policy)
