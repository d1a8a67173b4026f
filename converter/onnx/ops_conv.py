"""ONNX Conv and ConvTranspose, with every auto_pad mode (SAME_* pads come from the static input sizes)."""

from __future__ import annotations

import torch.nn.functional as F

from .common import pad_or_crop
from .registry import TABLE as T

__all__ = ["same_pads", "split_pads"]

_AUTO_PAD = ("NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER")
_CONV_ATTRS = {"auto_pad": "NOTSET", "dilations": None, "group": 1, "kernel_shape": None, "pads": None,
               "strides": None}


def same_pads(sizes, kernel, strides, dilations, upper: bool) -> list:
    """ONNX SAME_UPPER / SAME_LOWER pads [begin..., end...]: output = ceil(in / stride)."""
    begin, end = [], []
    for n, k, s, d in zip(sizes, kernel, strides, dilations):
        out = -(-n // s)
        total = max((out - 1) * s + (k - 1) * d + 1 - n, 0)
        small, big = total // 2, total - total // 2
        begin.append(small if upper else big)
        end.append(big if upper else small)
    return begin + end


def split_pads(pads, nsp):
    """(symmetric padding per dim or None, F.pad list for the asymmetric case)."""
    begin, end = list(pads[:nsp]), list(pads[nsp:])
    if begin == end:
        return begin, None
    fpad = []
    for b, e in reversed(list(zip(begin, end))):
        fpad += [b, e]
    return None, fpad


def _geometry(ctx, x, w, auto_pad, dilations, kernel_shape, pads, strides, transpose=False):
    nsp = x.dim() - 2
    if auto_pad not in _AUTO_PAD:
        ctx.fail(f"auto_pad={auto_pad!r}; ONNX defines {', '.join(_AUTO_PAD)}")
    kernel = list(kernel_shape or w.shape[2:])
    strides = list(strides or [1] * nsp)
    dilations = list(dilations or [1] * nsp)
    if len(kernel) != nsp or len(strides) != nsp or len(dilations) != nsp:
        ctx.fail(f"kernel_shape/strides/dilations must have {nsp} values for a rank-{x.dim()} input")
    if auto_pad == "VALID":
        pads = [0] * (2 * nsp)
    elif auto_pad.startswith("SAME") and not transpose:
        pads = same_pads(list(x.shape[2:]), kernel, strides, dilations, auto_pad == "SAME_UPPER")
    else:
        pads = list(pads or [0] * (2 * nsp))
    if len(pads) != 2 * nsp:
        ctx.fail(f"pads has {len(pads)} values; a rank-{x.dim()} input needs {2 * nsp}")
    return nsp, kernel, strides, dilations, pads


_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
_CONV_T = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}


# ai.onnx::Conv(X, W, B?) -> Y  attrs: auto_pad, dilations, group, kernel_shape, pads, strides
@T.op("Conv", since=11, attrs=_CONV_ATTRS)
def conv(ctx, x, w, b=None, *, auto_pad, dilations, group, kernel_shape, pads, strides):
    nsp, _, strides, dilations, pads = _geometry(ctx, x, w, auto_pad, dilations, kernel_shape, pads, strides)
    if nsp not in _CONV:
        ctx.fail(f"{nsp}-D convolution is not supported (1-D, 2-D and 3-D are)")
    sym, fpad = split_pads(pads, nsp)
    if fpad is not None:
        x, sym = F.pad(x, fpad), [0] * nsp  # asymmetric pads: an explicit zero pad, then a VALID conv
    return _CONV[nsp](x, w, b, strides, sym, dilations, group)


# ai.onnx::ConvTranspose(X, W, B?) -> Y  attrs: auto_pad, dilations, group, kernel_shape, output_padding,
#   output_shape, pads, strides
@T.op("ConvTranspose", since=11, attrs={**_CONV_ATTRS, "output_padding": None, "output_shape": None})
def conv_transpose(ctx, x, w, b=None, *, auto_pad, dilations, group, kernel_shape, pads, strides, output_padding,
                   output_shape):
    nsp, kernel, strides, dilations, pads = _geometry(ctx, x, w, auto_pad, dilations, kernel_shape, pads, strides,
                                                      transpose=True)
    if nsp not in _CONV_T:
        ctx.fail(f"{nsp}-D transposed convolution is not supported (1-D, 2-D and 3-D are)")
    opad = list(output_padding or [0] * nsp)
    sizes = list(x.shape[2:])
    full = [(n - 1) * s + (k - 1) * d + 1 for n, s, k, d in zip(sizes, strides, kernel, dilations)]
    if output_shape or auto_pad.startswith("SAME"):
        want = list(output_shape)[-nsp:] if output_shape else [n * s for n, s in zip(sizes, strides)]
        begin, end = [], []
        for f, o, wnt in zip(full, opad, want):
            total = f + o - wnt
            small, big = total // 2, total - total // 2
            upper = auto_pad == "SAME_UPPER"  # else (SAME_LOWER, output_shape alone): larger half first
            begin.append(small if upper else big)
            end.append(big if upper else small)
        pads = begin + end
    begin, end = pads[:nsp], pads[nsp:]
    if begin == end and all(o < max(s, d) for o, s, d in zip(opad, strides, dilations)):
        return _CONV_T[nsp](x, w, b, strides, begin, opad, group, dilations)
    # torch takes symmetric pads only: the full transposed conv, then crop (negative pad) / extend each side
    y = _CONV_T[nsp](x, w, None, strides, 0, 0, group, dilations)
    y = pad_or_crop(y, [0, 0] + [-bg for bg in begin], [0, 0] + [o - e for e, o in zip(end, opad)])
    return y if b is None else y + b.reshape([1, -1] + [1] * nsp)
