"""Indexing, gathers and scatters. Gathers read in the input's layout where they can (a run of
unit-step indices becomes SLICE + CONCATENATION). LiteRT's SCATTER_ND writes into zeros and sums
duplicate indices, so a scatter into ``self`` is SELECT_V2(scattered mask, SCATTER_ND(updates),
self), and an accumulating one is ADD(self, SCATTER_ND(updates)); scatter_reduce goes through
UNSORTED_SEGMENT_{SUM,PROD,MAX,MIN}. Static index shapes only.
"""

from __future__ import annotations

import numpy as np
import torch

from tpu_export.converter.registry import arguments

from ..converter import layout as L
from .helpers import broadcast_plain, plain, ref_perm
from .ops_logical import where
from .ops_slice import strided_slice
from .registry import lowering, supported_if
from .values import Val

__all__ = []

aten = torch.ops.aten


# masked_fill.Scalar(Tensor self, Tensor mask, Scalar value) -> Tensor
@lowering(aten.masked_fill.Scalar)
def masked_fill(lw, x, mask, value):
    return where(lw, mask, value, x)


# index_select(Tensor self, int dim, Tensor index) -> Tensor
@lowering(aten.index_select.default)
def index_select(lw, x, dim, index):
    dim %= x.rank
    runs = _unit_runs(index, x.shape[dim])
    if runs is not None:  # torch.roll decomposes to a constant rotation index: slices beat GATHER
        return _slices_concat(lw, x, dim, runs)
    out = _gather(lw, x, dim, index)
    op = lw.sg.operators[-1]
    if dim == x.rank - 2 and not index.is_const and lw.memo.get(("cache_written_at", x.tensor)) is not None and \
            list(op.outputs) == [out.tensor] and _window_from_zero(lw.node.args[2], index.shape[0], x.shape[dim]):
        # a sliding layer's decode window of a KV cache: its attention may read the cache instead and drop this
        # GATHER (edge.attention_prefix; ops_attention._decode_window)
        slots = Val((index.shape[0],), np.dtype(np.int32), (0,), tensor=op.inputs[1])
        lw.memo[("cache_window", out.tensor)] = (x, slots, op)
    return out


def _window_from_zero(node, w, s) -> bool:
    """``node`` computes ``clamp(pos - (w - 1), 0, s - w) + <a constant of w>`` (converter.llm's
    ``KVCacheLM._window``, its constant the arange): w slots that are the first w of the cache while pos < w."""
    if not isinstance(w, int) or not isinstance(s, int) or getattr(node, "target", None) != aten.add.Tensor:
        return False
    clamp = [a for a in node.args if getattr(a, "target", None) == aten.clamp.default]
    other = [a for a in node.args if a is not (clamp[0] if clamp else None)]
    if len(clamp) != 1 or len(other) != 1 or list(clamp[0].args[1:]) != [0, s - w]:
        return False
    sub, const = clamp[0].args[0], other[0]
    val = const.meta.get("val") if hasattr(const, "meta") else None
    return getattr(sub, "target", None) == aten.sub.Tensor and sub.args[1] == w - 1 and \
        const.op in ("placeholder", "get_attr") and val is not None and tuple(val.shape) == (w,)


def _unit_runs(index, n, most: int = 2):
    """A constant 1-D index made of at most ``most`` ascending unit-step runs (a rotation, as
    torch.roll's decomposition gives): [(start, stop), ...]; otherwise None."""
    if n is None or not index.is_const or index.rank != 1 or index.shape[0] == 0:
        return None
    idx = np.asarray(index.const).astype(np.int64)
    if idx.min() < 0 or idx.max() >= n:
        return None
    breaks = np.nonzero(np.diff(idx) != 1)[0] + 1
    if len(breaks) + 1 > most:
        return None
    return [(int(r[0]), int(r[-1]) + 1) for r in np.split(idx, breaks)]


def _slices_concat(lw, x, dim, runs):
    shape = lw.out_shape
    if runs == [(0, x.shape[dim])]:
        return lw.alias(x)
    parts = []
    for start, stop in runs:
        part_shape = list(shape)
        part_shape[dim] = stop - start
        parts.append(strided_slice(lw, x, {dim: (start, stop, 1)}, out_shape=tuple(part_shape)))
    if len(parts) == 1:
        return parts[0]
    opts = lw.options("Concatenation", axis=x.perm.index(dim), fusedActivationFunction=0)
    return lw.op("CONCATENATION", [lw.tensor(p, x.perm) for p in parts], shape, x.dtype, x.perm, opts)


