"""Convolutions, pooling, resizing and depth/space moves: all run channel-last (NHWC).

Torch's explicit padding becomes SAME when SAME places the windows identically (same output
size, same leading pad); otherwise a PAD/PADV2 before a VALID op, as LiteRT has no explicit
padding. Filters are permuted to LiteRT's layouts at conversion time.
"""

from __future__ import annotations

import numpy as np
import torch

from converter.registry import arguments

from .ops_elementwise import binary
from .ops_shape import pad_value, strided_slice
from .registry import lowering, supported_if
from .values import Val

__all__ = []

aten = torch.ops.aten
NHWC = (0, 2, 3, 1)
SAME, VALID = 0, 1  # Padding enum


def _pad_mode(ins, ks, ss, ps, ds, outs):
    """SAME, VALID, or None (explicit padding needed) for torch's symmetric pads ``ps``.
    SAME also covers a ceil_mode pool whose last window overhangs the end by SAME's
    trailing pad (SqueezeNet's 3x3/2 max pools): with no PADV2 in front, which XNNPACK
    does not delegate, the pool stays in the delegated graph."""
    if all(p == 0 for p in ps):
        valid = [(i - d * (k - 1) - 1) // s + 1 for i, k, s, d in zip(ins, ks, ss, ds)]
        if list(valid) == list(outs):
            return VALID
    for i, k, s, p, d, o in zip(ins, ks, ss, ps, ds, outs):
        if i is None:
            return None
        same_out = -(-i // s)
        total = max((same_out - 1) * s + d * (k - 1) + 1 - i, 0)
        if same_out != o or total // 2 != p:
            return None
    return SAME


def _spatial(x: Val):
    return list(x.shape[2:])


def _conv_support(n):
    x = n.args[0].meta["val"]
    transposed, groups = n.args[6], n.args[8]
    if x.dim() not in (3, 4) or any(not isinstance(d, int) for d in x.shape[2:]):
        return False
    if transposed:
        w = n.args[1]
        const_w = isinstance(w, torch.fx.Node) and w.op == "placeholder" and "weight_name" in w.meta
        return (groups == 1 or const_w) and all(d == 1 for d in n.args[5]) and \
            all(op <= p for op, p in zip(n.args[7], n.args[4]))
    return True


# convolution(Tensor input, Tensor weight, Tensor? bias, SymInt[] stride, SymInt[] padding, SymInt[] dilation,
#             bool transposed, SymInt[] output_padding, SymInt groups) -> Tensor
@lowering(aten.convolution.default)
@supported_if(_conv_support)
def convolution(lw, x, w, b, stride, padding, dilation, transposed, output_padding, groups):
    if x.rank == 3:  # conv1d as a conv2d over a height of 1
        out = lw.out_shape
        x4 = lw.reshape(x, [x.shape[0], x.shape[1], 1, x.shape[2]])
        w4 = lw.reshape(w, [w.shape[0], w.shape[1], 1, w.shape[2]])
        out4 = (out[0], out[1], 1, out[2])
        if transposed:
            y = _conv_transpose2d(lw, x4, w4, b, [1, stride[0]], [0, padding[0]], groups, out4)
        else:
            y = _conv2d(lw, x4, w4, b, [1, stride[0]], [0, padding[0]], [1, dilation[0]], groups, out4)
        return lw.reshape(y, out)
    if transposed:
        return _conv_transpose2d(lw, x, w, b, stride, padding, groups, lw.out_shape)
    return _conv2d(lw, x, w, b, stride, padding, dilation, groups, lw.out_shape)


def _conv2d(lw, x, w, b, stride, padding, dilation, groups, out_shape):
    o, cin = w.shape[0], x.shape[1]
    ks = list(w.shape[2:])
    mode = _pad_mode(_spatial(x), ks, stride, padding, dilation, out_shape[2:])
    if mode is None:
        pads = [[0, 0], [0, 0]] + [[p, p] for p in padding]
        shape = tuple(x.shape[:2]) + tuple(s + 2 * p for s, p in zip(x.shape[2:], padding))
        x = pad_value(lw, x, pads, 0.0, shape=shape, perm=NHWC)
        mode = VALID
    bias = b if b is not None else lw.const(np.zeros(o, x.dtype))
    depthwise = groups > 1 and groups == cin and o % cin == 0
    common = dict(padding=mode, strideH=stride[0], strideW=stride[1], dilationHFactor=dilation[0],
                  dilationWFactor=dilation[1], fusedActivationFunction=0)
    if depthwise:
        ins = [lw.tensor(x, NHWC), lw.tensor(w, (1, 2, 3, 0)), lw.tensor(bias)]
        opts = lw.options("DepthwiseConv2D", depthMultiplier=o // cin, **common)
        return lw.op("DEPTHWISE_CONV_2D", ins, out_shape, x.dtype, NHWC, opts,
                     version=2 if max(dilation) > 1 else 1, fusable=True)
    ins = [lw.tensor(x, NHWC), lw.tensor(w, NHWC), lw.tensor(bias)]
    version = 6 if groups > 1 else (2 if max(dilation) > 1 else 1)
    return lw.op("CONV_2D", ins, out_shape, x.dtype, NHWC, lw.options("Conv2D", **common), version=version,
                 fusable=True)


def _conv_transpose2d(lw, x, w, b, stride, padding, groups, out):
    ks = list(w.shape[2:])
    ins_hw = _spatial(x)
    same_out = [i * s for i, s in zip(ins_hw, stride)]
    same_pad = [max(k - s, 0) // 2 for k, s in zip(ks, stride)]
    if list(out[2:]) == same_out and same_pad == list(padding):
        mode, full = SAME, tuple(out)
    else:
        mode = VALID
        full = tuple(out[:2]) + tuple((i - 1) * s + k for i, s, k in zip(ins_hw, stride, ks))
    opts = lambda: lw.options("TransposeConv", padding=mode, strideH=stride[0], strideW=stride[1])  # noqa: E731
    if groups == 1:
        parts = [(x, w, b)]
    else:  # LiteRT has no grouped TRANSPOSE_CONV: one per group on a channel split, then concat
        ig, og = x.shape[1] // groups, full[1] // groups
        xs = _split_channels(lw, x, groups)
        parts = [(xs[g], lw.const(w.const[g * ig:(g + 1) * ig]),
                  lw.const(b.const[g * og:(g + 1) * og]) if b is not None else None) for g in range(groups)]
    ys = []
    for xg, wg, bg in parts:
        o = wg.shape[1]
        shape_g = (full[0], o) + full[2:]
        shape_t = lw.const_tensor([-1 if full[0] is None else full[0], full[2], full[3], o], np.int32)
        bias = lw.tensor(bg) if bg is not None else None
        ins = [shape_t, lw.tensor(wg, (1, 2, 3, 0)), lw.tensor(xg, NHWC), bias]
        ys.append(lw.op("TRANSPOSE_CONV", ins, shape_g, x.dtype, NHWC, opts(), version=3 if bias is not None else 1))
    y = ys[0]
    if len(ys) > 1:
        y = lw.op("CONCATENATION", [lw.tensor(v) for v in ys], full, x.dtype, NHWC,
                  lw.options("Concatenation", axis=3))
    if full != tuple(out):
        y = strided_slice(lw, y, {2: (padding[0], padding[0] + out[2], 1), 3: (padding[1], padding[1] + out[3], 1)},
                          out_shape=out)
    return y


def _split_channels(lw, x, groups):
    x = lw.with_perm(x, NHWC)
    c = x.shape[1] // groups
    shape = (x.shape[0], c) + tuple(x.shape[2:])
    phys = tuple(shape[p] for p in NHWC)
    ins = [lw.const_tensor(np.array(3, np.int32)), lw.tensor(x)]
    ts, _ = lw.emit("SPLIT", ins, [phys] * groups, [x.dtype] * groups, lw.options("Split", numSplits=groups))
    return [Val(shape, x.dtype, NHWC, tensor=t) for t in ts]


def _pool_args(kernel_size, stride, padding):
    ks = list(kernel_size) * (2 // len(kernel_size))
    ss = list(stride) * (2 // len(stride)) if stride else ks
    ps = list(padding) * (2 // len(padding)) if isinstance(padding, (list, tuple)) else [padding] * 2
    return ks, ss, ps


def _pool(lw, op, x, ks, ss, mode, out):
    opts = lw.options("Pool2D", padding=mode, strideH=ss[0], strideW=ss[1], filterHeight=ks[0], filterWidth=ks[1],
                      fusedActivationFunction=0)
    return lw.op(op, [lw.tensor(x, NHWC)], out, x.dtype, NHWC, opts, fusable=True)


def _indices_unused(n):
    return all(u.args[1] == 0 or not u.users for u in n.users)


def _maxpool_support(n):
    dil = arguments(n)["dilation"]
    x = n.args[0].meta["val"]
    return _indices_unused(n) and all(d == 1 for d in dil) and x.dim() == 4 and \
        all(isinstance(d, int) for d in x.shape[2:])


# max_pool2d_with_indices(Tensor self, int[2] kernel_size, int[2] stride=[], int[2] padding=0,
#                         int[2] dilation=1, bool ceil_mode=False) -> (Tensor, Tensor)
@lowering(aten.max_pool2d_with_indices.default)
@supported_if(_maxpool_support)
def max_pool2d(lw, x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    ks, ss, ps = _pool_args(kernel_size, stride, padding)
    out = lw.out_shape
    mode = _pad_mode(_spatial(x), ks, ss, ps, [1, 1], out[2:])
    if mode is None:
        # pad with -inf (never the max), including what ceil_mode's last window reaches past.
        # Not zeros after a ReLU: XNNPACK would take that PAD, and its pad kernel (unless
        # fused into a following conv) measured ~8x slower than the builtin PADV2 here
        ends = [(o - 1) * s + k - (i + p) for o, s, k, i, p in zip(out[2:], ss, ks, x.shape[2:], ps)]
        pads = [[0, 0], [0, 0]] + [[p, max(e, 0)] for p, e in zip(ps, ends)]
        shape = tuple(x.shape[:2]) + tuple(i + a + b for i, (a, b) in zip(x.shape[2:], pads[2:]))
        x = pad_value(lw, x, pads, float("-inf"), shape=shape, perm=NHWC)
        mode = VALID
    return _pool(lw, "MAX_POOL_2D", x, ks, ss, mode, out), None


def _avg_counts(n_in, k, s, p, n_out, include_pad):
    """Per output position: how many elements torch's average divides by (one spatial dim)."""
    counts = []
    for o in range(n_out):
        start = o * s - p
        end = min(start + k, n_in + p)
        if not include_pad:
            start, end = max(start, 0), min(end, n_in)
        counts.append(end - start)
    return np.array(counts, np.float64)


def _avgpool_support(n):
    x = n.args[0].meta["val"]
    return x.dim() == 4 and all(isinstance(d, int) for d in x.shape[2:])


# avg_pool2d(Tensor self, int[2] kernel_size, int[2] stride=[], int[2] padding=0, bool ceil_mode=False,
#            bool count_include_pad=True, int? divisor_override=None) -> Tensor
@lowering(aten.avg_pool2d.default)
@supported_if(_avgpool_support)
def avg_pool2d(lw, x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    ks, ss, ps = _pool_args(kernel_size, stride, padding)
    out = lw.out_shape
    mode = _pad_mode(_spatial(x), ks, ss, ps, [1, 1], out[2:])
    if divisor_override is None and (mode == VALID or (mode == SAME and not count_include_pad)):
        return _pool(lw, "AVERAGE_POOL_2D", x, ks, ss, mode, out)
    ends = [(o - 1) * s + k - (i + p) for o, s, k, i, p in zip(out[2:], ss, ks, x.shape[2:], ps)]
    pads = [[0, 0], [0, 0]] + [[p, max(e, 0)] for p, e in zip(ps, ends)]
    if any(a or b for a, b in pads):
        shape = tuple(x.shape[:2]) + tuple(i + a + b for i, (a, b) in zip(x.shape[2:], pads[2:]))
        x0 = x
        x = pad_value(lw, x, pads, 0.0, shape=shape, perm=NHWC)
    else:
        x0 = x
    y = _pool(lw, "AVERAGE_POOL_2D", x, ks, ss, VALID, out)
    # VALID divided every window by k*k; torch divides by the count it defines (or the override)
    if divisor_override is not None:
        factor = np.full((out[2], out[3]), ks[0] * ks[1] / divisor_override)
    else:
        ch = _avg_counts(x0.shape[2], ks[0], ss[0], ps[0], out[2], count_include_pad)
        cw = _avg_counts(x0.shape[3], ks[1], ss[1], ps[1], out[3], count_include_pad)
        factor = ks[0] * ks[1] / np.outer(ch, cw)
    if np.allclose(factor, 1.0):
        return y
    return binary(lw, "MUL", y, lw.const(factor.astype(x.dtype)[None, None]), kind="Mul", shape=out)


def _adaptive_support(n):
    x = n.args[0].meta["val"]
    oh, ow = n.args[1]
    if x.dim() != 4 or not all(isinstance(d, int) for d in x.shape[2:]):
        return False
    return (oh, ow) == (1, 1) or (x.shape[2] % oh == 0 and x.shape[3] % ow == 0)


# _adaptive_avg_pool2d(Tensor self, SymInt[2] output_size) -> Tensor
@lowering(aten._adaptive_avg_pool2d.default)
@supported_if(_adaptive_support)
def adaptive_avg_pool2d(lw, x, output_size):
    oh, ow = output_size
    out = lw.out_shape
    if (oh, ow) == (1, 1):
        x = lw.with_perm(x, NHWC)
        ins = [lw.tensor(x), lw.const_tensor([1, 2], np.int32)]
        return lw.op("MEAN", ins, out, x.dtype, NHWC, lw.options("Reducer", keepDims=True))
    ks = [x.shape[2] // oh, x.shape[3] // ow]
    return _pool(lw, "AVERAGE_POOL_2D", x, ks, ks, VALID, out)


def _resize_support(n):
    x = n.args[0].meta["val"]
    return x.dim() == 4 and all(isinstance(d, int) for d in n.meta["val"].shape[2:])


# upsample_bilinear2d.vec(Tensor input, SymInt[]? output_size, bool align_corners, float[]? scale_factors) -> Tensor
@lowering(aten.upsample_bilinear2d.vec)
@supported_if(_resize_support)
def upsample_bilinear2d(lw, x, output_size, align_corners, scale_factors=None):
    out = lw.out_shape
    ins = [lw.tensor(x, NHWC), lw.const_tensor(list(out[2:]), np.int32)]
    opts = lw.options("ResizeBilinear", alignCorners=bool(align_corners), halfPixelCenters=not align_corners)
    return lw.op("RESIZE_BILINEAR", ins, out, x.dtype, NHWC, opts, version=1 if align_corners else 3)


# upsample_nearest2d.vec(Tensor input, SymInt[]? output_size, float[]? scale_factors) -> Tensor
@lowering(aten.upsample_nearest2d.vec)
@supported_if(_resize_support)
def upsample_nearest2d(lw, x, output_size, scale_factors=None):
    out = lw.out_shape
    ins = [lw.tensor(x, NHWC), lw.const_tensor(list(out[2:]), np.int32)]
    opts = lw.options("ResizeNearestNeighbor", alignCorners=False, halfPixelCenters=False)
    return lw.op("RESIZE_NEAREST_NEIGHBOR", ins, out, x.dtype, NHWC, opts)


def _channel_gather(lw, x: Val, order, shape) -> Val:
    ins = [lw.tensor(x, NHWC), lw.const_tensor(np.asarray(order, np.int32))]
    return lw.op("GATHER", ins, shape, x.dtype, NHWC, lw.options("Gather", axis=3), suffix="channels")


# pixel_shuffle(Tensor self, int upscale_factor) -> Tensor
# torch orders input channels (c, i, j); DEPTH_TO_SPACE reads (i, j, c): reorder with a GATHER first.
@lowering(aten.pixel_shuffle.default)
@supported_if(lambda n: n.args[0].meta["val"].dim() == 4)
def pixel_shuffle(lw, x, r):
    c = x.shape[1] // (r * r)
    if c > 1:
        order = np.arange(c * r * r).reshape(c, r * r).T.reshape(-1)
        x = _channel_gather(lw, x, order, x.shape)
    return lw.op("DEPTH_TO_SPACE", [lw.tensor(x, NHWC)], lw.out_shape, x.dtype, NHWC,
                 lw.options("DepthToSpace", blockSize=r))


# pixel_unshuffle(Tensor self, int downscale_factor) -> Tensor
@lowering(aten.pixel_unshuffle.default)
@supported_if(lambda n: n.args[0].meta["val"].dim() == 4)
def pixel_unshuffle(lw, x, r):
    out = lw.out_shape
    c = x.shape[1]
    y = lw.op("SPACE_TO_DEPTH", [lw.tensor(x, NHWC)], out, x.dtype, NHWC, lw.options("SpaceToDepth", blockSize=r))
    if c > 1:
        order = np.arange(c * r * r).reshape(r * r, c).T.reshape(-1)
        y = _channel_gather(lw, y, order, out)
    return y
