"""ONNX pooling: MaxPool, AveragePool (every auto_pad mode), GlobalAveragePool, GlobalMaxPool."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .ops_conv import same_pads, split_pads
from .registry import TABLE as T

__all__: list[str] = []

_POOL_ATTRS = {"auto_pad": "NOTSET", "ceil_mode": 0, "dilations": None, "kernel_shape": None, "pads": None,
               "strides": None}
_MAX = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}
_AVG = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}


def _geometry(ctx, x, auto_pad, kernel_shape, pads, strides, dilations):
    nsp = x.dim() - 2
    if nsp not in _MAX:
        ctx.fail(f"{nsp}-D pooling is not supported (1-D, 2-D and 3-D are)")
    if kernel_shape is None or len(kernel_shape) != nsp:
        ctx.fail(f"kernel_shape must have {nsp} values")
    strides = list(strides or [1] * nsp)
    dilations = list(dilations or [1] * nsp)
    if auto_pad == "VALID":
        pads = [0] * (2 * nsp)
    elif auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        pads = same_pads(list(x.shape[2:]), kernel_shape, strides, dilations, auto_pad == "SAME_UPPER")
    elif auto_pad == "NOTSET":
        pads = list(pads or [0] * (2 * nsp))
    else:
        ctx.fail(f"auto_pad={auto_pad!r}; ONNX defines NOTSET, VALID, SAME_UPPER, SAME_LOWER")
    sym, fpad = split_pads(pads, nsp)
    if sym is not None and any(2 * p > k for p, k in zip(sym, kernel_shape)):
        fpad = [v for p in reversed(sym) for v in (p, p)]  # torch takes pads up to k/2: pad explicitly
        sym = None
    return nsp, list(kernel_shape), strides, dilations, sym, fpad


# ai.onnx::MaxPool(X) -> Y, Indices?  attrs: auto_pad, ceil_mode, dilations, kernel_shape, pads, storage_order,
#   strides
@T.op("MaxPool", since=12, attrs={**_POOL_ATTRS, "storage_order": 0})
def max_pool(ctx, x, *, auto_pad, ceil_mode, dilations, kernel_shape, pads, storage_order, strides):
    if ctx.n_out > 1:
        ctx.fail("the Indices output is not supported")
    nsp, k, s, d, sym, fpad = _geometry(ctx, x, auto_pad, kernel_shape, pads, strides, dilations)
    if fpad is not None:
        x, sym = F.pad(x, fpad, value=float("-inf")), [0] * nsp
    return _MAX[nsp](x, k, s, sym, d, ceil_mode=bool(ceil_mode))


# ai.onnx::AveragePool(X) -> Y  attrs: auto_pad, ceil_mode, count_include_pad, dilations, kernel_shape, pads,
#   strides
@T.op("AveragePool", since=11, attrs={**_POOL_ATTRS, "count_include_pad": 0})
def avg_pool(ctx, x, *, auto_pad, ceil_mode, count_include_pad, dilations, kernel_shape, pads, strides):
    nsp, k, s, d, sym, fpad = _geometry(ctx, x, auto_pad, kernel_shape, pads, strides, dilations)
    if any(v != 1 for v in d):
        ctx.fail("dilations other than 1 are not supported for AveragePool")
    # ONNX's SAME_* pads never count toward the average
    include = bool(count_include_pad) and auto_pad not in ("SAME_UPPER", "SAME_LOWER")
    if fpad is None:
        return _AVG[nsp](x, k, s, sym, bool(ceil_mode), include)
    y = _AVG[nsp](F.pad(x, fpad), k, s, 0, bool(ceil_mode), True)
    if include:
        return y
    ones = F.pad(torch.ones_like(x[:1, :1]), fpad)
    return y / _AVG[nsp](ones, k, s, 0, bool(ceil_mode), True)


# ai.onnx::GlobalAveragePool(X) -> Y / GlobalMaxPool(X) -> Y
T.op("GlobalAveragePool", since=1)(lambda ctx, x: x.mean(list(range(2, x.dim())), keepdim=True))
T.op("GlobalMaxPool", since=1)(lambda ctx, x: x.amax(list(range(2, x.dim())), keepdim=True))
