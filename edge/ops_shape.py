"""Shape and data-movement ops. ``permute`` writes nothing (it only changes the value's
layout); reshapes keep the layout where the moved dims stay contiguous; concat and splits run in
the input's layout with remapped axes; depth/space moves run channel-last.
"""

from __future__ import annotations

import numpy as np
import torch

from tpu_export.converter.registry import arguments

from ..converter import layout as L
from .helpers import NHWC, operand, ref_perm
from .ops_slice import strided_slice
from .registry import lowering, supported_if
from .values import SymVal, Val

__all__ = ["view_shape"]

aten = torch.ops.aten


def view_shape(lw, size) -> list:
    """The target shape of a view/reshape: static dims from the node's aval, dynamic dims as
    the SymVal the graph passed (or None)."""
    out = lw.out_shape
    if None not in out:
        return list(out)
    dims = lw.out_dims
    return [d if d is not None else (size[i] if isinstance(size[i], SymVal) else dims[i]) for i, d in enumerate(out)]


# view(Tensor(a) self, SymInt[] size) -> Tensor(a) ; _unsafe_view / reshape: the same
@lowering(aten.view.default, aten._unsafe_view.default, aten.reshape.default)
def view(lw, x, size):
    if not x.static and _same_sizes(lw.node.args[0].meta.get("val"), lw.node.meta.get("val")):
        # a view to the sizes x already has (attention's [B, H, S, D] after the matmul): nothing to write,
        # where a RESHAPE would need a run-time shape operand (two dynamic dims) that XNNPACK does not take
        return lw.alias(x)
    return lw.reshape(x, view_shape(lw, size))


def _same_sizes(a, b) -> bool:
    """Two fake tensors whose sizes are the same expressions of the inputs' dims."""
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor) or a.dim() != b.dim():
        return False
    expr = [getattr(getattr(d, "node", None), "expr", d) for d in (*a.shape, *b.shape)]
    return all(x == y for x, y in zip(expr[:a.dim()], expr[a.dim():]))


# squeeze.dims(Tensor(a) self, int[] dim) -> Tensor(a) ; squeeze.dim / squeeze.default ; unsqueeze(self, int dim)
@lowering(aten.squeeze.dims, aten.squeeze.dim, aten.squeeze.default, aten.unsqueeze.default)
def squeeze(lw, x, *dims):
    return lw.reshape(x, lw.out_shape if None not in lw.out_shape else lw.out_dims)


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
        x = lw.reshape(x, [1] * (rank - x.rank) + lw.dims(x))
    t = operand(lw, x, rank, perm)
    off = rank - x.rank
    dims = []
    for i, d in enumerate(shape):
        if d is None:  # a dynamic size: the graph's SymInt, or (for -1) the input's own dim
            d = size[i] if isinstance(size[i], SymVal) else SymVal(None, ("dim", x, i - off))
        dims.append(d)
    tin = lw.sg.tensors[t]
    phys_in = list(tin.shapeSignature) if tin.shapeSignature is not None else list(tin.shape)  # -1: dynamic
    # the axes expand grows (a dynamic axis of x stays as it is: only size-1 axes grow)
    grown = [i for i, p in enumerate(perm) if phys_in[i] != -1 and phys_in[i] != (-1 if shape[p] is None else shape[p])]
    if len(grown) == 1 and shape[perm[grown[0]]] is not None and 2 <= shape[perm[grown[0]]] <= 4 \
            and not x.is_const:
        # a few copies along one axis (GQA's repeat_kv): XNNPACK delegates CONCATENATION, not
        # BROADCAST_TO, which would split the delegated graph around it
        opts = lw.options("Concatenation", axis=grown[0], fusedActivationFunction=0)
        return lw.op("CONCATENATION", [t] * shape[perm[grown[0]]], shape, x.dtype, perm, opts)
    shape_t = lw.shape_tensor([dims[p] for p in perm], infer=False)
    return lw.op("BROADCAST_TO", [t, shape_t], shape, x.dtype, perm)


