"""Shape and data-movement ops. ``permute`` writes nothing (it only changes the value's
layout); reshapes keep the layout where the moved dims stay contiguous; slices, concat,
pad and flips run in the input's layout with remapped axes."""

from __future__ import annotations

import numpy as np
import torch

from converter.registry import arguments

from . import layout as L
from .ops_elementwise import operand, ref_perm
from .registry import lowering, supported_if
from .values import SymVal, Val

__all__ = ["strided_slice", "view_shape"]

aten = torch.ops.aten
_BIG = 2**31 - 1


def view_shape(lw, size) -> list:
    """The target shape of a view/reshape: static dims from the node's aval, dynamic dims as
    the SymVal the graph passed (or None)."""
    out = lw.out_shape
    return [d if d is not None else (size[i] if isinstance(size[i], SymVal) else None) for i, d in enumerate(out)]


# view(Tensor(a) self, SymInt[] size) -> Tensor(a) ; _unsafe_view / reshape: the same
@lowering(aten.view.default, aten._unsafe_view.default, aten.reshape.default)
def view(lw, x, size):
    return lw.reshape(x, view_shape(lw, size))


# squeeze.dims(Tensor(a) self, int[] dim) -> Tensor(a) ; squeeze.dim / squeeze.default ; unsqueeze(self, int dim)
@lowering(aten.squeeze.dims, aten.squeeze.dim, aten.squeeze.default, aten.unsqueeze.default)
def squeeze(lw, x, *dims):
    return lw.reshape(x, lw.out_shape)


# permute(Tensor(a) self, int[] dims) -> Tensor(a): only the layout changes
@lowering(aten.permute.default)
def permute(lw, x, dims):
    dims = [d % x.rank for d in dims]
    inv = L.inverse(dims)
    if x.is_const:
        return lw.const(np.transpose(x.const, dims))
    perm = tuple(inv[p] for p in x.perm)
    shape = tuple(x.shape[d] for d in dims)
    return Val(shape, x.dtype, perm, tensor=x.tensor, producer=x.producer if x.users == 1 else None)


# expand(Tensor(a) self, SymInt[] size, *, bool implicit=False) -> Tensor(a)
@lowering(aten.expand.default)
def expand(lw, x, size, implicit=False):
    shape = lw.out_shape
    rank = len(shape)
    perm = ref_perm([x], rank)
    if x.rank < rank and L.is_identity(perm):  # BROADCAST_TO wants the full rank
        x = lw.reshape(x, [1] * (rank - x.rank) + list(x.shape))
    t = operand(lw, x, rank, perm)
    off = rank - x.rank
    dims = []
    for i, d in enumerate(shape):
        if d is None:  # a dynamic size: the graph's SymInt, or (for -1) the input's own dim
            d = size[i] if isinstance(size[i], SymVal) else SymVal(None, ("dim", x, i - off))
        dims.append(d)
    phys_in = lw.sg.tensors[t].shape
    grown = [i for i, p in enumerate(perm) if shape[p] is None or phys_in[i] != shape[p]]
    if len(grown) == 1 and shape[perm[grown[0]]] is not None and 2 <= shape[perm[grown[0]]] <= 4 \
            and x.static and not x.is_const:
        # a few copies along one axis (GQA's repeat_kv): XNNPACK delegates CONCATENATION, not
        # BROADCAST_TO, which would split the delegated graph around it
        opts = lw.options("Concatenation", axis=grown[0], fusedActivationFunction=0)
        return lw.op("CONCATENATION", [t] * shape[perm[grown[0]]], shape, x.dtype, perm, opts)
    shape_t = lw.shape_tensor([dims[p] for p in perm], infer=False)
    return lw.op("BROADCAST_TO", [t, shape_t], shape, x.dtype, perm)


