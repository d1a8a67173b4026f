"""Pooling: max pool (with indices), avg pool (ceil_mode, padding, count_include_pad,
divisor_override) and adaptive avg/max pool, for 1/2/3 spatial dims on lax.reduce_window."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from .helpers import acc_dtype, cast, ntuple
from .registry import lowering

aten = torch.ops.aten


def _pool_geometry(size, k, s, p, d, ceil_mode):
    """Output length and high-side padding of one spatial dim, with torch's ceil_mode rule
    (the last window must start inside the input or its left padding)."""
    span = d * (k - 1) + 1
    num = size + 2 * p - span
    out = (-(-num // s) if ceil_mode else num // s) + 1
    if ceil_mode and (out - 1) * s >= size + p:
        out -= 1
    hi = max((out - 1) * s + span - size - p, 0)
    return out, hi


def _max_init(dtype):
    """The identity of max for ``dtype``: -inf for floats, the smallest integer otherwise."""
    return jnp.asarray(-jnp.inf if jnp.issubdtype(dtype, jnp.floating) else jnp.iinfo(dtype).min, dtype)


def _windows(x, nd, kernel, stride, padding, dilation, ceil_mode):
    lead = x.ndim - nd
    kernel = ntuple(kernel, nd)
    stride = ntuple(stride, nd) if stride else kernel
    padding, dilation = ntuple(padding, nd), ntuple(dilation, nd)
    pads, outs = [], []
    for i in range(nd):
        out, hi = _pool_geometry(int(x.shape[lead + i]), kernel[i], stride[i], padding[i], dilation[i], ceil_mode)
        pads.append((padding[i], hi))
        outs.append(out)
    return (
        (1,) * lead + kernel,
        (1,) * lead + stride,
        [(0, 0)] * lead + pads,
        (1,) * lead + dilation,
        outs,
    )


def _max_pool(ctx, x, nd, kernel, stride, padding, dilation, ceil_mode):
    win, strides, pads, dil, _ = _windows(x, nd, kernel, stride, padding, dilation, ceil_mode)
    init = _max_init(x.dtype)
    if 1 not in ctx.used_outputs():
        values = lax.reduce_window(x, init, lax.max, win, strides, pads, window_dilation=dil)
        return values, None
    # Indices: flat position in the input's spatial plane; ties go to the first, as torch.
    spatial = x.shape[x.ndim - nd:]
    flat = lax.broadcasted_iota(jnp.int32, (int(np.prod(spatial)),), 0).reshape(spatial)
    flat = jnp.broadcast_to(flat, x.shape)

    def pick(a, b):
        (va, ia), (vb, ib) = a, b
        take_a = (va > vb) | ((va == vb) & (ia < ib)) | jnp.isnan(va)
        return jnp.where(take_a, va, vb), jnp.where(take_a, ia, ib)

    values, indices = lax.reduce_window(
        (x, flat), (init, jnp.asarray(np.iinfo(np.int32).max, jnp.int32)), pick, win, strides, pads,
        window_dilation=dil,
    )
    return values, indices


# aten::max_pool2d_with_indices(Tensor self, int[2] kernel_size, int[2] stride=[], int[2] padding=0,
#     int[2] dilation=1, bool ceil_mode=False) -> (Tensor, Tensor)
@lowering(aten.max_pool2d_with_indices.default)
def max_pool2d_with_indices(ctx, x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    return _max_pool(ctx, x, 2, kernel_size, stride, padding, dilation, ceil_mode)


# aten::max_pool3d_with_indices(Tensor self, int[3] kernel_size, int[3] stride=[], int[3] padding=0,
#     int[3] dilation=1, bool ceil_mode=False) -> (Tensor, Tensor)
@lowering(aten.max_pool3d_with_indices.default)
def max_pool3d_with_indices(ctx, x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    return _max_pool(ctx, x, 3, kernel_size, stride, padding, dilation, ceil_mode)


# aten::max_pool2d(Tensor self, int[2] kernel_size, int[2] stride=[], int[2] padding=0,
#     int[2] dilation=1, bool ceil_mode=False) -> Tensor
@lowering(aten.max_pool2d.default)
def max_pool2d(ctx, x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    win, strides, pads, dil, _ = _windows(x, 2, kernel_size, stride, padding, dilation, ceil_mode)
    return lax.reduce_window(x, _max_init(x.dtype), lax.max, win, strides, pads, window_dilation=dil)


def _avg_pool(ctx, x, nd, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override):
    acc = acc_dtype(ctx.out_dtype)
    win, strides, pads, dil, _ = _windows(x, nd, kernel, stride, padding, 1, ceil_mode)
    total = lax.reduce_window(cast(x, acc), jnp.asarray(0, acc), lax.add, win, strides, pads)
    if divisor_override:
        return total / divisor_override
    # Divisor per window (static): with count_include_pad, the window clipped to the padded
    # input (ceil_mode overhang excluded); without, the real input elements it covers.
    spatial = tuple(int(d) for d in x.shape[x.ndim - nd:])
    ones = jnp.ones(spatial, acc)
    sp_pads = pads[x.ndim - nd:]
    sp_win, sp_strides = win[x.ndim - nd:], strides[x.ndim - nd:]
    if count_include_pad:
        # ones over [-p, size+p), zeros over the ceil_mode overhang beyond it
        ones = lax.pad(ones, jnp.asarray(1, acc), [(lo, min(hi, lo), 0) for lo, hi in sp_pads])
        ones = lax.pad(ones, jnp.asarray(0, acc), [(0, max(hi - lo, 0), 0) for lo, hi in sp_pads])
        counts = lax.reduce_window(ones, jnp.asarray(0, acc), lax.add, sp_win, sp_strides, [(0, 0)] * nd)
    else:
        counts = lax.reduce_window(ones, jnp.asarray(0, acc), lax.add, sp_win, sp_strides, sp_pads)
    return total / counts


# aten::avg_pool2d(Tensor self, int[2] kernel_size, int[2] stride=[], int[2] padding=0, bool ceil_mode=False,
#     bool count_include_pad=True, int? divisor_override=None) -> Tensor
@lowering(aten.avg_pool2d.default)
def avg_pool2d(ctx, x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    return _avg_pool(ctx, x, 2, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)


# aten::avg_pool1d(Tensor self, int[1] kernel_size, int[1] stride=[], int[1] padding=0, bool ceil_mode=False,
#     bool count_include_pad=True) -> Tensor
@lowering(aten.avg_pool1d.default)
def avg_pool1d(ctx, x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True):
    return _avg_pool(ctx, x, 1, kernel_size, stride, padding, ceil_mode, count_include_pad, None)


# aten::avg_pool3d(Tensor self, int[3] kernel_size, int[3] stride=[], int[3] padding=0, bool ceil_mode=False,
#     bool count_include_pad=True, int? divisor_override=None) -> Tensor
@lowering(aten.avg_pool3d.default)
def avg_pool3d(ctx, x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    return _avg_pool(ctx, x, 3, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)


def _adaptive_matrix(size: int, out: int) -> np.ndarray:
    """(out, size) averaging matrix of torch's adaptive pooling bins
    [floor(i*size/out), ceil((i+1)*size/out))."""
    m = np.zeros((out, size), np.float32)
    for i in range(out):
        lo, hi = (i * size) // out, -(-((i + 1) * size) // out)
        m[i, lo:hi] = 1.0 / (hi - lo)
    return m


def _adaptive_avg(ctx, x, output_size, nd):
    acc = acc_dtype(ctx.out_dtype)
    y = cast(x, acc)
    out = ntuple(output_size, nd)
    lead = x.ndim - nd
    for i in range(nd):
        axis = lead + i
        size = int(x.shape[axis])
        if size % out[i] == 0:  # equal bins: a reshape-mean, exact and cheap
            shape = tuple(y.shape[:axis]) + (out[i], size // out[i]) + tuple(y.shape[axis + 1:])
            y = jnp.mean(y.reshape(shape), axis=axis + 1)
        else:
            m = jnp.asarray(_adaptive_matrix(size, out[i]), acc)
            y = jnp.moveaxis(jnp.tensordot(y, m, axes=([axis], [1]), precision=ctx.precision(acc)), -1, axis)
    return y


# aten::_adaptive_avg_pool2d(Tensor self, SymInt[2] output_size) -> Tensor
@lowering(aten._adaptive_avg_pool2d.default)
def adaptive_avg_pool2d(ctx, x, output_size):
    return _adaptive_avg(ctx, x, output_size, 2)


# aten::_adaptive_avg_pool3d(Tensor self, SymInt[3] output_size) -> Tensor
@lowering(aten._adaptive_avg_pool3d.default)
def adaptive_avg_pool3d(ctx, x, output_size):
    return _adaptive_avg(ctx, x, output_size, 3)


# aten::adaptive_avg_pool1d(Tensor self, int[1] output_size) -> Tensor
@lowering(aten.adaptive_avg_pool1d.default)
def adaptive_avg_pool1d(ctx, x, output_size):
    return _adaptive_avg(ctx, x, output_size, 1)


# aten::adaptive_max_pool2d(Tensor self, int[2] output_size) -> (Tensor, Tensor)
@lowering(aten.adaptive_max_pool2d.default)
def adaptive_max_pool2d(ctx, x, output_size):
    out = ntuple(output_size, 2)
    h, w = int(x.shape[-2]), int(x.shape[-1])
    rows = []
    for i in range(out[0]):
        h0, h1 = (i * h) // out[0], -(-((i + 1) * h) // out[0])
        cols = []
        for j in range(out[1]):
            w0, w1 = (j * w) // out[1], -(-((j + 1) * w) // out[1])
            patch = x[..., h0:h1, w0:w1].reshape(tuple(x.shape[:-2]) + (-1,))
            k = jnp.argmax(patch, axis=-1)
            cols.append((jnp.max(patch, axis=-1), (h0 + k // (w1 - w0)) * w + w0 + k % (w1 - w0)))
        rows.append((jnp.stack([c[0] for c in cols], -1), jnp.stack([c[1] for c in cols], -1)))
    return jnp.stack([r[0] for r in rows], -2), jnp.stack([r[1] for r in rows], -2)