def _gather(lw, x, dim, index):
    shape = lw.out_shape
    idx = lw.cast(index, np.int32)
    if idx.rank == 1:
        perm = x.perm
        axis = perm.index(dim)
    else:  # the index's dims replace ``dim``: run in the plain layout
        x = lw.with_perm(x, L.identity(x.rank))
        perm, axis = L.identity(len(shape)), dim
    ins = [lw.tensor(x), lw.tensor(idx, L.identity(idx.rank))]
    return lw.op("GATHER", ins, shape, x.dtype, perm, lw.options("Gather", axis=axis))


# index.Tensor(Tensor self, Tensor?[] indices) -> Tensor
@lowering(aten.index.Tensor)
@supported_if(lambda n: _index_form(n.args[1]) is not None)
def index(lw, x, indices):
    kind, pos = _index_form(indices)
    indices = [_from_the_front(lw, ix, x.shape[d]) for d, ix in enumerate(indices)]
    if kind == "one":
        return _gather(lw, x, pos, indices[pos])
    present = [d for d, ix in enumerate(indices) if ix is not None]
    if kind == "grid":
        return _grid_gathers(lw, x, present, [indices[d] for d in present])
    return _gather_nd(lw, x, present, [indices[d] for d in present])


def _gather_nd(lw, x, present, idxs):
    """Index tensors on several dims: GATHER_ND over their broadcast coordinates, on x laid out with the indexed
    dims first. torch puts the broadcast dims where the indexed dims were when those are adjacent, else first; the
    result's layout says which, so nothing moves back."""
    shape = lw.out_shape
    k = len(idxs)
    nb = len(shape) - (x.rank - k)  # the broadcast index shape's rank
    adjacent = present == list(range(present[0], present[0] + k))
    at = present[0] if adjacent else 0  # where the broadcast dims are in the output
    bshape = shape[at:at + nb]
    bdims = list(bshape) if None not in bshape else lw.out_dims[at:at + nb]  # run-time sizes where dynamic
    cols = []
    for ix in idxs:
        ix = lw.cast(ix, np.int32)
        full = [1] * (nb - ix.rank) + lw.dims(ix) + [1]
        v = lw.const(ix.const.reshape(full)) if ix.is_const else lw.reshape(lw.with_perm(ix, L.identity(ix.rank)), full)
        cols.append(lw.op("BROADCAST_TO", [lw.tensor(v), lw.shape_tensor(bdims + [1], infer=False)],
                          tuple(bshape) + (1,), np.int32, suffix="idx"))
    coords = lw.op("CONCATENATION", [lw.tensor(c) for c in cols], tuple(bshape) + (k,), np.int32,
                   opts=lw.options("Concatenation", axis=nb), suffix="coords")
    rest = [d for d in range(x.rank) if d not in present]
    x = lw.with_perm(x, present + rest)  # GATHER_ND reads the leading dims
    # the output's physical dims: the broadcast ones, then the dims not indexed, in order
    out_rest = [d for d in range(len(shape)) if not at <= d < at + nb]
    perm = list(range(at, at + nb)) + out_rest
    return lw.op("GATHER_ND", [lw.tensor(x), lw.tensor(coords)], shape, x.dtype, perm)


def _grid_gathers(lw, x, present, idxs):
    """Adjacent index tensors that each vary along their own dim of the broadcast shape, in order (an outer
    product, as ``x[..., rows[:, None], cols]`` and the bicubic resize's decomposition index): one GATHER per
    indexed dim, in x's own layout, instead of a GATHER_ND over every coordinate."""
    k = len(idxs)
    for j, (d, ix) in enumerate(zip(present, idxs)):
        a = ix.rank - k + j  # the index's own dim that varies (none: it broadcasts, one entry)
        n = ix.shape[a] if a >= 0 else 1
        flat = lw.cast(ix, np.int32)
        if flat.is_const:
            flat = lw.const(flat.const.reshape(-1))
        else:
            flat = lw.reshape(plain(lw, flat), [lw.dims(ix)[a] if n is None else n])
        shape = list(x.shape)
        shape[d] = n
        ins = [lw.tensor(x), lw.tensor(flat, (0,))]
        x = lw.op("GATHER", ins, tuple(shape), x.dtype, x.perm, lw.options("Gather", axis=x.perm.index(d)))
    return x


