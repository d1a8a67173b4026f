"""ONNX reductions (axes as an attribute up to opset 17, as an input from 18; ReduceSum from 13), ArgMax/ArgMin,
TopK and CumSum."""

from __future__ import annotations

import torch

from .common import axis_of, ints
from .registry import TABLE as T

__all__: list[str] = []


def _sum_sq(x, dims, keep):
    return (x * x).sum(dims, keepdim=keep)


_REDUCE = {
    "ReduceMean": lambda x, d, k: x.mean(d, keepdim=k),
    "ReduceSum": lambda x, d, k: x.sum(d, keepdim=k),
    "ReduceMax": lambda x, d, k: x.amax(d, keepdim=k),
    "ReduceMin": lambda x, d, k: x.amin(d, keepdim=k),
    "ReduceProd": lambda x, d, k: _prod(x, d, k),
    "ReduceL1": lambda x, d, k: x.abs().sum(d, keepdim=k),
    "ReduceL2": lambda x, d, k: torch.sqrt(_sum_sq(x, d, k)),
    "ReduceSumSquare": _sum_sq,
    "ReduceLogSum": lambda x, d, k: torch.log(x.sum(d, keepdim=k)),
    "ReduceLogSumExp": lambda x, d, k: torch.logsumexp(x, d, keepdim=k),
}


def _prod(x, dims, keep):
    for d in sorted(dims, reverse=True):
        x = x.prod(d, keepdim=keep)
    return x


def _reduce(ctx, name, x, axes, keepdims, noop):
    if not axes:
        if noop:
            return x
        axes = list(range(x.dim()))
    dims = sorted({axis_of(ctx, a, x.dim()) for a in axes})
    if x.dim() == 0:
        return x
    return _REDUCE[name](x, dims, bool(keepdims))


def _register(name):
    # ai.onnx::<name>(data, axes?) -> reduced  attrs: keepdims, noop_with_empty_axes (axes: attribute before 18)
    if name != "ReduceSum":
        @T.op(name, since=13, until=17, attrs={"axes": None, "keepdims": 1})
        def by_attr(ctx, x, *, axes, keepdims):
            return _reduce(ctx, name, x, axes, keepdims, False)

    @T.op(name, since=13 if name == "ReduceSum" else 18, attrs={"keepdims": 1, "noop_with_empty_axes": 0},
          static=(1,))
    def by_input(ctx, x, axes=None, *, keepdims, noop_with_empty_axes):
        return _reduce(ctx, name, x, ints(ctx, axes, "axes"), keepdims, noop_with_empty_axes)


for _n in _REDUCE:
    _register(_n)


def _arg(name, fn):
    # ai.onnx::<name>(data) -> reduced (int64)  attrs: axis, keepdims, select_last_index
    @T.op(name, since=13, attrs={"axis": 0, "keepdims": 1, "select_last_index": 0})
    def op(ctx, x, *, axis, keepdims, select_last_index):
        a = axis_of(ctx, axis, x.dim())
        if select_last_index:
            n = x.shape[a]
            return (n - 1 - fn(x.flip(a), a, bool(keepdims))).to(torch.int64)
        return fn(x, a, bool(keepdims)).to(torch.int64)

    return op


_arg("ArgMax", lambda x, a, k: torch.argmax(x, a, keepdim=k))
_arg("ArgMin", lambda x, a, k: torch.argmin(x, a, keepdim=k))


# ai.onnx::TopK(X, K) -> Values, Indices  attrs: axis, largest, sorted
@T.op("TopK", since=11, attrs={"axis": -1, "largest": 1, "sorted": 1}, static=(1,))
def topk(ctx, x, k, *, axis, largest, sorted):  # noqa: A002 - ONNX's attribute name
    kk = ints(ctx, k, "K")[0]
    v, i = torch.topk(x, kk, axis_of(ctx, axis, x.dim()), bool(largest), True)
    return v, i.to(torch.int64)


# ai.onnx::CumSum(x, axis) -> y  attrs: exclusive, reverse
@T.op("CumSum", since=14, attrs={"exclusive": 0, "reverse": 0}, static=(1,))
def cumsum(ctx, x, axis, *, exclusive, reverse):
    a = axis_of(ctx, ints(ctx, axis, "axis")[0], x.dim())
    if reverse:
        x = x.flip(a)
    y = torch.cumsum(x, a)
    if exclusive:
        y = y - x
    return y.flip(a) if reverse else y