def strided_slice(lw, x: Val, specs: dict, shrink=(), out_shape=None) -> Val:
    """x[specs] in x's own layout: specs maps logical dim -> (start, end, step); ``shrink``
    dims are selected (start only) and dropped. A static slice is written as SLICE (with
    RESHAPEs around it for steps and dropped dims), because XNNPACK delegates SLICE and
    RESHAPE but not a STRIDED_SLICE with a step > 1 or a shrink mask: each such op splits
    the delegated graph and runs on the slower builtin kernel between partitions."""
    shape = lw.out_shape if out_shape is None else out_shape
    perm = L.drop_dims(x.perm, shrink) if shrink else x.perm
    axes = _slice_axes(x, specs, shrink)
    if axes is not None:
        return _slice_views(lw, x, axes, shape, perm)
    begin, end, strides = [], [], []
    bmask = emask = smask = 0
    for i, d in enumerate(x.perm):
        if d not in specs:
            begin.append(0); end.append(0); strides.append(1)
            bmask |= 1 << i
            emask |= 1 << i
            continue
        s, e, st = specs[d]
        n = x.shape[d]
        s = 0 if s is None else int(s)
        if n is not None and s < 0:
            s = max(s + n, 0)
        if d in shrink:
            begin.append(s); strides.append(1)
            if s == -1:
                end.append(0); emask |= 1 << i
            else:
                end.append(s + 1)
            smask |= 1 << i
            continue
        if e is None or e >= _BIG or (n is not None and e >= n):
            end.append(0); emask |= 1 << i
        else:
            e = int(e)
            end.append(max(e + n, 0) if (n is not None and e < 0) else e)
        begin.append(s); strides.append(int(st))
    ins = [lw.tensor(x)] + [lw.const_tensor(a, np.int32) for a in (begin, end, strides)]
    opts = lw.options("StridedSlice", beginMask=bmask, endMask=emask, shrinkAxisMask=smask)
    version = 4 if x.rank > 4 else 1
    return lw.op("STRIDED_SLICE", ins, shape, x.dtype, perm, opts, version=version)