# cat(Tensor[] tensors, int dim=0) -> Tensor
@lowering(aten.cat.default)
def cat(lw, tensors, dim=0):
    shape = lw.out_shape
    dtype = lw.out_dtype
    rank = len(shape)
    dim %= rank
    # empty pieces add nothing (and XNNPACK fails to prepare a tensor with a zero-size dim): left out
    vals = [lw.cast(t, dtype) for t in tensors if not (t.rank == 1 and t.shape[0] == 0) and 0 not in t.shape]
    if not vals:
        return lw.const(np.zeros(shape, dtype))
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


# repeat(Tensor self, SymInt[] repeats) -> Tensor
@lowering(aten.repeat.default)
def repeat(lw, x, repeats):
    shape = lw.out_shape
    rank = len(shape)
    perm = ref_perm([x], rank)
    t = operand(lw, x, rank, perm) if x.rank == rank or not L.is_identity(perm) else \
        lw.tensor(lw.reshape(x, [1] * (rank - x.rank) + lw.dims(x)))
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


# clone(Tensor self, *, MemoryFormat? memory_format=None) -> Tensor ; alias/detach/lift_fresh_copy
@lowering(aten.clone.default, aten.alias.default, aten.detach.default, aten.lift_fresh_copy.default)
def clone(lw, x, *_):
    return lw.alias(x)


def _channel_gather(lw, x: Val, order, shape) -> Val:
    ins = [lw.tensor(x, NHWC), lw.const_tensor(np.asarray(order, np.int32))]
    return lw.op("GATHER", ins, shape, x.dtype, NHWC, lw.options("Gather", axis=3), suffix="channels")


# pixel_shuffle(Tensor self, int upscale_factor) -> Tensor
# torch orders input channels (c, i, j); DEPTH_TO_SPACE reads (i, j, c): reorder with a GATHER first.
@lowering(aten.pixel_shuffle.default)
@supported_if(lambda n: n.args[0].meta["val"].dim() == 4)
def pixel_shuffle(lw, x, r):
    c = x.shape[1] // (r * r)
    if c > 1:
        order = np.arange(c * r * r).reshape(c, r * r).T.reshape(-1)
        x = _channel_gather(lw, x, order, x.shape)
    return lw.op("DEPTH_TO_SPACE", [lw.tensor(x, NHWC)], lw.out_shape, x.dtype, NHWC,
                 lw.options("DepthToSpace", blockSize=r))


# pixel_unshuffle(Tensor self, int downscale_factor) -> Tensor
@lowering(aten.pixel_unshuffle.default)
@supported_if(lambda n: n.args[0].meta["val"].dim() == 4)
def pixel_unshuffle(lw, x, r):
    out = lw.out_shape
    c = x.shape[1]
    y = lw.op("SPACE_TO_DEPTH", [lw.tensor(x, NHWC)], out, x.dtype, NHWC, lw.options("SpaceToDepth", blockSize=r))
    if c > 1:
        order = np.arange(c * r * r).reshape(r * r, c).T.reshape(-1)
        y = _channel_gather(lw, y, order, out)
    return y


# diagonal(Tensor(a) self, int offset=0, int dim1=0, int dim2=1) -> Tensor(a)
# GATHER_ND on x laid out (dim1, dim2, rest...); the diagonal comes out first and is the last
# logical dim, so the result only carries a layout, no TRANSPOSE.
@lowering(aten.diagonal.default)
@supported_if(lambda n: all(isinstance(d, int) for d in n.args[0].meta["val"].shape))
def diagonal(lw, x, offset=0, dim1=0, dim2=1):
    d1, d2 = dim1 % x.rank, dim2 % x.rank
    rest = [d for d in range(x.rank) if d not in (d1, d2)]
    shape = lw.out_shape
    n = shape[-1]
    i = np.arange(n, dtype=np.int32)
    coords = np.stack([i, i + offset] if offset >= 0 else [i - offset, i], -1).astype(np.int32)
    xt = lw.tensor(x, (d1, d2, *rest))
    perm = (len(rest), *range(len(rest)))
    return lw.op("GATHER_ND", [xt, lw.const_tensor(coords)], shape, x.dtype, perm)
