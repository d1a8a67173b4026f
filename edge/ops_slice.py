"""Slices, pads, flips and rolls, in the input's layout with remapped axes. A static slice is
SLICE (XNNPACK delegates it) with RESHAPEs for steps and dropped dims.
"""

from __future__ import annotations

import numpy as np
import torch

import tpu_export.converter.llm_ops  # noqa: F401  (registers tpu_export::cache_write, lowered below)
from tpu_export.converter.registry import arguments

from ..converter import layout as L
from .helpers import plain
from .registry import lowering, supported_if
from .values import SymVal, Val

__all__ = ["strided_slice", "pad_value"]

aten = torch.ops.aten


_BIG = 2**31 - 1


def strided_slice(lw, x: Val, specs: dict, shrink=(), out_shape=None) -> Val:
    """x[specs] in x's own layout: specs maps logical dim -> (start, end, step); ``shrink``
    dims are selected (start only) and dropped. A static slice is written as SLICE (with
    RESHAPEs around it for steps and dropped dims), because XNNPACK delegates SLICE and
    RESHAPE but not a STRIDED_SLICE with a step > 1 or a shrink mask: each such op splits
    the delegated graph and runs on the slower builtin kernel between partitions."""
    shape = lw.out_shape if out_shape is None else out_shape
    if 0 in shape:
        # an empty piece (timm's x[:, :, :num_prefix_tokens] with no prefix tokens): a constant, no op. XNNPACK
        # fails to prepare a graph holding a tensor with a zero-size dim
        return lw.const(np.zeros(shape, x.dtype))
    if _unbinds_permuted_lead(x, specs, shrink):
        # one TRANSPOSE of the whole value (cached for its other pieces) instead of one per piece: a fused qkv
        # projection viewed as heads, permute(2, 0, 3, 1, 4) and split into q, k, v (ViT) leaves each piece in a
        # layout BATCH_MATMUL cannot read; transposed first, each piece is plain and k^T goes as adj_y
        x = lw.with_perm(x, L.identity(x.rank))
    perm = L.drop_dims(x.perm, shrink) if shrink else x.perm
    axes = _slice_axes(x, specs, shrink)
    if axes is not None:
        return _slice_views(lw, x, axes, shape, perm)
    window = _dynamic_window(x, specs, shrink)
    if window is not None:  # unit-step windows on static dims of a dynamic tensor: SLICE, size -1 elsewhere
        begin, size = window
        ins = [lw.tensor(x), lw.const_tensor(begin, np.int32), lw.const_tensor(size, np.int32)]
        return lw.op("SLICE", ins, shape, x.dtype, perm, version=_slice_version(x.rank, x.dtype))
    begin, end, strides = [], [], []
    bmask = emask = smask = 0
    for i, d in enumerate(x.perm):
        if d not in specs:
            begin.append(0)
            end.append(0)
            strides.append(1)
            bmask |= 1 << i
            emask |= 1 << i
            continue
        s, e, st = specs[d]
        n = x.shape[d]
        s = 0 if s is None else int(s)
        if n is not None and s < 0:
            s = max(s + n, 0)
        if d in shrink:
            begin.append(s)
            strides.append(1)
            if s == -1:
                end.append(0)
                emask |= 1 << i
            else:
                end.append(s + 1)
            smask |= 1 << i
            continue
        if e is None or e >= _BIG or (n is not None and e >= n):
            end.append(0)
            emask |= 1 << i
        else:
            e = int(e)
            end.append(max(e + n, 0) if (n is not None and e < 0) else e)
        begin.append(s)
        strides.append(int(st))
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


def _dynamic_window(x: Val, specs: dict, shrink):
    """(begin, size) over x's physical dims when x has dynamic dims and the slice is a unit-step window on static
    dims only (rotary embeddings' halves, a head split): SLICE takes size -1 for "to the end", XNNPACK delegates
    it (STRIDED_SLICE splits its graph). None otherwise."""
    if x.static or shrink or x.rank > 5:
        return None
    begin, size = [], []
    for d in x.perm:
        n = x.shape[d]
        if d not in specs:
            begin.append(0)
            size.append(-1 if n is None else n)
            continue
        s, e, st = specs[d]
        if n is None or st != 1 or isinstance(s, SymVal) or isinstance(e, SymVal):
            return None
        r = range(n)[slice(0 if s is None else int(s), None if e is None or e >= _BIG else int(e))]
        if len(r) == 0:
            return None
        begin.append(r.start)
        size.append(len(r))
    return begin, size


