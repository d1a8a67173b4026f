"""ONNX indexing: Gather, GatherElements, GatherND, ScatterND, ScatterElements, Trilu, OneHot."""

from __future__ import annotations

import numpy as np
import torch

from .common import axis_of, ints
from .registry import TABLE as T

__all__: list[str] = []


def _norm(idx, n):
    if isinstance(idx, np.ndarray):
        return np.where(idx < 0, idx + n, idx) if idx.dtype != object else idx
    return torch.where(idx < 0, idx + n, idx)


def _gather_fold(ctx, x, idx, *, axis):
    a = axis_of(ctx, axis, x.ndim)
    return np.take(x, _norm(np.asarray(idx), x.shape[a]).astype(np.int64), axis=a)


# ai.onnx::Gather(data, indices) -> output  attrs: axis
@T.op("Gather", since=13, attrs={"axis": 0}, maybe_static=(1,), fold=_gather_fold)
def gather(ctx, x, idx, *, axis):
    a = axis_of(ctx, axis, x.dim())
    n = x.shape[a]
    out_shape = list(x.shape[:a]) + list(idx.shape) + list(x.shape[a + 1:])
    if isinstance(idx, np.ndarray):
        idx = _norm(idx.astype(np.int64), n)
        if idx.ndim == 0:
            return x.select(a, int(idx))
        idx = torch.from_numpy(np.ascontiguousarray(idx))
    else:
        idx = _norm(idx.to(torch.int64), n)
    if a == 0 and x.dim() == 2:
        return torch.nn.functional.embedding(idx, x)  # one GATHER / embedding lookup on both backends
    return torch.index_select(x, a, idx.reshape(-1)).reshape(out_shape)


# ai.onnx::GatherElements(data, indices) -> output  attrs: axis
@T.op("GatherElements", since=13, attrs={"axis": 0})
def gather_elements(ctx, x, idx, *, axis):
    a = axis_of(ctx, axis, x.dim())
    return torch.gather(x, a, _norm(idx.to(torch.int64), x.shape[a]))


def _nd_index(x, idx, batch_dims):
    k = idx.shape[-1]
    idx = _norm(idx.to(torch.int64), torch.tensor(list(x.shape[batch_dims:batch_dims + k]), dtype=torch.int64))
    return tuple(idx[..., i] for i in range(k)), k


# ai.onnx::GatherND(data, indices) -> output  attrs: batch_dims
@T.op("GatherND", since=13, attrs={"batch_dims": 0})
def gather_nd(ctx, x, idx, *, batch_dims):
    if batch_dims:
        ctx.fail("batch_dims other than 0 is not supported")
    parts, _ = _nd_index(x, idx, 0)
    return x[parts]


_SCATTER_REDUCE = {"add": "sum", "mul": "prod", "max": "amax", "min": "amin"}


# ai.onnx::ScatterND(data, indices, updates) -> output  attrs: reduction (none | add | mul | max | min)
@T.op("ScatterND", since=13, attrs={"reduction": "none"})
def scatter_nd(ctx, x, idx, upd, *, reduction):
    parts, _ = _nd_index(x, idx, 0)
    if reduction == "none":
        return torch.index_put(x, parts, upd)
    if reduction == "add":
        return torch.index_put(x, parts, upd, accumulate=True)
    ctx.fail(f"reduction={reduction!r} is not supported for ScatterND (none and add are)")


# ai.onnx::ScatterElements(data, indices, updates) -> output  attrs: axis, reduction
@T.op("ScatterElements", since=13, attrs={"axis": 0, "reduction": "none"})
def scatter_elements(ctx, x, idx, upd, *, axis, reduction):
    a = axis_of(ctx, axis, x.dim())
    idx = _norm(idx.to(torch.int64), x.shape[a])
    if reduction == "none":
        return torch.scatter(x, a, idx, upd)
    if reduction not in _SCATTER_REDUCE:
        ctx.fail(f"reduction={reduction!r}; ONNX defines none, add, mul, max, min")
    return torch.scatter_reduce(x, a, idx, upd, _SCATTER_REDUCE[reduction], include_self=True)


# ai.onnx::Trilu(input, k?) -> output  attrs: upper
@T.op("Trilu", since=14, attrs={"upper": 1}, static=(1,))
def trilu(ctx, x, k=None, *, upper):
    kk = ints(ctx, k, "k")[0] if k is not None else 0
    return torch.triu(x, kk) if upper else torch.tril(x, kk)


# ai.onnx::OneHot(indices, depth, values) -> output  attrs: axis
@T.op("OneHot", since=11, attrs={"axis": -1}, static=(1,), maybe_static=(2,))
def one_hot(ctx, idx, depth, values, *, axis):
    d = ints(ctx, depth, "depth")[0]
    idx = _norm(idx.to(torch.int64), d)
    hot = torch.nn.functional.one_hot(idx, d)
    a = axis_of(ctx, axis, idx.dim() + 1)
    hot = hot.movedim(-1, a)
    if isinstance(values, np.ndarray):
        off, on = values.reshape(-1).tolist()
        return torch.where(hot.bool(), torch.tensor(on, dtype=torch.from_numpy(values).dtype),
                           torch.tensor(off, dtype=torch.from_numpy(values).dtype))
    return torch.where(hot.bool(), values[1], values[0])
