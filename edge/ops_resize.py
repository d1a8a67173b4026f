"""Upsampling: RESIZE_BILINEAR / RESIZE_NEAREST_NEIGHBOR, channel-last (NHWC).

A bilinear upsampling of few channels to a dynamic size that is an exact integer multiple k of the
input's (a segmentation head's class scores, ``interpolate(size=x.shape[-2:])`` from stride 8 with
H = 16 * hq) is written as ops XNNPACK delegates at any size: XNNPACK takes RESIZE_BILINEAR only with a
constant size, and the builtin kernel, slow per output pixel, cost LR-ASPP 0.9 ms of its 1.0 ms (1.7-1.9x
the static model). Those ops copy the channels, a pass over the output each, so with more channels the
builtin kernel is as fast. Measured (the resize alone, thread CPU time, 10th percentile of 150 calls,
1 thread, vs the static file's XNNPACK resize): 5 channels x8 to 256x256: builtin kernel 3.98x, these ops
0.94x; 8 ch x2 to 256: 2.28x vs 1.57x; 12 ch x8: 2.85x vs 1.68x; 16 ch x2: 1.64x vs 1.75x; 21 ch x8:
1.98x vs 2.05x; 64 ch x2: 1.16x vs 1.27x. The int8-weight schemes quantize the depthwise taps: 1.0% error
in the resize alone with dynamic_int8 (LR-ASPP whole: 0.083 vs 0.078 with RESIZE_BILINEAR; static_int8
0.141 both). Float16 taps behind a DEQUANTIZE kept it exact but broke static_int8 (rel err 1.0).
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


_FEW_CHANNELS = 12  # up to here the XNNPACK ops beat the builtin kernel (measured above)


def _expr(d):
    import sympy

    return sympy.sympify(getattr(getattr(d, "node", None), "expr", d))


def _int_factor(lw):
    """k when the output's H and W are both k times the input's for every size (sympy: 16*hq / (2*hq) = 8),
    k in 2..16 made of factors 2..4; else None."""
    ins, outs = lw.node.args[0].meta["val"].shape[2:], lw._outs()[0].shape[2:]
    ks = {_expr(o) / _expr(i) for i, o in zip(ins, outs)}
    if len(ks) != 1:
        return None
    k = ks.pop()
    if not k.is_Integer or not 2 <= int(k) <= 16 or _copies_plan(int(k)) is None:
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
    taps = _phase_taps(k)
    opts = lw.options("DepthwiseConv2D", padding=VALID, strideH=1, strideW=1, depthMultiplier=1, dilationHFactor=1,
                      dilationWFactor=1, fusedActivationFunction=0)
    # columns, then rows: each pass copies the channels k times (phase-major, as DEPTH_TO_SPACE reads them)
    # and runs one 3-tap depthwise filter per phase (3 taps on the k*k copies instead of a 3x3)
    for axis, kh, kw in ((2, 1, 3), (1, 3, 1)):
        for f in _copies_plan(k):
            shape[1] *= f
            (v,), _ = lw.emit("CONCATENATION", [v] * f, [(shape[0], shape[2], shape[3], shape[1])], [x.dtype],
                              lw.options("Concatenation", axis=3, fusedActivationFunction=0), suffix="copies")
        filt = np.repeat(taps, shape[1] // k, axis=0).T.reshape(1, kh, kw, shape[1]).astype(x.dtype)
        shape[axis + 1] = {1: h, 2: w}[axis]
        phys = (shape[0], shape[2], shape[3], shape[1])
        ins = [v, lw.const_tensor(filt), lw.const_tensor(np.zeros(shape[1], x.dtype))]
        (v,), _ = lw.emit("DEPTHWISE_CONV_2D", ins, [phys], [x.dtype], opts, suffix="phases")
    return lw.op("DEPTH_TO_SPACE", [v], lw.out_shape, x.dtype, NHWC, lw.options("DepthToSpace", blockSize=k))


# upsample_bilinear2d.vec(Tensor input, SymInt[]? output_size, bool align_corners, float[]? scale_factors) -> Tensor
@lowering(aten.upsample_bilinear2d.vec)
@supported_if(_resize_support)
def upsample_bilinear2d(lw, x, output_size, align_corners, scale_factors=None):
    out = lw.out_shape
    if None in out[2:] and not align_corners and x.dtype == np.float32 and x.shape[1] <= _FEW_CHANNELS:
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