def _from_the_front(lw, ix, n):
    """A constant index with negative entries (torch counts them from the end: Falcon's ``qkv[..., [-2]]``) as
    the same entries counted from the front: GATHER and GATHER_ND refuse a negative index."""
    if ix is None or n is None or not ix.is_const:
        return ix
    c = np.asarray(ix.const)
    return lw.const(np.where(c < 0, c + n, c).astype(c.dtype)) if (c < 0).any() else ix


def _index_shape(ix):
    v = ix.meta["val"] if isinstance(ix, torch.fx.Node) else ix
    return tuple(v.shape)


def _index_form(indices):
    """How index.Tensor's ``indices`` lower: ("one", dim) for one index tensor, ("grid", None) for adjacent ones
    forming an outer product, ("many", None) for others; None for boolean masks (data-dependent shapes)."""
    present = [i for i, ix in enumerate(indices) if ix is not None]
    if not present:
        return None
    for i in present:
        v = indices[i].meta["val"] if isinstance(indices[i], torch.fx.Node) else indices[i]
        if getattr(v, "dtype", None) in (torch.bool, torch.uint8):
            return None  # boolean masks give data-dependent shapes
    if len(present) == 1:
        return "one", present[0]
    k = len(present)
    shapes = [_index_shape(indices[i]) for i in present]
    adjacent = present == list(range(present[0], present[0] + k))
    # the broadcast shape must have one dim per index (x[arange(b), last] broadcasts two [b] indices to [b]: one
    # dim, a GATHER_ND, not a grid)
    if adjacent and max(len(s) for s in shapes) == k and all(
            all(isinstance(d, int) and d == 1 for a, d in enumerate((1,) * (k - len(s)) + s) if a != j)
            for j, s in enumerate(shapes)):
        return "grid", None
    return "many", None


# gather(Tensor self, int dim, Tensor index, *, bool sparse_grad=False) -> Tensor
@lowering(aten.gather.default)
def gather(lw, x, dim, index, sparse_grad=False):
    dim %= x.rank
    if not index.static:
        return _sym_gather(lw, x, dim, index)
    shape = tuple(index.shape)
    grids = list(np.meshgrid(*[np.arange(s, dtype=np.int32) for s in shape], indexing="ij"))  # numpy 2: a tuple
    idx = lw.cast(index, np.int32)
    if idx.is_const:
        grids[dim] = idx.const
        coords = lw.const(np.stack(grids, -1))
    else:
        parts = [lw.const(g[..., None]) for g in grids]
        parts[dim] = lw.reshape(lw.with_perm(idx, L.identity(idx.rank)), list(shape) + [1])
        coords = lw.op("CONCATENATION", [lw.tensor(p) for p in parts], shape + (len(shape),), np.int32,
                       opts=lw.options("Concatenation", axis=len(shape)), suffix="coords")
    x = lw.with_perm(x, L.identity(x.rank))
    return lw.op("GATHER_ND", [lw.tensor(x), lw.tensor(coords)], shape, x.dtype)


def _sym_gather(lw, x: Val, dim: int, index: Val) -> Val:
    """gather with an index of run-time shape: each coordinate but ``dim``'s is a RANGE over the index's dim,
    broadcast to the index's shape, for GATHER_ND."""
    r = index.rank
    dims = lw.dims(index)
    full = lw.shape_tensor(dims + [1], infer=False)
    idx = plain(lw, lw.cast(index, np.int32))
    parts = []
    for k in range(r):
        if k == dim:
            parts.append(lw.tensor(lw.reshape(idx, dims + [1])))
            continue
        pos = lw.op("RANGE", [lw.sym_scalar(0), lw.sym_scalar(dims[k]), lw.sym_scalar(1)], (index.shape[k],),
                    np.int32, suffix="pos")
        shp = [1] * (r + 1)
        shp[k] = dims[k]
        pos = lw.reshape(pos, shp)
        parts.append(lw.emit("BROADCAST_TO", [lw.tensor(pos), full], [tuple(index.shape) + (1,)], [np.int32],
                             suffix="pos")[0][0])
    coords = lw.op("CONCATENATION", parts, tuple(index.shape) + (r,), np.int32,
                   opts=lw.options("Concatenation", axis=r), suffix="coords")
    x = plain(lw, x)
    return lw.op("GATHER_ND", [lw.tensor(x), lw.tensor(coords)], lw.out_shape, x.dtype)


