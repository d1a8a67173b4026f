"""Convolutions, channel-last (NHWC). Torch's explicit padding becomes SAME when SAME places the
windows identically (same output size, same leading pad); otherwise a PAD/PADV2 before a VALID
op, as LiteRT has no explicit padding. Filters are permuted to LiteRT's layouts at conversion time.
"""

from __future__ import annotations

import numpy as np
import torch

from .helpers import NHWC
from .ops_slice import pad_value, strided_slice
from .registry import lowering, supported_if
from .values import Val

__all__ = ["SAME", "VALID", "pad_mode", "spatial"]

aten = torch.ops.aten




SAME, VALID = 0, 1  # Padding enum


def pad_mode(ins, ks, ss, ps, ds, outs):
    """SAME, VALID, or None (explicit padding needed) for torch's symmetric pads ``ps``.
    SAME also covers a ceil_mode pool whose last window overhangs the end by SAME's
    trailing pad (SqueezeNet's 3x3/2 max pools): with no PADV2 in front, which XNNPACK
    does not delegate, the pool stays in the delegated graph."""
    if any(i is None for i in ins):
        # a dynamic size: only the modes that place the windows as torch does at every size (a caller's
        # support predicate has refused ceil_mode); None asks for an explicit PAD before a VALID op
        if all(p == 0 for p in ps):
            return VALID
        if all(s == 1 and 2 * p == d * (k - 1) for k, s, p, d in zip(ks, ss, ps, ds)):
            return SAME
        return None
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


def spatial(x: Val):
    return list(x.shape[2:])


def _conv_support(n):
    x = n.args[0].meta["val"]
    transposed, groups = n.args[6], n.args[8]
    if x.dim() not in (3, 4):
        return False
    if transposed:
        if any(not isinstance(d, int) for d in x.shape[2:]):
            return False
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
        xd = lw.dims(x)
        x4 = lw.reshape(x, [xd[0], xd[1], 1, xd[2]])
        w4 = lw.reshape(w, [w.shape[0], w.shape[1], 1, w.shape[2]])
        out4 = (out[0], out[1], 1, out[2])
        if transposed:
            y = _conv_transpose2d(lw, x4, w4, b, [1, stride[0]], [0, padding[0]], groups, out4)
        else:
            y = _conv2d(lw, x4, w4, b, [1, stride[0]], [0, padding[0]], [1, dilation[0]], groups, out4)
        return lw.reshape(y, out if None not in out else lw.out_dims)
    if transposed:
        return _conv_transpose2d(lw, x, w, b, stride, padding, groups, lw.out_shape)
    return _conv2d(lw, x, w, b, stride, padding, dilation, groups, lw.out_shape)


def _conv2d(lw, x, w, b, stride, padding, dilation, groups, out_shape):
    o, cin = w.shape[0], x.shape[1]
    ks = list(w.shape[2:])
    mode = pad_mode(spatial(x), ks, stride, padding, dilation, out_shape[2:])
    if mode is None:
        pads = [[0, 0], [0, 0]] + [[p, p] for p in padding]
        shape = tuple(x.shape[:2]) + tuple(None if s is None else s + 2 * p for s, p in zip(x.shape[2:], padding))
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
    ins_hw = spatial(x)
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