def _slice_axes(x: Val, specs: dict, shrink) -> list | None:
    """The slice as [(extent, begin, size)] over x's physical tensor, with a stepped dim split
    into (extent / step, step) so that every axis is a unit-step window; once a split needs a
    RESHAPE anyway (or the rank is over SLICE's 5), size-1 axes are dropped and adjacent axes
    merged where the window stays contiguous. None when it needs STRIDED_SLICE (dynamic or empty
    sizes, a step that does not divide its dim, more than 5 axes left)."""
    if not x.static:
        return None
    axes = []
    for d in x.perm:
        n = x.shape[d]
        if d not in specs:
            axes.append((n, 0, n))
            continue
        s, e, st = specs[d]
        s = 0 if s is None else int(s)
        if d in shrink:
            i = s + n if s < 0 else s
            if not 0 <= i < n:
                return None
            axes.append((n, i, 1))
            continue
        r = range(n)[slice(s, None if e is None or e >= _BIG else int(e), int(st))]
        if len(r) == 0 or r.step < 1:
            return None
        if r.step == 1 or len(r) == 1:
            axes.append((n, r.start, len(r)))
        elif n % r.step == 0:  # element q*step + rem for q in [start // step, +len): two unit-step axes
            axes += [(n // r.step, r.start // r.step, len(r)), (r.step, r.start % r.step, 1)]
        else:
            return None
    if len(axes) == x.rank and x.rank <= 5:
        return axes  # no step split: slice the tensor as it is, no RESHAPE in front
    merged = []
    for n, b, k in axes:
        if n == 1:
            continue
        if merged and k == n:  # a whole inner axis extends the outer window contiguously
            pn, pb, pk = merged[-1]
            merged[-1] = (pn * n, pb * n, pk * n)
        else:
            merged.append((n, b, k))
    return merged if len(merged) <= 5 else None


def _slice_views(lw, x: Val, axes, shape, perm) -> Val:
    """RESHAPE x's tensor to the window's axes, SLICE, RESHAPE to the result's physical shape."""
    t = lw.tensor(x)
    phys_out = tuple(shape[p] for p in perm)
    if all(b == 0 and k == n for n, b, k in axes):
        return lw.reshape(lw.alias(x), shape) if tuple(shape) != tuple(x.shape) else lw.alias(x)
    t = lw.reshape_tensor(t, tuple(n for n, _, _ in axes), x.dtype)
    size = tuple(k for _, _, k in axes)
    ins = [t, lw.const_tensor([b for _, b, _ in axes], np.int32), lw.const_tensor(list(size), np.int32)]
    if size == phys_out:
        return lw.op("SLICE", ins, shape, x.dtype, perm, version=_slice_version(len(axes), x.dtype))
    (t,), _ = lw.emit("SLICE", ins, [size], [x.dtype], suffix="slice", version=_slice_version(len(axes), x.dtype))
    return lw.op("RESHAPE", [t, lw.const_tensor(list(phys_out), np.int32)], shape, x.dtype, perm)


def _slice_version(rank, dtype) -> int:
    if rank > 4:
        return 5
    return {np.dtype(np.int8): 2, np.dtype(np.int16): 4}.get(np.dtype(dtype), 1)


# slice.Tensor(Tensor(a) self, int dim=0, SymInt? start=None, SymInt? end=None, SymInt step=1) -> Tensor(a)
@lowering(aten.slice.Tensor)
@supported_if(lambda n: all(not isinstance(arguments(n)[k], torch.fx.Node) for k in ("start", "end", "step")))
def slice_(lw, x, dim=0, start=None, end=None, step=1):
    dim %= x.rank
    if (start in (None, 0)) and (end is None or end >= _BIG or end == x.shape[dim]) and step == 1:
        return lw.alias(x)
    return strided_slice(lw, x, {dim: (start, end, step)})


# select.int(Tensor(a) self, int dim, SymInt index) -> Tensor(a)
@lowering(aten.select.int)
def select(lw, x, dim, index):
    dim %= x.rank
    return strided_slice(lw, x, {dim: (index, None, 1)}, shrink=(dim,))


# cat(Tensor[] tensors, int dim=0) -> Tensor
@lowering(aten.cat.default)
def cat(lw, tensors, dim=0):
    shape = lw.out_shape
    dtype = lw.out_dtype
    rank = len(shape)
    dim %= rank
    vals = [lw.cast(t, dtype) for t in tensors if not (t.rank == 1 and t.shape[0] == 0)]
    if len(vals) == 1:
        return lw.alias(vals[0])
    perm = ref_perm(vals, rank)
    ins = [lw.tensor(v, perm) for v in vals]
    opts = lw.options("Concatenation", axis=perm.index(dim), fusedActivationFunction=0)
    return lw.op("CONCATENATION", ins, shape, dtype, perm, opts)


def _split(lw, x, sizes, dim):
    """One SLICE per piece when x is static (XNNPACK delegates SLICE, not SPLIT_V: ShuffleNet's
    chunk(2) split the delegated graph four times), else one SPLIT_V."""
    dim %= x.rank
    axis = x.perm.index(dim)
    outs_shape = [lw.out_shapes[i] for i in range(len(sizes))]
    if x.static:
        starts = np.cumsum([0] + list(sizes))
        return tuple(strided_slice(lw, x, {dim: (int(b), int(b) + n, 1)}, out_shape=s)
                     for b, n, s in zip(starts, sizes, outs_shape))
    ins = [lw.tensor(x), lw.const_tensor(list(sizes), np.int32), lw.const_tensor(axis, np.int32)]
    phys = [tuple(s[p] for p in x.perm) for s in outs_shape]
    ts, _ = lw.emit("SPLIT_V", ins, phys, [x.dtype] * len(sizes), lw.options("SplitV", numSplits=len(sizes)))
    return tuple(Val(s, x.dtype, x.perm, tensor=t) for s, t in zip(outs_shape, ts))


# split_with_sizes(Tensor(a -> *) self, SymInt[] split_sizes, int dim=0) -> Tensor(a)[]
@lowering(aten.split_with_sizes.default)
def split_with_sizes(lw, x, split_sizes, dim=0):
    return _split(lw, x, split_sizes, dim)


# split.Tensor(Tensor(a -> *) self, SymInt split_size, int dim=0) -> Tensor(a)[]
@lowering(aten.split.Tensor)
def split(lw, x, split_size, dim=0):
    n = x.shape[dim % x.rank]
    sizes = [min(split_size, n - i) for i in range(0, n, split_size)]
    return _split(lw, x, sizes, dim)


# unbind.int(Tensor(a -> *) self, int dim=0) -> Tensor(a)[]
@lowering(aten.unbind.int)
def unbind(lw, x, dim=0):
    dim %= x.rank
    return tuple(strided_slice(lw, x, {dim: (i, None, 1)}, shrink=(dim,), out_shape=lw.out_shapes[i])
                 for i in range(x.shape[dim]))


# index_select(Tensor self, int dim, Tensor index) -> Tensor
@lowering(aten.index_select.default)
def index_select(lw, x, dim, index):
    dim %= x.rank
    runs = _unit_runs(index, x.shape[dim])
    if runs is not None:  # torch.roll decomposes to a constant rotation index: slices beat GATHER
        return _slices_concat(lw, x, dim, runs)
    return _gather(lw, x, dim, index)


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
    if kind == "one":
        return _gather(lw, x, pos, indices[pos])
    # several index tensors from dim 0: GATHER_ND over their broadcast coordinates
    shape = lw.out_shape
    k = len(indices)
    bshape = shape[: len(shape) - (x.rank - k)]
    cols = []
    for ix in indices:
        ix = lw.cast(ix, np.int32)
        full = [1] * (len(bshape) - ix.rank) + list(ix.shape) + [1]
        v = lw.const(ix.const.reshape(full)) if ix.is_const else lw.reshape(lw.with_perm(ix, L.identity(ix.rank)), full)
        cols.append(lw.op("BROADCAST_TO", [lw.tensor(v), lw.const_tensor(list(bshape) + [1], np.int32)],
                          tuple(bshape) + (1,), np.int32, suffix="idx"))
    coords = lw.op("CONCATENATION", [lw.tensor(c) for c in cols], tuple(bshape) + (k,), np.int32,
                   opts=lw.options("Concatenation", axis=len(bshape)), suffix="coords")
    x = lw.with_perm(x, L.identity(x.rank))
    return lw.op("GATHER_ND", [lw.tensor(x), lw.tensor(coords)], shape, x.dtype)


def _index_form(indices):
    present = [i for i, ix in enumerate(indices) if ix is not None]
    if not present:
        return None
    for i in present:
        v = indices[i].meta["val"] if isinstance(indices[i], torch.fx.Node) else indices[i]
        if getattr(v, "dtype", None) in (torch.bool, torch.uint8):
            return None  # boolean masks give data-dependent shapes
    if len(present) == 1:
        return "one", present[0]
    if present == list(range(len(present))):
        return "many", 0
    return None


# gather(Tensor self, int dim, Tensor index, *, bool sparse_grad=False) -> Tensor
@lowering(aten.gather.default)
@supported_if(lambda n: all(isinstance(d, int) for d in n.args[2].meta["val"].shape))
def gather(lw, x, dim, index, sparse_grad=False):
    dim %= x.rank
    shape = tuple(index.shape)
    grids = np.meshgrid(*[np.arange(s, dtype=np.int32) for s in shape], indexing="ij")
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


# embedding(Tensor weight, Tensor indices, SymInt padding_idx=-1, bool scale_grad_by_freq=False, bool sparse=False)
@lowering(aten.embedding.default)
def embedding(lw, weight, indices, *_):
    idx = lw.cast(indices, np.int32)
    ins = [lw.tensor(weight, L.identity(2)), lw.tensor(idx, L.identity(idx.rank))]
    return lw.op("GATHER", ins, lw.out_shape, weight.dtype, None, lw.options("Gather", axis=0))


# constant_pad_nd(Tensor self, SymInt[] pad, Scalar value=0) -> Tensor
@lowering(aten.constant_pad_nd.default)
@supported_if(lambda n: all(isinstance(p, int) and p >= 0 for p in n.args[1]))
def constant_pad_nd(lw, x, pad, value=0):
    return pad_value(lw, x, _pairs(x.rank, pad), value)


def _pairs(rank, pad):
    pairs = [[0, 0] for _ in range(rank)]
    for i in range(len(pad) // 2):
        pairs[rank - 1 - i] = [pad[2 * i], pad[2 * i + 1]]
    return pairs


def pad_value(lw, x, pairs, value=0, shape=None, perm=None) -> Val:
    """PAD (value 0) or PADV2 of x in layout ``perm`` (default its own); pairs per logical dim."""
    perm = x.perm if perm is None else perm
    phys = np.array([pairs[d] for d in perm], np.int32)
    shape = lw.out_shape if shape is None else shape
    ins = [lw.tensor(x, perm), lw.const_tensor(phys)]
    version = 4 if x.rank > 4 else 1
    if value == 0:
        return lw.op("PAD", ins, shape, x.dtype, perm, version=version)
    ins.append(lw.const_tensor(np.array(value, x.dtype)))
    return lw.op("PADV2", ins, shape, x.dtype, perm, version=version)


# reflection_pad{1,2}d(Tensor self, SymInt[] padding) -> Tensor
@lowering(aten.reflection_pad1d.default, aten.reflection_pad2d.default, aten.reflection_pad3d.default)
def reflection_pad(lw, x, padding):
    phys = np.array([_pairs(x.rank, padding)[d] for d in x.perm], np.int32)
    return lw.op("MIRROR_PAD", [lw.tensor(x), lw.const_tensor(phys)], lw.out_shape, x.dtype, x.perm,
                 lw.options("MirrorPad", mode=0))


# flip(Tensor self, int[] dims) -> Tensor
@lowering(aten.flip.default)
def flip(lw, x, dims):
    axes = [x.perm.index(d % x.rank) for d in dims]
    return lw.op("REVERSE_V2", [lw.tensor(x), lw.const_tensor(axes, np.int32)], x.shape, x.dtype, x.perm)


# roll(Tensor self, SymInt[1] shifts, int[1] dims=[]) -> Tensor: two slices and a concat per dim
@lowering(aten.roll.default)
@supported_if(lambda n: len(arguments(n)["dims"]) > 0)
def roll(lw, x, shifts, dims=()):
    for s, d in zip(shifts, dims):
        d %= x.rank
        n = x.shape[d]
        s %= n
        if s == 0:
            continue
        shp = list(x.shape)
        a = strided_slice(lw, x, {d: (n - s, None, 1)}, out_shape=tuple(shp[:d] + [s] + shp[d + 1:]))
        b = strided_slice(lw, x, {d: (0, n - s, 1)}, out_shape=tuple(shp[:d] + [n - s] + shp[d + 1:]))
        opts = lw.options("Concatenation", axis=x.perm.index(d))
        x = lw.op("CONCATENATION", [lw.tensor(a), lw.tensor(b, a.perm)], x.shape, x.dtype, a.perm, opts)
    return x


# repeat(Tensor self, SymInt[] repeats) -> Tensor
@lowering(aten.repeat.default)
def repeat(lw, x, repeats):
    shape = lw.out_shape
    rank = len(shape)
    perm = ref_perm([x], rank)
    t = operand(lw, x, rank, perm) if x.rank == rank or not L.is_identity(perm) else \
        lw.tensor(lw.reshape(x, [1] * (rank - x.rank) + list(x.shape)))
    mult = [repeats[p] for p in perm]
    return lw.op("TILE", [t, lw.const_tensor(mult, np.int32)], shape, x.dtype, perm)


def _as_strided_is_view(n):
    x = n.args[0].meta["val"]
    size, stride = list(n.args[1]), list(n.args[2])
    offset = arguments(n)["storage_offset"]
    if len(size) != x.dim() or offset not in (None, 0):
        return False
    expect = 1  # None once a dynamic dim makes the contiguous stride unknown
    for d in reversed(range(len(size))):
        if isinstance(size[d], torch.fx.Node):  # a dynamic dim: the input's own size
            if not isinstance(x.shape[d], torch.SymInt):
                return False
            expect = None
            continue
        if size[d] != x.shape[d]:
            return False
        if size[d] != 1 and expect is not None and stride[d] != expect:
            return False
        if size[d] != 1 and expect is None and not isinstance(stride[d], torch.fx.Node):
            return False
        expect = expect * size[d] if expect is not None else None
    return True


# as_strided(Tensor(a) self, SymInt[] size, SymInt[] stride, SymInt? storage_offset=None) -> Tensor(a)
# Only the form torch writes for a no-op view (same size, contiguous strides up to size-1 dims).
@lowering(aten.as_strided.default)
@supported_if(_as_strided_is_view)
def as_strided(lw, x, size, stride, storage_offset=None):
    return lw.alias(x)


# full(SymInt[] size, Scalar fill_value, *, ScalarType? dtype=None, ...) -> Tensor
@lowering(aten.full.default)
def full(lw, size, fill_value, *_):
    shape = lw.out_shape
    dtype = lw.out_dtype
    dims = lw.shape_tensor([shape[i] if shape[i] is not None else size[i] for i in range(len(shape))])
    return lw.op("FILL", [dims, lw.const_tensor(np.array(fill_value, dtype))], shape, dtype)


# full_like(Tensor self, Scalar fill_value, *, ...) -> Tensor ; zeros_like / ones_like
@lowering(aten.full_like.default)
def full_like(lw, x, fill_value, *_):
    return _fill_like(lw, x, fill_value)


@lowering(aten.zeros_like.default)
def zeros_like(lw, x, *_):
    return _fill_like(lw, x, 0)


@lowering(aten.ones_like.default)
def ones_like(lw, x, *_):
    return _fill_like(lw, x, 1)


def _fill_like(lw, x, value):
    dtype = lw.out_dtype
    if x.static:
        dims = lw.const_tensor(list(x.phys_shape()), np.int32)
    else:
        (dims,), _ = lw.emit("SHAPE", [lw.tensor(x)], [(x.rank,)], [np.int32], lw.options("Shape", outType=2),
                             suffix="shape")
    return lw.op("FILL", [dims, lw.const_tensor(np.array(value, dtype))], x.shape, dtype, x.perm)


# arange.start_step(Scalar start, Scalar end, Scalar step=1, *, ScalarType? dtype=None, ...) -> Tensor
@lowering(aten.arange.start_step)
@supported_if(lambda n: not any(isinstance(a, torch.fx.Node) for a in n.args))
def arange(lw, start, end, step=1, *_):
    dtype = lw.out_dtype
    ins = [lw.const_tensor(np.array(v, dtype)) for v in (start, end, step)]
    return lw.op("RANGE", ins, lw.out_shape, dtype)
