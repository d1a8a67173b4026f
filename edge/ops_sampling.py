"""grid_sampler_2d as GATHER_ND: the input laid out [N, H, W, C] is read at the (n, y, x) corners
each grid point needs, and the corners are blended with their bilinear weights (or the nearest
one taken); the result comes out [N, Ho, Wo, C], the output's channel-last layout. cdist in its
direct form.
"""

from __future__ import annotations

import numpy as np
import torch

from .helpers import NHWC, plain, reduce, static_out
from .registry import lowering, supported_if
from .values import Val

__all__ = []

aten = torch.ops.aten


_BILINEAR, _NEAREST = 0, 1


_ZEROS, _BORDER = 0, 1


def _supported(n):
    x, grid = n.args[0].meta["val"], n.args[1].meta["val"]
    static = all(isinstance(d, int) for d in tuple(x.shape) + tuple(grid.shape))
    return static and x.dim() == 4 and x.dtype == torch.float32 and n.args[2] in (_BILINEAR, _NEAREST) \
        and n.args[3] in (_ZEROS, _BORDER)


class _Pointwise:
    """Elementwise builtins on [N, Ho, Wo, 1] tensors (plain layout) and scalar constants."""

    def __init__(self, lw, shape):
        self.lw, self.shape = lw, tuple(shape)

    def t(self, v, dtype=np.float32):
        return self.lw.const_tensor(np.array(v, dtype)) if not isinstance(v, Val) else self.lw.tensor(v)

    def __call__(self, op, a, b=None, dtype=np.float32, out=None, opts=None):
        ins = [self.t(a, dtype)] + ([] if b is None else [self.t(b, dtype)])
        return self.lw.op(op, ins, self.shape, out or dtype, opts=opts, suffix="gs")


def _unnormalize(f, g, size, align_corners, padding_mode):
    # grid coordinate in [-1, 1] -> pixel coordinate, as torch's grid_sampler_compute_source_index
    if align_corners:
        p = f("MUL", f("ADD", g, 1.0), (size - 1) / 2.0)
    else:
        p = f("SUB", f("MUL", f("ADD", g, 1.0), size / 2.0), 0.5)
    if padding_mode == _BORDER:
        p = f("MINIMUM", f("MAXIMUM", p, 0.0), float(size - 1))
    return p


# grid_sampler_2d(Tensor input, Tensor grid, int interpolation_mode, int padding_mode, bool align_corners) -> Tensor
@lowering(aten.grid_sampler_2d.default)
@supported_if(_supported)
def grid_sampler_2d(lw, x, grid, interpolation_mode, padding_mode, align_corners):
    n, c, h, w = x.shape
    _, ho, wo, _ = grid.shape
    pshape = (n, ho, wo, 1)
    f = _Pointwise(lw, pshape)
    g = lw.with_perm(grid, (0, 1, 2, 3))
    (gx_t, gy_t), _ = lw.emit("SPLIT", [lw.const_tensor(np.array(3, np.int32)), lw.tensor(g)], [pshape, pshape],
                              [np.float32] * 2, lw.options("Split", numSplits=2))
    gx, gy = (Val(pshape, np.dtype(np.float32), (0, 1, 2, 3), tensor=t) for t in (gx_t, gy_t))
    ix = _unnormalize(f, gx, w, align_corners, padding_mode)
    iy = _unnormalize(f, gy, h, align_corners, padding_mode)
    xt = lw.tensor(x, NHWC)
    batch = lw.const(np.broadcast_to(np.arange(n, dtype=np.int32).reshape(n, 1, 1, 1), pshape).copy())
    out_shape = (n, c, ho, wo)
    phys = (n, ho, wo, c)

    def corner(yf, xf, weight):
        # weight * input[n, :, y, x], zero when (y, x) falls outside the image
        def inside(v, hi):
            lo_ok = f("GREATER_EQUAL", v, 0.0, out=np.bool_)
            return f("LOGICAL_AND", lo_ok, f("LESS_EQUAL", v, hi, out=np.bool_), out=np.bool_)

        valid = f("LOGICAL_AND", inside(xf, w - 1.0), inside(yf, h - 1.0), out=np.bool_)
        weight = f("MUL", weight, f("CAST", valid))
        xi = f("CAST", f("MINIMUM", f("MAXIMUM", xf, 0.0), w - 1.0), out=np.int32)
        yi = f("CAST", f("MINIMUM", f("MAXIMUM", yf, 0.0), h - 1.0), out=np.int32)
        coords = lw.op("CONCATENATION", [lw.tensor(batch), lw.tensor(yi), lw.tensor(xi)], (n, ho, wo, 3), np.int32,
                       opts=lw.options("Concatenation", axis=3), suffix="gs_coords")
        vals = lw.op("GATHER_ND", [xt, lw.tensor(coords)], phys, np.float32, suffix="gs_corner")
        return lw.op("MUL", [lw.tensor(vals), lw.tensor(weight)], phys, np.float32, opts=lw.options("Mul"),
                     suffix="gs_weighted")

    if interpolation_mode == _NEAREST:
        y = corner(f("ROUND", iy), f("ROUND", ix), lw.const(np.ones(pshape, np.float32)))
    else:
        x0, y0 = f("FLOOR", ix), f("FLOOR", iy)
        x1, y1 = f("ADD", x0, 1.0), f("ADD", y0, 1.0)
        wx1, wy1 = f("SUB", ix, x0), f("SUB", iy, y0)
        wx0, wy0 = f("SUB", 1.0, wx1), f("SUB", 1.0, wy1)
        parts = [corner(y0, x0, f("MUL", wy0, wx0)), corner(y0, x1, f("MUL", wy0, wx1)),
                 corner(y1, x0, f("MUL", wy1, wx0)), corner(y1, x1, f("MUL", wy1, wx1))]
        y = lw.op("ADD_N", [lw.tensor(p) for p in parts], phys, np.float32, suffix="gs_sum")
    return Val(out_shape, np.dtype(np.float32), NHWC, tensor=y.tensor)


# _cdist_forward(Tensor x1, Tensor x2, float p, int? compute_mode) -> Tensor
# |x1[..., i, None, :] - x2[..., None, j, :]| reduced over the last dim: the direct form
# torch uses for small inputs (no |a|^2 + |b|^2 - 2ab cancellation).
@lowering(aten._cdist_forward.default)
@supported_if(lambda n: n.args[2] in (1.0, 2.0, float("inf")) and static_out(n))
def cdist(lw, x1, x2, p, compute_mode=None):
    a, b = plain(lw, x1), plain(lw, x2)
    *batch, pn, m = a.shape
    rn = b.shape[-2]
    a = lw.reshape(a, [*batch, pn, 1, m])
    b = lw.reshape(b, [*batch, 1, rn, m])
    shape = (*batch, pn, rn, m)
    d = lw.op("SUB", [lw.tensor(a), lw.tensor(b)], shape, a.dtype, opts=lw.options("Sub"), suffix="diff")
    last = [len(shape) - 1]
    if p == 2.0:
        return lw.op("SQRT", [lw.tensor(reduce(lw, "SUM", lw.op("SQUARE", [lw.tensor(d)], shape, d.dtype), last,
                                               False))], lw.out_shape, d.dtype)
    ad = lw.op("ABS", [lw.tensor(d)], shape, d.dtype, suffix="abs")
    return reduce(lw, "SUM" if p == 1.0 else "REDUCE_MAX", ad, last, False)
