"""aten.convolution: 1/2/3-d, strided, padded, dilated, grouped and transposed, on
lax.conv_general_dilated in torch's channels-first layout. The TPU's program computes batched 2-d convolutions
channels-last instead (channels_last.py)."""

from __future__ import annotations

import jax.numpy as jnp
import torch
from jax import lax

from .helpers import cast, ntuple
from .registry import lowering

aten = torch.ops.aten

_SPATIAL = "DHW"


def _dimension_numbers(nd: int):
    sp = _SPATIAL[-nd:] if nd <= 3 else None
    if sp is None:
        raise NotImplementedError(f"{nd}-d convolution")
    return ("NC" + sp, "OI" + sp, "NC" + sp)


def _transposed_kernel(w, groups: int, nd: int):
    """torch's (Cin, Cout/g, k...) transposed-conv weight -> the (Cout, Cin/g, k...) kernel of the
    equivalent direct conv: swap in/out per group and flip every spatial axis."""
    cin, cout_g = w.shape[0], w.shape[1]
    k = w.shape[2:]
    w = w.reshape((groups, cin // groups, cout_g) + tuple(k))
    w = jnp.swapaxes(w, 1, 2).reshape((groups * cout_g, cin // groups) + tuple(k))
    return jnp.flip(w, axis=tuple(range(2, 2 + nd)))


def _depthwise_taps(x, w, stride, padding, dilation):
    """A 2-d depthwise conv (one filter per channel) as a sum over the k*k kernel taps of strided
    input slices times per-channel weights: one fused elementwise loop on XLA:CPU. Sums in f32."""
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    kh, kw = w.shape[2], w.shape[3]
    acc_dt = jnp.promote_types(x.dtype, jnp.float32)
    xp = jnp.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    ho = (xp.shape[2] - dh * (kh - 1) - 1) // sh + 1
    wo = (xp.shape[3] - dw * (kw - 1) - 1) // sw + 1

    def taps(xp, w):
        y = None
        for i in range(kh):
            for j in range(kw):
                tap = xp[:, :, i * dh: i * dh + sh * (ho - 1) + 1: sh, j * dw: j * dw + sw * (wo - 1) + 1: sw]
                t = tap.astype(acc_dt) * w[:, 0, i, j].astype(acc_dt)[None, :, None, None]
                y = t if y is None else y + t
        return y.astype(x.dtype)

    # Computed once, in a conditional whose two branches are the same: XLA:CPU fuses an elementwise chain into
    # each of its consumers and would recompute every tap there, in their layout (a ConvNeXt block's LayerNorm
    # reads it three times, channels-last: 40x the taps' own time); a conditional's result is a buffer.
    return lax.cond(jnp.isnan(w.reshape(-1)[0]), taps, taps, xp, w)


def _im2col(x, w, stride, padding, dilation, precision):
    """A 2-d dense conv as one matmul: the k*k strided input slices stacked into (N, k*k*Cin, Ho*Wo)
    patches, times the (k*k*Cin, Cout) kernel. Same math, summed in the matmul's f32 accumulator.

    The kernel matrix is read in HWIO order, the order the exported kernels are stored in
    (tpu_backend.weight_layout): the transpose here and the one that unpacks the stored kernel cancel, so the
    call reads the stored array as it is instead of copying every kernel."""
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    n, c = x.shape[0], x.shape[1]
    o, kh, kw = w.shape[0], w.shape[2], w.shape[3]
    xp = jnp.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    ho = (xp.shape[2] - dh * (kh - 1) - 1) // sh + 1
    wo = (xp.shape[3] - dw * (kw - 1) - 1) // sw + 1
    taps = [xp[:, :, i * dh: i * dh + sh * (ho - 1) + 1: sh, j * dw: j * dw + sw * (wo - 1) + 1: sw]
            for i in range(kh) for j in range(kw)]
    patches = jnp.stack(taps, axis=1).reshape(n, kh * kw * c, ho * wo)  # rows ordered (i, j, c), as HWIO's
    kernel = jnp.transpose(w, (2, 3, 1, 0)).reshape(kh * kw * c, o)
    y = jnp.einsum("ko,nkp->nop", kernel, patches, precision=precision)
    return y.reshape(n, o, ho, wo)


def _pointwise_on_one_pixel(x, weight, stride, padding, dilation, groups: int) -> bool:
    """A dense 1x1 conv, unpadded, over a 1x1 input: ``y[n, o] = sum_i w[o, i] x[n, i]``."""
    return (x.ndim == 4 and groups == 1 and tuple(x.shape[2:]) == (1, 1) and tuple(weight.shape[2:]) == (1, 1)
            and not any(padding))


def _im2col_faster_on_cpu(x, weight, groups: int) -> bool:
    """Where XLA:CPU's convolution is slower than the same matmul (one thread, jax 0.10.2, measured by
    bench/cpu_conv.py): every 1x1 conv (the matmul is 1.1-2.7x faster: MobileNet/ResNet-50 pointwise
    convs, 2048->512 at 7x7 2.7x) and wide k*k convs (3x3, stride 1 or 2: 256ch at 7x7 1.3x, 512ch 1.4x,
    1024ch 2.1x); narrower k*k convs (64-128ch: 0.6-0.9x) keep the convolution."""
    k = weight.shape[2] * weight.shape[3]
    return groups == 1 and (k == 1 or (weight.shape[1] * k >= 2304 and weight.shape[0] >= 256))


# aten::convolution(Tensor input, Tensor weight, Tensor? bias, SymInt[] stride, SymInt[] padding,
#     SymInt[] dilation, bool transposed, SymInt[] output_padding, SymInt groups) -> Tensor
@lowering(aten.convolution.default)
def convolution(ctx, x, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    dt = ctx.out_dtype
    x, weight = cast(x, dt), cast(weight, dt)
    unbatched = x.ndim == weight.ndim - 1
    if unbatched:
        x = x[None]
    nd = weight.ndim - 2
    stride, dilation = ntuple(stride, nd), ntuple(dilation, nd)
    padding, output_padding = ntuple(padding, nd), ntuple(output_padding, nd)
    dn = _dimension_numbers(nd)
    if not transposed:
        def direct(x, weight):
            return lax.conv_general_dilated(
                x, weight, window_strides=stride, padding=[(p, p) for p in padding], rhs_dilation=dilation,
                dimension_numbers=dn, feature_group_count=groups, precision=ctx.precision(),
            )

        if _pointwise_on_one_pixel(x, weight, stride, padding, dilation, groups):
            # a squeeze-excite layer: a matmul over channels, lowered as one, as a JAX model writes it (TPU
            # compilers plan a convolution at 1x1 spatial size like any other; RegNetY's 32 of them on one v6e
            # chip at float32 cost more compile time than the rest of the model)
            y = jnp.einsum("oi,ni->no", weight[:, :, 0, 0], x[:, :, 0, 0], precision=ctx.precision())[:, :, None, None]
        elif nd == 2 and groups > 1 and groups == x.shape[1] == weight.shape[0] and weight.shape[1] == 1:
            # XLA:CPU runs a depthwise conv ~10x slower than the same math as k*k fused multiply-adds;
            # TPUs and GPUs keep their native convolution.
            y = lax.platform_dependent(
                x, weight, cpu=lambda x, w: _depthwise_taps(x, w, stride, padding, dilation), default=direct)
        elif nd == 2 and _im2col_faster_on_cpu(x, weight, groups):
            prec = ctx.precision()
            y = lax.platform_dependent(
                x, weight, cpu=lambda x, w: _im2col(x, w, stride, padding, dilation, prec), default=direct)
        else:
            y = direct(x, weight)
    else:
        # A transposed conv is the direct conv of the stride-dilated input with the flipped kernel,
        # padded by dilation*(k-1)-padding (+output_padding on the high side).
        kernel = _transposed_kernel(weight, groups, nd)
        k = weight.shape[2:]
        pads = [(d * (kk - 1) - p, d * (kk - 1) - p + op)
                for kk, d, p, op in zip(k, dilation, padding, output_padding)]
        crop = [(max(-lo, 0), max(-hi, 0)) for lo, hi in pads]
        y = lax.conv_general_dilated(
            x, kernel, window_strides=(1,) * nd, padding=[(max(lo, 0), max(hi, 0)) for lo, hi in pads],
            lhs_dilation=stride, rhs_dilation=dilation, dimension_numbers=dn, feature_group_count=groups,
            precision=ctx.precision(),
        )
        if any(c != (0, 0) for c in crop):
            y = y[(slice(None), slice(None)) + tuple(slice(lo, y.shape[2 + i] - hi) for i, (lo, hi) in enumerate(crop))]
    if bias is not None:
        y = y + cast(bias, dt).reshape((1, -1) + (1,) * nd)
    return y[0] if unbatched else y
