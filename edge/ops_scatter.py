"""Scatters and slice updates. LiteRT's SCATTER_ND writes into zeros and sums duplicate indices,
so a scatter into ``self`` is SELECT_V2(scattered mask, SCATTER_ND(updates), self), and an
accumulating one is ADD(self, SCATTER_ND(updates)). Static index shapes only."""

from __future__ import annotations

import numpy as np
import torch

from converter.registry import arguments

from . import layout as L
from .ops_elementwise import ref_perm
from .ops_shape import strided_slice
from .registry import lowering, supported_if
from .values import Val

__all__ = []

aten = torch.ops.aten


def _static_arg(i):
    return lambda n: all(isinstance(d, int) for d in n.args[i].meta["val"].shape) and \
        all(isinstance(d, int) for d in n.meta["val"].shape)


def _plain(lw, v: Val) -> Val:
    return lw.with_perm(v, L.identity(v.rank))


def _scatter_nd(lw, coords: Val, updates: Val, shape, dtype) -> Val:
    """SCATTER_ND of ``updates`` at ``coords`` ([..., k] int32) into zeros of ``shape`` (plain layout)."""
    ins = [lw.tensor(_plain(lw, coords)), lw.tensor(_plain(lw, lw.cast(updates, dtype))),
           lw.const_tensor(list(shape), np.int32)]
    return lw.op("SCATTER_ND", ins, tuple(shape), dtype, suffix="scatter")


def _write(lw, x: Val, coords: Val, updates: Val, accumulate: bool) -> Val:
    """x with ``updates`` written (or added) at ``coords``; runs in the plain layout."""
    x = _plain(lw, x)
    dtype = x.dtype
    scattered = _scatter_nd(lw, coords, updates, x.shape, dtype)
    if accumulate:
        return lw.op("ADD", [lw.tensor(x), lw.tensor(scattered)], x.shape, dtype, opts=lw.options("Add"))
    ones = lw.const(np.ones(updates.shape, np.int32))
    hits = _scatter_nd(lw, coords, ones, x.shape, np.dtype(np.int32))
    mask = lw.op("GREATER", [lw.tensor(hits), lw.const_tensor(np.array(0, np.int32))], x.shape, np.bool_,
                 suffix="mask")
    return lw.op("SELECT_V2", [lw.tensor(mask), lw.tensor(scattered), lw.tensor(x)], x.shape, dtype)


def _dim_coords(lw, index: Val, dim: int) -> Val:
    """[*index.shape, rank] coordinates of scatter/gather along ``dim``: the index there, the
    position elsewhere."""
    shape = tuple(index.shape)
    grids = np.meshgrid(*[np.arange(s, dtype=np.int32) for s in shape], indexing="ij")
    idx = lw.cast(index, np.int32)
    if idx.is_const:
        grids[dim] = idx.const
        return lw.const(np.stack(grids, -1))
    parts = [lw.const(g[..., None]) for g in grids]
    parts[dim] = lw.reshape(_plain(lw, idx), list(shape) + [1])
    return lw.op("CONCATENATION", [lw.tensor(_plain(lw, p)) for p in parts], shape + (len(shape),), np.int32,
                 opts=lw.options("Concatenation", axis=len(shape)), suffix="coords")


def _src_part(lw, src: Val, shape) -> Val:
    if tuple(src.shape) == tuple(shape):
        return src
    return strided_slice(lw, src, {d: (0, s, 1) for d, s in enumerate(shape)}, out_shape=tuple(shape))


# scatter.src(Tensor self, int dim, Tensor index, Tensor src) -> Tensor
@lowering(aten.scatter.src)
@supported_if(_static_arg(2))
def scatter_src(lw, x, dim, index, src):
    dim %= x.rank
    return _write(lw, x, _dim_coords(lw, index, dim), _src_part(lw, src, index.shape), False)


# scatter.value(Tensor self, int dim, Tensor index, Scalar value) -> Tensor
@lowering(aten.scatter.value)
@supported_if(_static_arg(2))
def scatter_value(lw, x, dim, index, value):
    dim %= x.rank
    return _write(lw, x, _dim_coords(lw, index, dim), lw.const(np.full(index.shape, value, x.dtype)), False)


# scatter_add(Tensor self, int dim, Tensor index, Tensor src) -> Tensor
@lowering(aten.scatter_add.default)
@supported_if(_static_arg(2))
def scatter_add(lw, x, dim, index, src):
    dim %= x.rank
    return _write(lw, x, _dim_coords(lw, index, dim), _src_part(lw, src, index.shape), True)


def _index_put_form(n):
    indices = n.args[1]
    present = [i for i, ix in enumerate(indices) if ix is not None]
    if not present or present != list(range(len(present))) or len(present) != len(indices):
        return False
    vals = [ix.meta["val"] for ix in indices]
    if any(v.dtype in (torch.bool, torch.uint8) for v in vals):
        return False  # boolean masks give data-dependent shapes
    return all(isinstance(d, int) for v in vals + [n.args[2].meta["val"], n.meta["val"]] for d in v.shape)


