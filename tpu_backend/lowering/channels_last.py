"""The TPU program's layout plan: convolution activations channels-last (NHWC), as a JAX model writes them.

libtpu compiles a convolutional network whose activations are NCHW far slower than the same network in NHWC,
whether the convolutions are handed over NCHW or wrapped in transposes one by one (one RegNetY-400MF stage,
float32 at HIGHEST on a v6e chip: 75 s NHWC, 177 s NCHW with channels-last grouped convs, 425 s all NCHW; see
docs/tpu.md, "Compile time"). So the TPU form of a signature keeps each 2-d convolution's output channels-last
and carries that layout through the ops that do not care about it, the way the edge backend lays out a LiteRT
graph (converter.layout): pointwise ops, reductions, max pooling, permutes and reshapes take the physical array
as it is; every other op, and every signature output, gets the logical (torch) array back through one transpose.

``channels_last_rewrite(sig, base)`` returns a GraphRewrite carrying ``base`` (the other pre-passes) plus the
plan's lowerings, or None where the signature has no 2-d convolution. Values keep their logical shapes in the
graph's metadata; ``perm`` says which logical dim each physical dim holds.
"""

from __future__ import annotations

import dataclasses
import operator

import jax.numpy as jnp
import torch
from jax import lax

from tpu_export.converter import layout as L
from tpu_export.converter.registry import arguments, bind_args

from . import ops_elementwise
from .helpers import cast, ntuple
from .ops_conv import _pointwise_on_one_pixel
from .ops_pool import _max_init, _windows

__all__ = ["channels_last_rewrite"]

aten = torch.ops.aten

# Ops whose every output element reads only the same-index elements of its (broadcast) tensor operands.
_POINTWISE = frozenset(ops_elementwise._UNARY) | frozenset(ops_elementwise._BINARY) | {
    aten.add.Tensor, aten.add.Scalar, aten.sub.Tensor, aten.sub.Scalar, aten.rsub.Tensor, aten.rsub.Scalar,
    aten.mul.Tensor, aten.mul.Scalar, aten.div.Tensor, aten.div.Scalar, aten.pow.Tensor_Scalar,
    aten.pow.Tensor_Tensor, aten.clamp.default, aten.clamp.Tensor, aten.clamp_min.default, aten.clamp_max.default,
    aten.where.self, aten.relu.default, aten.hardtanh.default, aten.leaky_relu.default, aten.elu.default,
    aten.gelu.default, aten.silu.default, aten.mish.default, aten.hardswish.default, aten.hardsigmoid.default,
    aten.sigmoid.default, aten._prelu_kernel.default,
}
_REDUCTIONS = {aten.mean.dim, aten.sum.dim_IntList, aten.amax.default, aten.amin.default}
_MAX_POOLS = {aten.max_pool2d_with_indices.default, aten.max_pool2d.default}
_CL4 = L.channel_last(4)


def _val(node):
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else None


def _static_shape(node):
    v = _val(node)
    if not isinstance(v, torch.Tensor) or not all(isinstance(d, int) for d in v.shape):
        return None
    return tuple(v.shape)


def _rank(node):
    v = _val(node)
    return v.dim() if isinstance(v, torch.Tensor) else None


def _to(x, src, dst):
    """The physical array ``x`` in layout ``src`` moved to layout ``dst`` (None: logical)."""
    src = src or L.identity(x.ndim)
    dst = dst or L.identity(x.ndim)
    return x if tuple(src) == tuple(dst) else jnp.transpose(x, L.transpose_perm(src, dst))


def _or_none(perm):
    return None if perm is None or L.is_identity(perm) else tuple(perm)