# embedding(Tensor weight, Tensor indices, SymInt padding_idx=-1, bool scale_grad_by_freq=False, bool sparse=False)
@lowering(aten.embedding.default)
def embedding(lw, weight, indices, *_):
    idx = lw.cast(indices, np.int32)
    ins = [lw.tensor(weight, L.identity(2)), lw.tensor(idx, L.identity(idx.rank))]
    return lw.op("GATHER", ins, lw.out_shape, weight.dtype, None, lw.options("Gather", axis=0))


def _static_arg(i):
    return lambda n: all(isinstance(d, int) for d in n.args[i].meta["val"].shape) and \
        all(isinstance(d, int) for d in n.meta["val"].shape)


def _scatter_nd(lw, coords: Val, updates: Val, shape, dtype) -> Val:
    """SCATTER_ND of ``updates`` at ``coords`` ([..., k] int32) into zeros of ``shape`` (plain layout)."""
    ins = [lw.tensor(plain(lw, coords)), lw.tensor(plain(lw, lw.cast(updates, dtype))),
           lw.const_tensor(list(shape), np.int32)]
    return lw.op("SCATTER_ND", ins, tuple(shape), dtype, suffix="scatter")


def _last_writes(lw, coords: Val, updates: Val) -> tuple[Val, Val]:
    """Constant coordinates with the repeated ones dropped but their last write: SCATTER_ND adds the updates of
    a coordinate given twice, where torch (and onnxruntime's ScatterElements) write in index order, so the last
    one stays. The updates kept are gathered (or sliced at conversion time when constant)."""
    k = coords.shape[-1]
    flat = coords.const.reshape(-1, k)
    _, first_of_reversed = np.unique(flat[::-1], axis=0, return_index=True)
    keep = np.sort(len(flat) - 1 - first_of_reversed)
    if len(keep) == len(flat):
        return coords, updates
    coords = lw.const(np.ascontiguousarray(flat[keep]))
    if updates.is_const:
        return coords, lw.const(np.ascontiguousarray(updates.const.reshape(-1)[keep]))
    upd = lw.reshape(plain(lw, updates), [len(flat)])
    ins = [lw.tensor(upd), lw.const_tensor(keep.astype(np.int32))]
    return coords, lw.op("GATHER", ins, (len(keep),), upd.dtype, None, lw.options("Gather", axis=0),
                         suffix="last_writes")