# index_put(Tensor self, Tensor?[] indices, Tensor values, bool accumulate=False) -> Tensor
# Index tensors on the leading dims: their broadcast coordinates feed SCATTER_ND.
@lowering(aten.index_put.default)
@supported_if(_index_put_form)
def index_put(lw, x, indices, values, accumulate=False):
    k = len(indices)
    bshape = tuple(np.broadcast_shapes(*[tuple(ix.shape) for ix in indices]))
    cols = []
    for d, ix in enumerate(indices):
        ix = _plain(lw, lw.cast(ix, np.int32))
        full = [1] * (len(bshape) - ix.rank) + list(ix.shape) + [1]
        v = lw.reshape(ix, full)
        # negative indices count from the end: FLOOR_MOD by the dim's size
        v = lw.op("FLOOR_MOD", [lw.tensor(v), lw.const_tensor(np.array(x.shape[d], np.int32))], tuple(full),
                  np.int32, suffix="wrap")
        cols.append(lw.op("BROADCAST_TO", [lw.tensor(v), lw.const_tensor(list(bshape) + [1], np.int32)],
                          bshape + (1,), np.int32, suffix="idx"))
    coords = cols[0] if k == 1 else lw.op("CONCATENATION", [lw.tensor(c) for c in cols], bshape + (k,), np.int32,
                                          opts=lw.options("Concatenation", axis=len(bshape)), suffix="coords")
    ushape = bshape + tuple(x.shape[k:])
    vals = _plain(lw, lw.cast(values, x.dtype))
    if tuple(vals.shape) != ushape:
        if vals.rank < len(ushape):
            vals = lw.reshape(vals, [1] * (len(ushape) - vals.rank) + list(vals.shape))
        vals = lw.op("BROADCAST_TO", [lw.tensor(vals), lw.const_tensor(list(ushape), np.int32)], ushape, x.dtype,
                     suffix="values")
    return _write(lw, x, coords, vals, bool(accumulate))


# slice_scatter(Tensor self, Tensor src, int dim=0, SymInt? start=None, SymInt? end=None, SymInt step=1)
# CONCATENATION(self, src) along dim, then one GATHER with a constant index picking src's rows
# at the sliced positions and self's elsewhere.
@lowering(aten.slice_scatter.default)
@supported_if(lambda n: all(isinstance(d, int) for d in n.meta["val"].shape)
              and all(not isinstance(arguments(n)[k], torch.fx.Node) for k in ("start", "end", "step")))
def slice_scatter(lw, x, src, dim=0, start=None, end=None, step=1):
    dim %= x.rank
    n = x.shape[dim]
    pos = list(range(n))[slice(start, end, step)]
    order = np.arange(n, dtype=np.int32)
    order[pos] = n + np.arange(len(pos), dtype=np.int32)
    dtype = lw.out_dtype
    perm = ref_perm([x, src], x.rank)
    both_shape = tuple(s + (src.shape[dim] if d == dim else 0) for d, s in enumerate(x.shape))
    both = lw.op("CONCATENATION", [lw.tensor(lw.cast(x, dtype), perm), lw.tensor(lw.cast(src, dtype), perm)],
                 both_shape, dtype, perm, lw.options("Concatenation", axis=perm.index(dim)), suffix="both")
    return lw.op("GATHER", [lw.tensor(both), lw.const_tensor(order)], x.shape, dtype, perm,
                 lw.options("Gather", axis=perm.index(dim)))


# masked_scatter(Tensor self, Tensor mask, Tensor source) -> Tensor
# The k-th True position takes source.flatten()[k]: k = CUMSUM(mask) - 1, then GATHER and SELECT_V2.
@lowering(aten.masked_scatter.default)
@supported_if(lambda n: all(isinstance(d, int) for a in n.args for d in a.meta["val"].shape))
def masked_scatter(lw, x, mask, source):
    x = _plain(lw, x)
    size = int(np.prod(x.shape))
    m = _plain(lw, mask)
    if tuple(m.shape) != tuple(x.shape):
        if m.rank < x.rank:
            m = lw.reshape(m, [1] * (x.rank - m.rank) + list(m.shape))
        m = lw.op("BROADCAST_TO", [lw.tensor(m), lw.const_tensor(list(x.shape), np.int32)], x.shape, np.bool_,
                  suffix="mask")
    flat = lw.reshape(lw.cast(m, np.int32), [size])
    csum = lw.op("CUMSUM", [lw.tensor(flat), lw.const_tensor(np.array(0, np.int32))], (size,), np.int32,
                 opts=lw.options("Cumsum"), suffix="count")
    k = lw.op("SUB", [lw.tensor(csum), lw.const_tensor(np.array(1, np.int32))], (size,), np.int32,
              opts=lw.options("Sub"), suffix="k")
    k = lw.op("MAXIMUM", [lw.tensor(k), lw.const_tensor(np.array(0, np.int32))], (size,), np.int32, suffix="k0")
    src = lw.reshape(_plain(lw, lw.cast(source, x.dtype)), [int(np.prod(source.shape))])
    picked = lw.op("GATHER", [lw.tensor(src), lw.tensor(k)], (size,), x.dtype, opts=lw.options("Gather", axis=0))
    picked = lw.reshape(picked, list(x.shape))
    return lw.op("SELECT_V2", [lw.tensor(m), lw.tensor(picked), lw.tensor(x)], x.shape, x.dtype)
