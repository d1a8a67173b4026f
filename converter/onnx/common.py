"""Helpers the ONNX op functions share: static ints, axes, dtypes, numpy folds of shape arithmetic."""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["ONNX_DTYPES", "ints", "axis_of", "onnx_dtype", "np_binary", "is_symbolic", "pad_or_crop", "NoFold",
           "static_dims"]


class NoFold(Exception):
    """Raised by a numpy fold that cannot fold these inputs (a result whose shape depends on a dynamic dim):
    the op's torch function runs instead."""


def static_dims(dims) -> list:
    """``dims`` as ints, or NoFold when one is a dynamic size: numpy would pin it to its sample value."""
    out = [d for d in dims]
    if any(isinstance(d, torch.SymInt) for d in out):
        raise NoFold()
    return out


# ONNX TensorProto element type -> torch dtype
ONNX_DTYPES = {1: torch.float32, 2: torch.uint8, 3: torch.int8, 5: torch.int16, 6: torch.int32, 7: torch.int64,
               9: torch.bool, 10: torch.float16, 11: torch.float64, 12: torch.uint32, 13: torch.uint64,
               16: torch.bfloat16}


def is_symbolic(a) -> bool:
    return isinstance(a, np.ndarray) and a.dtype == object


def ints(ctx, a, what: str = "input") -> list:
    """A static 1-D (or scalar) int array as a list of ints (SymInts stay SymInts)."""
    if a is None:
        return []
    if isinstance(a, torch.Tensor):
        ctx.fail(f"{what} is computed at run time; the importer needs it known when the model is built")
    arr = np.asarray(a)
    return [x if isinstance(x, torch.SymInt) else int(x) for x in arr.reshape(-1)]


def axis_of(ctx, axis: int, rank: int) -> int:
    if not -rank <= axis < max(rank, 1):
        ctx.fail(f"axis {axis} is out of range for a rank-{rank} input")
    return axis + rank if axis < 0 else axis


def onnx_dtype(ctx, elem_type: int) -> torch.dtype:
    if elem_type not in ONNX_DTYPES:
        ctx.fail(f"ONNX element type {elem_type} is not supported (float, int, uint8, bool and bfloat16 are)")
    return ONNX_DTYPES[elem_type]


def np_binary(op):
    """A numpy fold for a broadcasting binary op (shape arithmetic on ints or SymInts)."""

    def fold(ctx, a, b):
        r = op(np.asarray(a), np.asarray(b))
        if isinstance(r, np.ndarray) and r.dtype != object and np.asarray(a).dtype != object:
            want = np.result_type(np.asarray(a).dtype, np.asarray(b).dtype) if r.dtype != bool else bool
            return r.astype(want, copy=False)
        return r

    return fold


def pad_or_crop(x, begin, end, value: float = 0.0):
    """Pad (positive) or crop (negative) each dim of ``x`` by begin[i] / end[i]: crops as slices, pads as one
    constant pad of non-negative amounts (the edge backend's PAD takes no negative pads)."""
    import torch.nn.functional as F

    for d, (b, e) in enumerate(zip(begin, end)):
        if b < 0 or e < 0:
            lo, hi = max(-b, 0), max(-e, 0)
            x = x.narrow(d, lo, x.shape[d] - lo - hi)
    fpad = []
    last = max([d for d, (b, e) in enumerate(zip(begin, end)) if b > 0 or e > 0], default=-1)
    for d in range(last, -1, -1):
        fpad += [max(begin[d], 0), max(end[d], 0)]
    return F.pad(x, fpad, value=value) if fpad else x
