"""3-D pooling without a 3-D pooling builtin: two 2-D pools. The input, laid out
[N, D, H, W, C], pools H and W as a batch of N*D images, then pools D as the height of
[N, D, Ho*Wo, C] images (filter kd x 1). Unpadded windows only (padding 0, no ceil_mode)."""

from __future__ import annotations

import numpy as np
import torch

from converter.registry import arguments

from . import layout as L
from .registry import lowering, supported_if
from .values import Val

__all__ = []

aten = torch.ops.aten
_VALID = 1  # Padding enum


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
        opts = lw.options("Pool2D", padding=_VALID, strideH=s[0], strideW=s[1], filterHeight=k[0], filterWidth=k[1],
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
