"""scatter_reduce through LiteRT's UNSORTED_SEGMENT_{SUM,PROD,MAX,MIN}: every element of ``src``
gets, as its segment id, the flat position in ``self`` it reduces into; positions no index hits
keep ``self``."""

from __future__ import annotations

import numpy as np
import torch

from . import layout as L
from .ops_scatter import _src_part
from .registry import lowering, supported_if
from .values import Val

__all__ = []

aten = torch.ops.aten
_SEGMENT_OP = {"sum": "UNSORTED_SEGMENT_SUM", "mean": "UNSORTED_SEGMENT_SUM", "prod": "UNSORTED_SEGMENT_PROD",
               "amax": "UNSORTED_SEGMENT_MAX", "amin": "UNSORTED_SEGMENT_MIN"}
_COMBINE = {"sum": "ADD", "prod": "MUL", "amax": "MAXIMUM", "amin": "MINIMUM"}


def _plain(lw, v: Val) -> Val:
    return lw.with_perm(v, L.identity(v.rank))


def _supported(n):
    x, index = n.args[0].meta["val"], n.args[2].meta["val"]
    reduce = n.args[4]
    static = all(isinstance(d, int) for d in tuple(x.shape) + tuple(index.shape))
    return static and reduce in _SEGMENT_OP and (reduce != "mean" or x.dtype.is_floating_point)


def _segment(lw, op, data: Val, ids: Val, size: int) -> Val:
    ins = [lw.tensor(data), lw.tensor(ids), lw.const_tensor(np.array([size], np.int32))]
    return lw.op(op, ins, (size,), data.dtype, suffix="segment")


# scatter_reduce.two(Tensor self, int dim, Tensor index, Tensor src, str reduce, *, bool include_self=True)
@lowering(aten.scatter_reduce.two)
@supported_if(_supported)
def scatter_reduce(lw, x, dim, index, src, reduce, include_self=True):
    dim %= x.rank
    x = _plain(lw, x)
    size = int(np.prod(x.shape))
    ishape = tuple(index.shape)
    k = int(np.prod(ishape))
    strides = [int(np.prod(x.shape[d + 1:])) for d in range(x.rank)]
    grids = np.meshgrid(*[np.arange(s, dtype=np.int32) for s in ishape], indexing="ij")
    base = sum(g * st for d, (g, st) in enumerate(zip(grids, strides)) if d != dim).astype(np.int32)
    # flat target = index * stride(dim) + the other coordinates' part
    idx = lw.reshape(_plain(lw, lw.cast(index, np.int32)), [k])
    ids = lw.op("MUL", [lw.tensor(idx), lw.const_tensor(np.array(strides[dim], np.int32))], (k,), np.int32,
                opts=lw.options("Mul"), suffix="ids")
    ids = lw.op("ADD", [lw.tensor(ids), lw.const_tensor(base.reshape(k))], (k,), np.int32, opts=lw.options("Add"),
                suffix="ids")
    data = lw.reshape(_plain(lw, lw.cast(_src_part(lw, src, ishape), x.dtype)), [k])
    seg = lw.reshape(_segment(lw, _SEGMENT_OP[reduce], data, ids, size), list(x.shape))
    count = lw.reshape(_segment(lw, "UNSORTED_SEGMENT_SUM", lw.const(np.ones(k, x.dtype)), ids, size),
                       list(x.shape))
    if reduce == "mean":
        total, n = seg, count
        if include_self:
            total = lw.op("ADD", [lw.tensor(x), lw.tensor(seg)], x.shape, x.dtype, opts=lw.options("Add"))
            n = lw.op("ADD", [lw.tensor(count), lw.const_tensor(np.array(1, x.dtype))], x.shape, x.dtype,
                      opts=lw.options("Add"))
        else:  # untouched positions keep self below; keep their division finite
            n = lw.op("MAXIMUM", [lw.tensor(count), lw.const_tensor(np.array(1, x.dtype))], x.shape, x.dtype)
        combined = lw.op("DIV", [lw.tensor(total), lw.tensor(n)], x.shape, x.dtype, opts=lw.options("Div"))
    elif include_self:
        kind = {"ADD": "Add", "MUL": "Mul"}.get(_COMBINE[reduce])
        combined = lw.op(_COMBINE[reduce], [lw.tensor(x), lw.tensor(seg)], x.shape, x.dtype,
                         opts=lw.options(kind) if kind else None)
    else:
        combined = seg
    hit = lw.op("GREATER", [lw.tensor(count), lw.const_tensor(np.array(0, x.dtype))], x.shape, np.bool_,
                suffix="hit")
    return lw.op("SELECT_V2", [lw.tensor(hit), lw.tensor(combined), lw.tensor(x)], x.shape, x.dtype)
