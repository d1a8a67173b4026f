"""Pooling, channel-last (NHWC), padded like the convolutions. 3-D pooling without a 3-D
pooling builtin: two 2-D pools. The input, laid out [N, D, H, W, C], pools H and W as a batch of
N*D images, then pools D as the height of [N, D, Ho*Wo, C] images (filter kd x 1); unpadded
windows only (padding 0, no ceil_mode).
"""

from __future__ import annotations

import numpy as np
import torch

from tpu_export.converter.registry import arguments

from ..converter import layout as L
from .helpers import NHWC, binary
from .ops_conv import SAME, VALID, pad_mode, spatial
from .ops_nn import fully_connected
from .ops_slice import pad_value
from .registry import lowering, supported_if
from .values import Val

__all__ = []

aten = torch.ops.aten


def _pool_args(kernel_size, stride, padding):
    ks = list(kernel_size) * (2 // len(kernel_size))
    ss = list(stride) * (2 // len(stride)) if stride else ks
    ps = list(padding) * (2 // len(padding)) if isinstance(padding, (list, tuple)) else [padding] * 2
    return ks, ss, ps


def _pool(lw, op, x, ks, ss, mode, out):
    opts = lw.options("Pool2D", padding=mode, strideH=ss[0], strideW=ss[1], filterHeight=ks[0], filterWidth=ks[1],
                      fusedActivationFunction=0)
    return lw.op(op, [lw.tensor(x, NHWC)], out, x.dtype, NHWC, opts, fusable=True)


def _reachable(ks, sizes, ps):
    """The window each static dim needs: a kernel longer than the padded input (EfficientNet's final
    ``AvgPool2d(hidden_dim, ceil_mode=True)``, 2560 over a 19x19 map) reads no more than that input, torch
    clipping its window there. Padding out to the full kernel wrote a [1, 2560, 2560, 2560] PAD."""
    return [k if i is None else min(k, i + 2 * p) for k, i, p in zip(ks, sizes, ps)]


def _indices_unused(n):
    return all(u.args[1] == 0 or not u.users for u in n.users)


def _maxpool_support(n):
    dil = arguments(n)["dilation"]
    x = n.args[0].meta["val"]
    return _indices_unused(n) and all(d == 1 for d in dil) and x.dim() == 4 and \
        (all(isinstance(d, int) for d in x.shape[2:]) or not arguments(n)["ceil_mode"])


# max_pool2d_with_indices(Tensor self, int[2] kernel_size, int[2] stride=[], int[2] padding=0,
#                         int[2] dilation=1, bool ceil_mode=False) -> (Tensor, Tensor)
@lowering(aten.max_pool2d_with_indices.default)
@supported_if(_maxpool_support)
def max_pool2d(lw, x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    ks, ss, ps = _pool_args(kernel_size, stride, padding)
    ks = _reachable(ks, x.shape[2:], ps)
    out = lw.out_shape
    mode = pad_mode(spatial(x), ks, ss, ps, [1, 1], out[2:])
    if mode is None:
        # pad with -inf (never the max), including what ceil_mode's last window reaches past.
        # Not zeros after a ReLU: XNNPACK would take that PAD, and its pad kernel (unless
        # fused into a following conv) measured ~8x slower than the builtin PADV2 here
        # (a dynamic size, no ceil_mode: torch's own pads, the last window ends inside them)
        ends = [p if o is None or i is None else (o - 1) * s + k - (i + p)
                for o, s, k, i, p in zip(out[2:], ss, ks, x.shape[2:], ps)]
        pads = [[0, 0], [0, 0]] + [[p, max(e, 0)] for p, e in zip(ps, ends)]
        shape = tuple(x.shape[:2]) + tuple(None if i is None else i + a + b for i, (a, b) in zip(x.shape[2:], pads[2:]))
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
    if x.dim() == 4 and not all(isinstance(d, int) for d in x.shape[2:]):  # dynamic: unpadded windows only
        a = arguments(n)
        return all(p == 0 for p in _pool_args(a["kernel_size"], a["stride"], a["padding"])[2]) and \
            not a["ceil_mode"] and a["divisor_override"] is None
    return x.dim() == 4


# avg_pool2d(Tensor self, int[2] kernel_size, int[2] stride=[], int[2] padding=0, bool ceil_mode=False,
#            bool count_include_pad=True, int? divisor_override=None) -> Tensor
@lowering(aten.avg_pool2d.default)
@supported_if(_avgpool_support)
def avg_pool2d(lw, x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    ks, ss, ps = _pool_args(kernel_size, stride, padding)
    reach = _reachable(ks, x.shape[2:], ps)
    out = lw.out_shape
    mode = pad_mode(spatial(x), reach, ss, ps, [1, 1], out[2:])
    if divisor_override is None and (mode == VALID or (mode == SAME and not count_include_pad)):
        return _pool(lw, "AVERAGE_POOL_2D", x, reach, ss, mode, out)
    ends = [(o - 1) * s + k - (i + p) for o, s, k, i, p in zip(out[2:], ss, reach, x.shape[2:], ps)]
    pads = [[0, 0], [0, 0]] + [[p, max(e, 0)] for p, e in zip(ps, ends)]
    if any(a or b for a, b in pads):
        shape = tuple(x.shape[:2]) + tuple(i + a + b for i, (a, b) in zip(x.shape[2:], pads[2:]))
        x0 = x
        x = pad_value(lw, x, pads, 0.0, shape=shape, perm=NHWC)
    else:
        x0 = x
    y = _pool(lw, "AVERAGE_POOL_2D", x, reach, ss, VALID, out)
    # VALID divided every window by its k*k; torch divides by the count it defines (or the override)
    if divisor_override is not None:
        factor = np.full((out[2], out[3]), reach[0] * reach[1] / divisor_override)
    else:
        ch = _avg_counts(x0.shape[2], ks[0], ss[0], ps[0], out[2], count_include_pad)
        cw = _avg_counts(x0.shape[3], ks[1], ss[1], ps[1], out[3], count_include_pad)
        factor = reach[0] * reach[1] / np.outer(ch, cw)
    if np.allclose(factor, 1.0):
        return y
    return binary(lw, "MUL", y, lw.const(factor.astype(x.dtype)[None, None]), kind="Mul", shape=out)


def _adaptive_support(n):
    x = n.args[0].meta["val"]
    oh, ow = n.args[1]
    if x.dim() != 4:
        return False
    if not all(isinstance(d, int) for d in x.shape[2:]):
        return (oh, ow) == (1, 1)  # a global mean at any size
    if (oh, ow) == (1, 1) or (x.shape[2] % oh == 0 and x.shape[3] % ow == 0):
        return True
    return x.dtype.is_floating_point  # windows of uneven sizes: constant averaging matrices (below)


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
    if x.shape[2] % oh == 0 and x.shape[3] % ow == 0:
        ks = [x.shape[2] // oh, x.shape[3] // ow]
        return _pool(lw, "AVERAGE_POOL_2D", x, ks, ks, VALID, out)
    # an output size that does not divide the input's (CSATv2's 7x7 of a 32x32 map): windows of uneven
    # sizes, overlapping, no pooling builtin takes them. Averaging is linear and separable: a FULLY_CONNECTED
    # with a constant [out, in] matrix of 1/window-size entries over W, then over H (the two dims swapped by
    # relabeling the layout, as permute does), exact up to float summation order.
    y = fully_connected(lw, x, lw.const(_averaging_matrix(x.shape[3], ow, x.dtype)), None)
    y = fully_connected(lw, _swap_hw(y), lw.const(_averaging_matrix(x.shape[2], oh, x.dtype)), None)
    return _swap_hw(y)


def _averaging_matrix(n: int, m: int, dtype) -> np.ndarray:
    """[m, n]: row i averages torch's adaptive window i, [floor(i*n/m), ceil((i+1)*n/m))."""
    a = np.zeros((m, n), np.float64)
    for i in range(m):
        lo, hi = (i * n) // m, -(-((i + 1) * n) // m)
        a[i, lo:hi] = 1.0 / (hi - lo)
    return a.astype(dtype)


def _swap_hw(v: Val) -> Val:
    """v [N, C, A, B] viewed as [N, C, B, A]: the same tensor, its layout relabeled."""
    swap = {2: 3, 3: 2}
    shape = (v.shape[0], v.shape[1], v.shape[3], v.shape[2])
    return Val(shape, v.dtype, tuple(swap.get(p, p) for p in v.perm), tensor=v.tensor)


def _triple(v, default):
    v = default if v is None or (isinstance(v, (list, tuple)) and len(v) == 0) else v
    return list(v) * (3 // len(v)) if isinstance(v, (list, tuple)) else [v] * 3


def _static5(n):
    x = n.args[0].meta["val"]
    return x.dim() == 5 and all(isinstance(d, int) for d in x.shape)


def _pool3d(lw, op, x: Val, ks, ss, out_shape) -> Val:
    n, c, d, h, w = x.shape
    _, _, do, ho, wo = out_shape
    cl = L.channel_last(5)

    def pool(t, in_shape, k, s, shape):
        t = lw.op("RESHAPE", [t, lw.const_tensor(list(in_shape), np.int32)], in_shape, x.dtype, suffix="pool_in")
        opts = lw.options("Pool2D", padding=VALID, strideH=s[0], strideW=s[1], filterHeight=k[0], filterWidth=k[1],
                          fusedActivationFunction=0)
        return lw.op(op, [t.tensor], shape, x.dtype, opts=opts, suffix="pool")

    hw = pool(lw.tensor(x, cl), (n * d, h, w, c), ks[1:], ss[1:], (n * d, ho, wo, c))
    dd = pool(hw.tensor, (n, d, ho * wo, c), (ks[0], 1), (ss[0], 1), (n, do, ho * wo, c))
    t = lw.op("RESHAPE", [dd.tensor, lw.const_tensor([n, do, ho, wo, c], np.int32)], (n, do, ho, wo, c), x.dtype)
    return Val(tuple(out_shape), x.dtype, cl, tensor=t.tensor)


def _unpadded(n) -> bool:
    a = arguments(n)
    return _static5(n) and all(p == 0 for p in _triple(a["padding"], 0)) and not a["ceil_mode"]


# avg_pool3d(Tensor self, int[3] kernel_size, int[3] stride=[], int[3] padding=0, bool ceil_mode=False,
#            bool count_include_pad=True, int? divisor_override=None) -> Tensor
@lowering(aten.avg_pool3d.default)
@supported_if(lambda n: _unpadded(n) and arguments(n)["divisor_override"] is None)
def avg_pool3d(lw, x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    ks = _triple(kernel_size, None)
    return _pool3d(lw, "AVERAGE_POOL_2D", x, ks, _triple(stride, ks), lw.out_shape)


# max_pool3d_with_indices(Tensor self, int[3] kernel_size, int[3] stride=[], int[3] padding=0,
#                         int[3] dilation=1, bool ceil_mode=False) -> (Tensor, Tensor)   (indices unused)
@lowering(aten.max_pool3d_with_indices.default)
@supported_if(lambda n: _unpadded(n) and all(d == 1 for d in _triple(arguments(n)["dilation"], 1))
              and all(u.args[1] == 0 or not u.users for u in n.users))
def max_pool3d(lw, x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    ks = _triple(kernel_size, None)
    return _pool3d(lw, "MAX_POOL_2D", x, ks, _triple(stride, ks), lw.out_shape), None


# _adaptive_avg_pool3d(Tensor self, SymInt[3] output_size) -> Tensor: output sizes dividing the input's
@lowering(aten._adaptive_avg_pool3d.default)
@supported_if(lambda n: _static5(n) and all(i % o == 0 for i, o in zip(n.args[0].meta["val"].shape[2:], n.args[1])))
def adaptive_avg_pool3d(lw, x, output_size):
    ks = [i // o for i, o in zip(x.shape[2:], output_size)]
    return _pool3d(lw, "AVERAGE_POOL_2D", x, ks, ks, lw.out_shape)
