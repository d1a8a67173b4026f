"""ONNX shape ops: Shape, Size, Reshape, Flatten, Transpose, Squeeze/Unsqueeze, Concat, Expand, Tile,
DepthToSpace/SpaceToDepth. Each has a numpy fold for when its inputs are known (shape arithmetic)."""

from __future__ import annotations

import math

import numpy as np
import torch

from .common import axis_of, ints, static_dims
from .registry import TABLE as T

__all__: list[str] = []


def _shape_array(dims) -> np.ndarray:
    vals = list(dims)
    if all(isinstance(v, (int, np.integer)) for v in vals):
        return np.asarray(vals, dtype=np.int64)
    out = np.empty(len(vals), dtype=object)
    out[:] = vals
    return out


def _shape_slice(n, start, end):
    start = min(max(start + n if start < 0 else start, 0), n)
    end = n if end is None else min(max(end + n if end < 0 else end, 0), n)
    return start, end


def _shape_fold(ctx, x, *, start, end):
    dims = x.shape
    s, e = _shape_slice(len(dims), start, end)
    return _shape_array(dims[s:e])


# ai.onnx::Shape(data) -> shape (int64)  attrs: start, end (opset 15)
@T.op("Shape", since=13, attrs={"start": 0, "end": None}, fold=_shape_fold)
def shape(ctx, x, *, start, end):
    return _shape_fold(ctx, x, start=start, end=end)


# ai.onnx::Size(data) -> size (int64 scalar)
@T.op("Size", since=13, fold=lambda ctx, x: np.asarray(x.size, dtype=np.int64))
def size(ctx, x):
    n = x.numel()
    return np.asarray(n, dtype=np.int64) if isinstance(n, int) else _shape_array([n]).reshape(())


def _target(ctx, x_shape, shape, allowzero):
    out = []
    for i, s in enumerate(shape):
        if isinstance(s, int) and s == 0 and not allowzero:
            if i >= len(x_shape):
                ctx.fail(f"shape has a 0 at dim {i}, beyond the input's rank {len(x_shape)}")
            s = x_shape[i]
        out.append(s)
    return out


def _reshape_fold(ctx, x, shape, *, allowzero):
    return np.reshape(x, static_dims(_target(ctx, x.shape, ints(ctx, shape, "shape"), allowzero)))