def _write(lw, x: Val, coords: Val, updates: Val, accumulate: bool) -> Val:
    """x with ``updates`` written (or added) at ``coords``; runs in the plain layout."""
    x = plain(lw, x)
    dtype = x.dtype
    if not accumulate and coords.is_const:
        coords, updates = _last_writes(lw, coords, updates)
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
    grids = list(np.meshgrid(*[np.arange(s, dtype=np.int32) for s in shape], indexing="ij"))  # numpy 2: a tuple
    idx = lw.cast(index, np.int32)
    if idx.is_const:
        grids[dim] = idx.const
        return lw.const(np.stack(grids, -1))
    parts = [lw.const(g[..., None]) for g in grids]
    parts[dim] = lw.reshape(plain(lw, idx), list(shape) + [1])
    return lw.op("CONCATENATION", [lw.tensor(plain(lw, p)) for p in parts], shape + (len(shape),), np.int32,
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
    # index tensors on consecutive dims after the leading full slices (x[:, :, i] = v, a KV-cache write)
    if not present or present != list(range(present[0], len(indices))):
        return False
    vals = [ix.meta["val"] for ix in indices if ix is not None]
    if any(v.dtype in (torch.bool, torch.uint8) for v in vals):
        return False  # boolean masks give data-dependent shapes
    return all(isinstance(d, int) for v in vals + [n.args[2].meta["val"], n.meta["val"]] for d in v.shape)


# index_put(Tensor self, Tensor?[] indices, Tensor values, bool accumulate=False) -> Tensor
# Index tensors on consecutive dims after ``lead`` full slices (None entries): the coordinates of
# every written element (the leading dims' positions, then the broadcast indices) feed SCATTER_ND.
@lowering(aten.index_put.default)
@supported_if(_index_put_form)
def index_put(lw, x, indices, values, accumulate=False):
    lead = sum(1 for ix in indices if ix is None)
    indices = indices[lead:]
    k = len(indices)
    bshape = tuple(np.broadcast_shapes(*[tuple(ix.shape) for ix in indices]))
    cshape = tuple(x.shape[:lead]) + bshape  # one coordinate row per written slice
    grids = np.meshgrid(*[np.arange(s, dtype=np.int32) for s in cshape], indexing="ij")
    cols = [lw.const(grids[d][..., None]) for d in range(lead)]
    for d, ix in enumerate(indices):
        ix = plain(lw, lw.cast(ix, np.int32))
        full = [1] * (len(cshape) - ix.rank) + list(ix.shape) + [1]
        v = lw.reshape(ix, full)
        # negative indices count from the end: FLOOR_MOD by the dim's size
        v = lw.op("FLOOR_MOD", [lw.tensor(v), lw.const_tensor(np.array(x.shape[lead + d], np.int32))], tuple(full),
                  np.int32, suffix="wrap")
        cols.append(lw.op("BROADCAST_TO", [lw.tensor(v), lw.const_tensor(list(cshape) + [1], np.int32)],
                          cshape + (1,), np.int32, suffix="idx"))
    coords = cols[0] if len(cols) == 1 else lw.op(
        "CONCATENATION", [lw.tensor(plain(lw, c)) for c in cols], cshape + (lead + k,), np.int32,
        opts=lw.options("Concatenation", axis=len(cshape)), suffix="coords")
    ushape = cshape + tuple(x.shape[lead + k:])
    vals = broadcast_plain(lw, lw.cast(values, x.dtype), ushape, suffix="values")
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
    x = plain(lw, x)
    size = int(np.prod(x.shape))
    m = broadcast_plain(lw, mask, x.shape, suffix="mask")
    flat = lw.reshape(lw.cast(m, np.int32), [size])
    csum = lw.op("CUMSUM", [lw.tensor(flat), lw.const_tensor(np.array(0, np.int32))], (size,), np.int32,
                 opts=lw.options("Cumsum"), suffix="count")
    k = lw.op("SUB", [lw.tensor(csum), lw.const_tensor(np.array(1, np.int32))], (size,), np.int32,
              opts=lw.options("Sub"), suffix="k")
    k = lw.op("MAXIMUM", [lw.tensor(k), lw.const_tensor(np.array(0, np.int32))], (size,), np.int32, suffix="k0")
    src = lw.reshape(plain(lw, lw.cast(source, x.dtype)), [int(np.prod(source.shape))])
    picked = lw.op("GATHER", [lw.tensor(src), lw.tensor(k)], (size,), x.dtype, opts=lw.options("Gather", axis=0))
    picked = lw.reshape(picked, list(x.shape))
    return lw.op("SELECT_V2", [lw.tensor(m), lw.tensor(picked), lw.tensor(x)], x.shape, x.dtype)


_SEGMENT_OP = {"sum": "UNSORTED_SEGMENT_SUM", "mean": "UNSORTED_SEGMENT_SUM", "prod": "UNSORTED_SEGMENT_PROD",
               "amax": "UNSORTED_SEGMENT_MAX", "amin": "UNSORTED_SEGMENT_MIN"}


_COMBINE = {"sum": "ADD", "prod": "MUL", "amax": "MAXIMUM", "amin": "MINIMUM"}


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
    x = plain(lw, x)
    size = int(np.prod(x.shape))
    ishape = tuple(index.shape)
    k = int(np.prod(ishape))
    strides = [int(np.prod(x.shape[d + 1:])) for d in range(x.rank)]
    grids = np.meshgrid(*[np.arange(s, dtype=np.int32) for s in ishape], indexing="ij")
    base = sum(g * st for d, (g, st) in enumerate(zip(grids, strides)) if d != dim).astype(np.int32)
    # flat target = index * stride(dim) + the other coordinates' part
    idx = lw.reshape(plain(lw, lw.cast(index, np.int32)), [k])
    ids = lw.op("MUL", [lw.tensor(idx), lw.const_tensor(np.array(strides[dim], np.int32))], (k,), np.int32,
                opts=lw.options("Mul"), suffix="ids")
    ids = lw.op("ADD", [lw.tensor(ids), lw.const_tensor(base.reshape(k))], (k,), np.int32, opts=lw.options("Add"),
                suffix="ids")
    data = lw.reshape(plain(lw, lw.cast(_src_part(lw, src, ishape), x.dtype)), [k])
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