def _unbinds_permuted_lead(x: Val, specs: dict, shrink) -> bool:
    """Whether this slice takes one index of logical dim 0 of a runtime value whose layout holds dim 0 inside
    (not outermost) and is neither plain nor channel-last (the NHWC policy's layout, which its readers want)."""
    if x.is_const or not x.static or x.rank < 3 or x.perm[0] == 0 or list(specs) != [0] or x.shape[0] < 2:
        return False
    if tuple(x.perm) == L.channel_last(x.rank):
        return False
    s, e, step = specs[0]
    s = 0 if s is None else s
    return step == 1 and (0 in shrink or (e is not None and e - s == 1))


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
# start / end may be symbolic (a dynamic size): STRIDED_SLICE with begin / end computed at run time
@lowering(aten.slice.Tensor)
@supported_if(lambda n: not isinstance(arguments(n)["step"], torch.fx.Node))
def slice_(lw, x, dim=0, start=None, end=None, step=1):
    dim %= x.rank
    start, end = (v.value if isinstance(v, SymVal) and v.value is not None else v for v in (start, end))
    if isinstance(start, SymVal) or isinstance(end, SymVal):
        return _sym_slice(lw, x, dim, start, end, step)
    if (start in (None, 0)) and (end is None or end >= _BIG or end == x.shape[dim]) and step == 1:
        return lw.alias(x)
    return strided_slice(lw, x, {dim: (start, end, step)})


def _sym_slice(lw, x: Val, dim, start, end, step) -> Val:
    """x[start:end:step] along ``dim`` with a run-time start or end (STRIDED_SLICE clamps both to the dim's
    extent, as Python slicing does; a negative one counts from the end, as torch's does)."""
    i = x.perm.index(dim)
    mask = sum(1 << j for j in range(x.rank) if j != i)
    begin = [0] * x.rank
    stop = [0] * x.rank
    begin[i] = 0 if start is None else start
    if end is None or (isinstance(end, int) and end >= _BIG):
        stop[i], mask_e = 0, mask | (1 << i)
    else:
        stop[i], mask_e = end, mask
    ins = [lw.tensor(x), lw.shape_tensor(begin, infer=False), lw.shape_tensor(stop, infer=False),
           lw.const_tensor([1] * i + [int(step)] + [1] * (x.rank - i - 1), np.int32)]
    opts = lw.options("StridedSlice", beginMask=mask, endMask=mask_e)
    return lw.op("STRIDED_SLICE", ins, lw.out_shape, x.dtype, x.perm, opts, version=4 if x.rank > 4 else 1)


def _unfold_length_static(n) -> bool:
    a = arguments(n)
    shape = a["self"].meta["val"].shape
    return len(shape) == 0 or isinstance(shape[a["dimension"] % len(shape)], int)


# unfold(Tensor(a) self, int dimension, int size, int step) -> Tensor(a)
# The windows are one GATHER of a constant [n, size] index along ``dimension``; the window dim it puts after
# ``dimension`` is torch's last dim, carried as the value's layout (a transpose only where a reader needs one).
@lowering(aten.unfold.default)
@supported_if(_unfold_length_static)
def unfold(lw, x, dimension, size, step):
    if x.rank == 0:
        return lw.reshape(x, [1])
    d = dimension % x.rank
    n = (x.shape[d] - size) // step + 1
    idx = np.arange(n, dtype=np.int32)[:, None] * step + np.arange(size, dtype=np.int32)[None, :]
    x = lw.with_perm(x, L.identity(x.rank))
    last = x.rank  # the window dim, logically last
    perm = tuple(range(d + 1)) + (last,) + tuple(range(d + 1, last))
    ins = [lw.tensor(x), lw.const_tensor(idx, np.int32)]
    return lw.op("GATHER", ins, lw.out_shape, x.dtype, perm, lw.options("Gather", axis=d))


# select.int(Tensor(a) self, int dim, SymInt index) -> Tensor(a)
@lowering(aten.select.int)
def select(lw, x, dim, index):
    dim %= x.rank
    return strided_slice(lw, x, {dim: (index, None, 1)}, shrink=(dim,))


