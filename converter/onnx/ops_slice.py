"""ONNX Slice, Split and Pad (starts/ends/axes/steps, split sizes and pads known when the model is built)."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from .common import NoFold, axis_of, ints, pad_or_crop
from .registry import TABLE as T

__all__: list[str] = []


def _clamp(v, lo, hi):
    return lo if v < lo else hi if v > hi else v


def _slices(ctx, shape, starts, ends, axes, steps):
    starts, ends = ints(ctx, starts, "starts"), ints(ctx, ends, "ends")
    axes = ints(ctx, axes, "axes") if axes is not None else list(range(len(starts)))
    steps = ints(ctx, steps, "steps") if steps is not None else [1] * len(starts)
    if not len(starts) == len(ends) == len(axes) == len(steps):
        ctx.fail("starts, ends, axes and steps differ in length")
    out = []
    for s, e, a, st in zip(starts, ends, axes, steps):
        a = axis_of(ctx, a, len(shape))
        n = shape[a]
        if st == 0:
            ctx.fail("a step of 0")
        s = s + n if s < 0 else s
        e = e + n if e < 0 else e
        if st > 0:
            s, e = _clamp(s, 0, n), _clamp(e, 0, n)
        else:
            s, e = _clamp(s, 0, n - 1), _clamp(e, -1, n - 1)
        out.append((a, s, e, st))
    return out


def _slice_fold(ctx, x, starts, ends, axes=None, steps=None):
    idx = [slice(None)] * x.ndim
    for a, s, e, st in _slices(ctx, x.shape, starts, ends, axes, steps):
        if isinstance(s, torch.SymInt) or isinstance(e, torch.SymInt):
            raise NoFold()  # a slice as long as a dynamic dim (position ids [:seq]): numpy would pin its size
        idx[a] = slice(s, e if e >= 0 else None, st)
    return x[tuple(idx)]


def _known(cond) -> bool:
    """True only when ``cond`` holds for every value of the dynamic dims in it (no guard is added)."""
    from .._torch_compat import statically_known_true

    return statically_known_true(cond)


# ai.onnx::Slice(data, starts, ends, axes?, steps?) -> output
@T.op("Slice", since=13, static=(1, 2, 3, 4), fold=_slice_fold)
def slice_(ctx, x, starts, ends, axes=None, steps=None):
    for a, s, e, st in _slices(ctx, list(x.shape), starts, ends, axes, steps):
        n = x.shape[a]
        if st > 0:
            if _known(s == 0) and _known(e == n) and st == 1:
                continue
            if st == 1:
                x = x.narrow(a, s, e - s if _known(e >= s) else torch.sym_max(e - s, 0))
            else:
                x = x[(slice(None),) * a + (slice(s, e, st),)]
        else:
            count = max(0, -(-(s - e) // -st))
            x = x.flip(a)[(slice(None),) * a + (slice(n - 1 - s, None, -st),)].narrow(a, 0, count)
    return x


def _split_sizes(ctx, n, split, num_outputs, n_out):
    if split is not None and len(np.asarray(split).reshape(-1)):
        sizes = ints(ctx, split, "split")
    else:
        k = num_outputs or n_out
        chunk = -(-n // k)
        sizes = [chunk] * (k - 1) + [n - chunk * (k - 1)]
    if len(sizes) != n_out:
        ctx.fail(f"split gives {len(sizes)} parts for {n_out} outputs")
    return sizes


# ai.onnx::Split(input, split?) -> outputs...  attrs: axis, num_outputs (opset 18)
@T.op("Split", since=13, attrs={"axis": 0, "num_outputs": None}, static=(1,))
def split(ctx, x, split=None, *, axis, num_outputs):
    a = axis_of(ctx, axis, x.dim())
    return list(torch.split(x, _split_sizes(ctx, x.shape[a], split, num_outputs, ctx.n_out), a))


_PAD_MODES = {"constant": "constant", "reflect": "reflect", "edge": "replicate", "wrap": "circular"}


# ai.onnx::Pad(data, pads, constant_value?, axes?) -> output  attrs: mode (constant | reflect | edge | wrap)
@T.op("Pad", since=13, attrs={"mode": "constant"}, static=(1, 3), maybe_static=(2,))
def pad(ctx, x, pads, value=None, axes=None, *, mode):
    if mode not in _PAD_MODES:
        ctx.fail(f"mode={mode!r}; ONNX defines {', '.join(_PAD_MODES)}")
    pads = ints(ctx, pads, "pads")
    rank = x.dim()
    axes = [axis_of(ctx, a, rank) for a in ints(ctx, axes, "axes")] if axes is not None else list(range(rank))
    if len(pads) != 2 * len(axes):
        ctx.fail(f"pads has {len(pads)} values for {len(axes)} axes")
    begin, end = [0] * rank, [0] * rank
    for i, a in enumerate(axes):
        begin[a], end[a] = pads[i], pads[i + len(axes)]
    last = max([i for i in range(rank) if begin[i] or end[i]], default=-1)
    if last < 0:
        return x
    first = min(i for i in range(rank) if begin[i] or end[i])
    fpad = [v for i in range(rank - 1, first - 1, -1) for v in (begin[i], end[i])]
    if mode == "constant":
        if isinstance(value, torch.Tensor):
            ctx.fail("constant_value is computed at run time; the importer needs it known when the model is built")
        v = float(np.asarray(value).reshape(-1)[0]) if value is not None and np.asarray(value).size else 0.0
        return pad_or_crop(x, begin, end, v)
    if rank - first > 3:
        ctx.fail(f"mode={mode!r} pads at most the last 3 dims of the input; pads {pads} pad {rank - first}")
    # torch's non-constant pads want (N, C, spatial...): fold every unpadded leading dim into one "channel"
    lead = list(x.shape[:first])
    y = F.pad(x.reshape([1, -1] + list(x.shape[first:])), fpad, mode=_PAD_MODES[mode])
    return y.reshape(lead + list(y.shape[2:]))