class _Plan:
    def __init__(self, base, options):
        from .interpreter import lowering_of

        self.lowering_of = lambda n: lowering_of(n, options)
        self.base = base
        self.perm: dict = {}  # node -> the layout of its value in the TPU form (absent: logical)
        self.lowerings: dict = {}

    def layout_of(self, a):
        return self.perm.get(a) if isinstance(a, torch.fx.Node) else None

    # ------------------------------------------------------------------ the rules: (fn, out perm) or None

    def conv(self, n):
        a = arguments(n)
        x, w = a["input"], a["weight"]
        if a["transposed"] or _rank(x) != 4 or _rank(w) != 4:
            return None
        src = self.layout_of(x)
        stride, padding, dilation = ntuple(a["stride"], 2), ntuple(a["padding"], 2), ntuple(a["dilation"], 2)
        groups = a["groups"]
        pixel = _pointwise_on_one_pixel(_val(x), _val(w), stride, padding, dilation, groups)

        def lower(ctx, x, weight, bias, *_):
            dt = ctx.out_dtype
            x, weight = _to(cast(x, dt), src, _CL4), cast(weight, dt)
            if pixel:  # a squeeze-excite 1x1 conv on the pooled vector: the matmul it is
                y = jnp.einsum("nhwi,oi->nhwo", x, weight[:, :, 0, 0], precision=ctx.precision())
            else:
                y = lax.conv_general_dilated(
                    x, jnp.transpose(weight, (2, 3, 1, 0)), window_strides=stride,
                    padding=[(p, p) for p in padding], rhs_dilation=dilation,
                    dimension_numbers=("NHWC", "HWIO", "NHWC"), feature_group_count=groups,
                    precision=ctx.precision())
            return y if bias is None else y + cast(bias, dt)

        return lower, _CL4

    def pointwise(self, n):
        out_rank = _rank(n)
        args = bind_args(n)
        laid = [self.layout_of(a) for a in args]
        out = next((p for p in laid if p is not None and len(p) == out_rank), None)
        if out is None or any(isinstance(a, (list, tuple)) for a in args):
            return None
        tensors = [_rank(a) for a in args]
        if any(r is not None and r > out_rank for r in tensors):
            return None
        orig = self.lowering_of(n)

        def lower(ctx, *vals):
            moved = []
            for v, r, p in zip(vals, tensors, laid):
                if p is not None and len(p) != out_rank:  # laid out at a lower rank: torch's layout, then broadcast
                    v, p = _to(v, p, None), None
                if r is None or not hasattr(v, "ndim"):
                    moved.append(v)
                elif p is not None:
                    moved.append(_to(v, p, out))
                else:  # a logical operand broadcast against the laid-out one: leading 1s, then the same layout
                    moved.append(jnp.transpose(jnp.reshape(v, (1,) * (out_rank - v.ndim) + tuple(v.shape)), out))
            return orig(ctx, *moved)

        return lower, out

    def reduction(self, n):
        a = arguments(n)
        src = self.layout_of(a["self"])
        dims = a.get("dim")
        if src is None or dims is None or (isinstance(dims, (list, tuple)) and not dims):
            return None
        rank = len(src)
        dims = [d % rank for d in ((dims,) if isinstance(dims, int) else dims)]
        physical = [src.index(d) for d in dims]
        out = src if a.get("keepdim") else L.drop_dims(src, dims)
        orig = self.lowering_of(n)
        at = list(a).index("dim")

        def lower(ctx, *vals):
            vals = list(vals)
            vals[at] = physical
            return orig(ctx, *vals)

        return lower, _or_none(out)

    def permute(self, n):
        a = arguments(n)
        src = self.layout_of(a["self"])
        if src is None:
            return None
        inv = L.inverse([d % len(src) for d in a["dims"]])
        out = tuple(inv[d] for d in src)  # the data stays put; only which logical dim each axis holds changes
        return (lambda ctx, x, dims: x), _or_none(out)

    def view(self, n):
        a = arguments(n)
        src = self.layout_of(a["self"])
        old, new = _static_shape(a["self"]), _static_shape(n)
        if src is None or old is None or new is None:
            return None
        need, out = L.plan_reshape(old, src, new)
        if tuple(need) != tuple(src):
            return None
        physical = tuple(new[d] for d in out)
        return (lambda ctx, x, size: jnp.reshape(x, physical)), _or_none(out)

    def max_pool(self, n):
        a = arguments(n)
        src = self.layout_of(a["self"])
        if src != _CL4 or (n.target is aten.max_pool2d_with_indices.default
                           and any(u.args[1] != 0 for u in n.users if u.target is operator.getitem)):
            return None
        logical = _val(a["self"])

        def lower(ctx, x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
            win, strides, pads, dil, _ = _windows(logical, 2, kernel_size, stride, padding, dilation, ceil_mode)
            pick = lambda t: tuple(t[d] for d in src)
            y = lax.reduce_window(x, _max_init(x.dtype), lax.max, pick(win), pick(strides), pick(pads),
                                  window_dilation=pick(dil))
            return (y, None) if n.target is aten.max_pool2d_with_indices.default else y

        return lower, src

    def getitem(self, n):
        src, i = n.args
        if not isinstance(self.layout_of(src), dict):
            return None
        return (lambda ctx, t, i: t[i]), self.perm[src].get(i)

    # ------------------------------------------------------------------ the walk

    def rule(self, n):
        t = n.target
        if t is aten.convolution.default:
            return self.conv(n)
        if t is operator.getitem:
            return self.getitem(n)
        if not any(isinstance(a, torch.fx.Node) and a in self.perm for a in n.all_input_nodes):
            return None
        if t in _POINTWISE:
            return self.pointwise(n)
        if t in _REDUCTIONS:
            return self.reduction(n)
        if t is aten.permute.default:
            return self.permute(n)
        if t in (aten.view.default, aten._unsafe_view.default, aten.reshape.default):
            return self.view(n)
        if t in _MAX_POOLS:
            return self.max_pool(n)
        return None

    def visit(self, n):
        taken = n in self.base.lowerings or n in self.base.skip
        found = None if taken else self.rule(n)
        if found is not None:
            fn, out = found
            self.lowerings[n] = (fn, bind_args(n) if n.target is not operator.getitem else list(n.args))
            if out is not None:
                if n.target is aten.max_pool2d_with_indices.default:
                    out = {0: out}
                self.perm[n] = out
            return
        if n in self.base.skip:
            return
        fn, args = self.base.lowerings[n] if taken else (None, bind_args(n))
        perms = _structure(args, self.perm)
        if perms is None:
            return
        if fn is None:
            fn = self.lowering_of(n)
        self.lowerings[n] = (_logical_args(fn, perms), args)


class _Laid(tuple):
    """A leaf of _structure: the layout of the value at that place in the arguments."""


def _structure(args, perm):
    """``args`` with each laid-out Node replaced by its _Laid layout and everything else by None; None if none is."""
    found = False

    def walk(a):
        nonlocal found
        if isinstance(a, (list, tuple)):
            return [walk(x) for x in a]
        p = perm.get(a) if isinstance(a, torch.fx.Node) else None
        if isinstance(p, dict):  # a tuple-valued node read whole: not planned (its getitems are)
            p = None
        found = found or p is not None
        return _Laid(p) if p is not None else None

    s = walk(args)
    return s if found else None


def _logical_args(fn, perms):
    def fix(v, p):
        if isinstance(p, _Laid):
            return _to(v, p, None)
        if isinstance(p, list):
            return type(v)(fix(x, q) for x, q in zip(v, p))
        return v

    def lower(ctx, *args):
        return fn(ctx, *[fix(a, p) for a, p in zip(args, perms)])

    return lower


def channels_last_rewrite(sig, base, options):
    """A GraphRewrite for the TPU form of ``sig``: ``base``'s lowerings and the channels-last plan's, with
    ``outputs`` moving laid-out signature outputs back to torch's layout. None where no 2-d conv is planned."""
    plan = _Plan(base, options)
    for n in sig.graph.nodes:
        if n.op == "call_function":
            plan.visit(n)
    if not any(n.target is aten.convolution.default for n in plan.perm):
        return None
    outputs = {n: (lambda x, p=plan.perm[n]: _to(x, p, None)) for n in sig.output_nodes()
               if n in plan.perm and not isinstance(plan.perm[n], dict)}
    return dataclasses.replace(base, lowerings={**base.lowerings, **plan.lowerings},
                               outputs={**base.outputs, **outputs})
