"""Upsampling: RESIZE_BILINEAR / RESIZE_NEAREST_NEIGHBOR, channel-last (NHWC).

A bilinear upsampling to a dynamic size that is an exact integer multiple k of the input's (a
segmentation head's ``interpolate(size=x.shape[-2:])`` from stride 8 with H = 16 * hq) is written as
ops XNNPACK delegates at any size: XNNPACK takes RESIZE_BILINEAR only with a constant size, and the
builtin kernel on the CPU cost LR-ASPP 0.9 ms of its 1.0 ms (1.7-1.9x the static model).
"""

from __future__ import annotations

import numpy as np
import torch

from .helpers import NHWC
from .ops_conv import VALID
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


def _expr(d):
    import sympy

    return sympy.sympify(getattr(getattr(d, "node", None), "expr", d))


def _int_factor(lw):
    """k when the output's H and W are both k times the input's for every size (sympy: 16*hq / (2*hq) = 8),
    k in 2..16 with k * k made of concatenations of at most 4 inputs; else None."""
    ins, outs = lw.node.args[0].meta["val"].shape[2:], lw._outs()[0].shape[2:]
    ks = {_expr(o) / _expr(i) for i, o in zip(ins, outs)}
    if len(ks) != 1:
        return None
    k = ks.pop()
    if not k.is_Integer or not 2 <= int(k) <= 16 or _copies_plan(int(k) ** 2) is None:
        return None
    return int(k)


def _copies_plan(n):
    """Factors of n, each 2..4 (n copies as nested CONCATENATIONs of at most 4 inputs), or None."""
    plan = []
    for f in (4, 3, 2):
        while n % f == 0:
            plan.append(f)
            n //= f
    return plan if n == 1 else None


def _phase_taps(k) -> np.ndarray:
    """[k, 3]: output row k*i + r of a half-pixel bilinear upsampling by k reads rows i-1, i, i+1 with these
    weights (torch's source index (r + 0.5) / k - 0.5 around i, clamped to the edge by the replicated pad)."""
    taps = np.zeros((k, 3), np.float64)
    for r in range(k):
        t = (r + 0.5) / k - 0.5
        taps[r] = (-t, 1 + t, 0) if t < 0 else (0, 1 - t, t)
    return taps


def _upsample_by(lw, x, k):
    """x (N, C, H, W) -> (N, C, kH, kW), bilinear with half-pixel centers: the input edge-padded by 1 (its
    first and last rows and columns, STRIDED_SLICE + CONCATENATION), its channels copied k*k times, one 3x3
    depthwise filter per (row phase, column phase) with the two taps' weights, and DEPTH_TO_SPACE k."""
    n, c, h, w = x.shape
    v, shape = lw.tensor(x, NHWC), [n, c, h, w]
    for axis in (1, 2):  # H, W in NHWC
        edges = []
        for begin in (0, -1):
            b, e = [0] * 4, [0] * 4
            b[axis], e[axis] = begin, begin + 1
            emask = 0b1111 & ~(1 << axis) if begin == 0 else 0b1111
            opts = lw.options("StridedSlice", beginMask=0b1111 & ~(1 << axis), endMask=emask)
            ins = [v] + [lw.const_tensor(a, np.int32) for a in (b, e, [1, 1, 1, 1])]
            phys = [shape[0], shape[2], shape[3], shape[1]]
            phys[axis] = 1
            (t,), _ = lw.emit("STRIDED_SLICE", ins, [tuple(phys)], [x.dtype], opts, suffix="edge")
            edges.append(t)
        shape[axis + 1] = None if shape[axis + 1] is None else shape[axis + 1] + 2
        phys = (shape[0], shape[2], shape[3], shape[1])
        (v,), _ = lw.emit("CONCATENATION", [edges[0], v, edges[1]], [phys], [x.dtype],
                          lw.options("Concatenation", axis=axis, fusedActivationFunction=0), suffix="pad")
    for f in _copies_plan(k * k):
        shape[1] *= f
        (v,), _ = lw.emit("CONCATENATION", [v] * f, [(shape[0], shape[2], shape[3], shape[1])], [x.dtype],
                          lw.options("Concatenation", axis=3, fusedActivationFunction=0), suffix="copies")
    taps = _phase_taps(k)
    kern = np.einsum("ai,bj->abij", taps, taps).reshape(k * k, 3, 3)  # phase (rh, rw): outer product
    filt = np.repeat(kern, c, axis=0).transpose(1, 2, 0)[None].astype(x.dtype)  # [1, 3, 3, (rh, rw, c)]
    opts = lw.options("DepthwiseConv2D", padding=VALID, strideH=1, strideW=1, depthMultiplier=1, dilationHFactor=1,
                      dilationWFactor=1, fusedActivationFunction=0)
    phases = (n, c * k * k, h, w)
    ins = [v, lw.const_tensor(filt), lw.const_tensor(np.zeros(c * k * k, x.dtype))]
    y = lw.op("DEPTHWISE_CONV_2D", ins, phases, x.dtype, NHWC, opts)
    return lw.op("DEPTH_TO_SPACE", [lw.tensor(y)], lw.out_shape, x.dtype, NHWC,
                 lw.options("DepthToSpace", blockSize=k))


# upsample_bilinear2d.vec(Tensor input, SymInt[]? output_size, bool align_corners, float[]? scale_factors) -> Tensor
@lowering(aten.upsample_bilinear2d.vec)
@supported_if(_resize_support)
def upsample_bilinear2d(lw, x, output_size, align_corners, scale_factors=None):
    out = lw.out_shape
    if None in out[2:] and not align_corners and x.dtype == np.float32:
        k = _int_factor(lw)
        if k is not None:
            return _upsample_by(lw, x, k)
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