# ai.onnx::Reshape(data, shape) -> reshaped  attrs: allowzero (opset 14)
@T.op("Reshape", since=13, attrs={"allowzero": 0}, static=(1,), fold=_reshape_fold)
def reshape(ctx, x, shape, *, allowzero):
    target = _target(ctx, list(x.shape), ints(ctx, shape, "shape"), allowzero)
    if any(isinstance(d, torch.SymInt) for d in list(x.shape) + target) and any(
            isinstance(d, int) and d == -1 for d in target):
        # the -1 from the sizes: torch would infer it through sym_numel, which neither backend lowers
        known = math.prod(d for d in target if not (isinstance(d, int) and d == -1))
        target = [math.prod(x.shape) // known if isinstance(d, int) and d == -1 else d for d in target]
    return x.reshape(target)


def _flat_shape(ctx, shape, axis):
    a = axis_of(ctx, axis, len(shape) + 1) if axis != len(shape) else axis
    return [math.prod(shape[:a]), math.prod(shape[a:])]


# ai.onnx::Flatten(input) -> output  attrs: axis
@T.op("Flatten", since=13, attrs={"axis": 1}, fold=lambda ctx, x, axis: np.reshape(x, _flat_shape(ctx, x.shape, axis)))
def flatten(ctx, x, *, axis):
    return x.reshape(_flat_shape(ctx, list(x.shape), axis))


def _perm(ctx, rank, perm):
    perm = list(perm) if perm is not None else list(range(rank))[::-1]
    if sorted(perm) != list(range(rank)):
        ctx.fail(f"perm {perm} is not a permutation of {rank} dims")
    return perm


# ai.onnx::Transpose(data) -> transposed  attrs: perm
@T.op("Transpose", since=13, attrs={"perm": None},
      fold=lambda ctx, x, perm: np.transpose(x, _perm(ctx, x.ndim, perm)))
def transpose(ctx, x, *, perm):
    return x.permute(_perm(ctx, x.dim(), perm))


def _squeeze_axes(ctx, shape, axes):
    if axes is None or len(np.asarray(axes).reshape(-1)) == 0:
        return [i for i, s in enumerate(shape) if isinstance(s, int) and s == 1]
    return sorted(axis_of(ctx, a, len(shape)) for a in ints(ctx, axes, "axes"))


def _squeeze_fold(ctx, x, axes=None):
    return np.squeeze(x, tuple(_squeeze_axes(ctx, x.shape, axes))) if x.ndim else x


# ai.onnx::Squeeze(data, axes?) -> squeezed
@T.op("Squeeze", since=13, static=(1,), fold=_squeeze_fold)
def squeeze(ctx, x, axes=None):
    dims = _squeeze_axes(ctx, list(x.shape), axes)
    return x.squeeze(dims) if dims else x


def _unsqueeze_shape(ctx, shape, axes):
    rank = len(shape) + len(axes)
    axes = sorted(axis_of(ctx, a, rank) for a in axes)
    out, it = [], iter(shape)
    for i in range(rank):
        out.append(1 if i in axes else next(it))
    return out


# ai.onnx::Unsqueeze(data, axes) -> expanded
@T.op("Unsqueeze", since=13, static=(1,),
      fold=lambda ctx, x, axes: np.reshape(x, _unsqueeze_shape(ctx, x.shape, ints(ctx, axes, "axes"))))
def unsqueeze(ctx, x, axes):
    return x.reshape(_unsqueeze_shape(ctx, list(x.shape), ints(ctx, axes, "axes")))


def _concat_fold(ctx, *xs, axis):
    xs = [np.asarray(x) for x in xs if x is not None]
    if any(x.dtype == object for x in xs):
        xs = [x.astype(object) for x in xs]
    return np.concatenate(xs, axis=axis_of(ctx, axis, xs[0].ndim))


# ai.onnx::Concat(inputs...) -> concat_result  attrs: axis
@T.op("Concat", since=13, attrs={"axis": 0}, fold=_concat_fold)
def concat(ctx, *xs, axis):
    xs = [x for x in xs if x is not None]
    return torch.cat(xs, axis_of(ctx, axis, xs[0].dim()))


def _broadcast(ctx, a, b):
    a, b = list(a), list(b)
    n = max(len(a), len(b))
    a, b = [1] * (n - len(a)) + a, [1] * (n - len(b)) + b
    out = []
    for x, y in zip(a, b):
        if isinstance(y, int) and y == 1:
            out.append(x)
        elif isinstance(x, int) and x == 1:
            out.append(y)
        else:
            out.append(y)
    return out


def _expand_fold(ctx, x, shape):
    return np.broadcast_to(x, static_dims(_broadcast(ctx, x.shape, ints(ctx, shape, "shape")))).copy()


# ai.onnx::Expand(input, shape) -> output  (bidirectional broadcast)
@T.op("Expand", since=13, static=(1,), fold=_expand_fold)
def expand(ctx, x, shape):
    target = _broadcast(ctx, list(x.shape), ints(ctx, shape, "shape"))
    return x.reshape([1] * (len(target) - x.dim()) + list(x.shape)).expand(target)


# ai.onnx::Tile(input, repeats) -> output
@T.op("Tile", since=13, static=(1,), fold=lambda ctx, x, r: np.tile(x, static_dims(ints(ctx, r, "repeats"))))
def tile(ctx, x, repeats):
    return x.repeat(ints(ctx, repeats, "repeats"))


# ai.onnx::DepthToSpace(input) -> output  attrs: blocksize, mode (DCR | CRD)
@T.op("DepthToSpace", since=13, attrs={"blocksize": 0, "mode": "DCR"})
def depth_to_space(ctx, x, *, blocksize, mode):
    b = blocksize
    n, c, h, w = x.shape
    if mode == "CRD":
        return torch.pixel_shuffle(x, b)
    if mode != "DCR":
        ctx.fail(f"mode={mode!r}; ONNX defines DCR and CRD")
    y = x.reshape(n, b, b, c // (b * b), h, w).permute(0, 3, 4, 1, 5, 2)
    return y.reshape(n, c // (b * b), h * b, w * b)


# ai.onnx::SpaceToDepth(input) -> output  attrs: blocksize
@T.op("SpaceToDepth", since=13, attrs={"blocksize": 0})
def space_to_depth(ctx, x, *, blocksize):
    b = blocksize
    n, c, h, w = x.shape
    y = x.reshape(n, c, h // b, b, w // b, b).permute(0, 3, 5, 1, 2, 4)
    return y.reshape(n, c * b * b, h // b, w // b)