def _pad_support(n):
    """Constant pads; a negative one (a crop: NASNet's ZeroPad2d((-1, 1, -1, 1))) on a static dim."""
    pad, shape = n.args[1], n.args[0].meta["val"].shape
    if not all(isinstance(p, int) for p in pad):
        return False
    return all(isinstance(shape[len(shape) - 1 - i // 2], int) for i, p in enumerate(pad) if p < 0)


# constant_pad_nd(Tensor self, SymInt[] pad, Scalar value=0) -> Tensor
@lowering(aten.constant_pad_nd.default)
@supported_if(_pad_support)
def constant_pad_nd(lw, x, pad, value=0):
    pairs = _pairs(x.rank, pad)
    if any(p < 0 for pair in pairs for p in pair):
        # negative pads crop: a slice first, then the positive pads
        specs = {d: (max(-lo, 0), x.shape[d] - max(-hi, 0), 1) for d, (lo, hi) in enumerate(pairs)
                 if min(lo, hi) < 0}
        shape = tuple(specs[d][1] - specs[d][0] if d in specs else n for d, n in enumerate(x.shape))
        x = strided_slice(lw, x, specs, out_shape=shape)
        pairs = [[max(lo, 0), max(hi, 0)] for lo, hi in pairs]
        if not any(lo or hi for lo, hi in pairs):
            return x
    return pad_value(lw, x, pairs, value)


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
@supported_if(lambda n: len(arguments(n)["dims"]) > 0 and all(
    isinstance(n.args[0].meta["val"].shape[d], int) for d in arguments(n)["dims"]))  # a static rolled dim
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


# tpu_export::cache_write(Tensor cache, Tensor update, Tensor pos, int dim) -> Tensor
@lowering(torch.ops.tpu_export.cache_write.default)
def cache_write(lw, cache, update, pos, dim):
    """DYNAMIC_UPDATE_SLICE at pos[0] along ``dim`` (0 elsewhere): writes only the new slots, in place when the
    runtime shares the cache's input and output buffers (LiteRT-LM on CPU); the kernel clamps the start like
    the op's eager definition (converter.llm_ops)."""
    dim %= cache.rank
    x = plain(lw, cache)
    start = _cache_start(lw, pos, dim, cache.rank)
    ins = [lw.tensor(x), lw.tensor(plain(lw, lw.cast(update, x.dtype))), lw.tensor(start)]
    out = lw.op("DYNAMIC_UPDATE_SLICE", ins, x.shape, x.dtype)
    if dim == x.rank - 2 and not pos.is_const:
        # where this write's first slot is, for a decode attention reading the cache (edge.attention_prefix)
        lw.memo[("cache_written_at", out.tensor)] = _first_pos(lw, pos)
    return out


def _first_pos(lw, pos):
    """pos[0] as int32 [1], once per signature."""
    key = ("cache_first_pos", pos.tensor, tuple(pos.perm), np.dtype(pos.dtype).name)
    if key not in lw.memo:
        lw.memo[key] = strided_slice(lw, plain(lw, lw.cast(pos, np.int32)), {0: (0, 1, 1)}, out_shape=(1,))
    return lw.memo[key]


def _cache_start(lw, pos, dim: int, rank: int):
    """The int32 [rank] start index (0, ..., pos[0], ..., 0) with pos[0] at ``dim``: written once per signature for
    every cache write reading the same positions at the same dim (each layer's k and v: a CONCATENATION per write, and
    in prefill a SLICE of the positions too, were 2-4 builtin ops per layer in every step)."""
    key = None if pos.is_const else ("cache_write_start", pos.tensor, tuple(pos.perm), np.dtype(pos.dtype).name, dim,
                                     rank)
    if key is not None and key in lw.memo:
        return lw.memo[key]
    first = _first_pos(lw, pos) if not pos.is_const else \
        strided_slice(lw, plain(lw, lw.cast(pos, np.int32)), {0: (0, 1, 1)}, out_shape=(1,))
    zeros = [lw.const(np.zeros(n, np.int32)) for n in (dim, rank - dim - 1)]
    parts = [p for p in (zeros[0], first, zeros[1]) if p.shape[0]]
    start = lw.op("CONCATENATION", [lw.tensor(plain(lw, p)) for p in parts], (rank,), np.int32,
                  opts=lw.options("Concatenation", axis=0), suffix="start") if len(parts) > 1 else first
    if key is not None:
        lw.memo[key] = start
    return start
