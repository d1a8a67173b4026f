"""Matrix products: linear (kept whole), matmul (kept whole), mm, bmm, addmm, baddbmm, dot.

f32 products run at HIGHEST precision: TPUs otherwise multiply f32 in bf16 passes, which
would break fp32 parity with torch. bf16 products keep the default (f32 accumulation).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch

from .helpers import cast, cast_all
from .registry import lowering

aten = torch.ops.aten


def _mm(ctx, a, b):
    a, b = cast_all(ctx.out_dtype, a, b)
    return jnp.matmul(a, b, precision=ctx.precision())


# aten::linear(Tensor input, Tensor weight, Tensor? bias=None) -> Tensor
@lowering(aten.linear.default)
def linear(ctx, x, weight, bias=None):
    x, weight = cast_all(ctx.out_dtype, x, weight)
    if weight.ndim == 2:
        # x @ weight.T as one dot_general contracting both last dims, not a transpose then a dot: XLA:CPU
        # copied the transposed weight on every call (AlexNet's 4096x9216 fc at batch 1: 1040 ms vs 20 ms)
        y = jax.lax.dot_general(x, weight, (((x.ndim - 1,), (1,)), ((), ())), precision=ctx.precision())
    else:
        y = jnp.matmul(x, weight.T, precision=ctx.precision())
    return y if bias is None else y + cast(bias, ctx.out_dtype)


# aten::matmul(Tensor self, Tensor other) -> Tensor   (numpy matmul broadcasting, as torch)
# aten::mm(Tensor self, Tensor mat2) -> Tensor;  aten::bmm(Tensor self, Tensor mat2) -> Tensor
@lowering(aten.matmul.default, aten.mm.default, aten.bmm.default)
def matmul(ctx, a, b):
    return _mm(ctx, a, b)


# aten::dot(Tensor self, Tensor tensor) -> Tensor
@lowering(aten.dot.default)
def dot(ctx, a, b):
    a, b = cast_all(ctx.out_dtype, a, b)
    return jnp.dot(a, b, precision=ctx.precision())


# aten::addmm(Tensor self, Tensor mat1, Tensor mat2, *, Scalar beta=1, Scalar alpha=1) -> Tensor
# aten::baddbmm(Tensor self, Tensor batch1, Tensor batch2, *, Scalar beta=1, Scalar alpha=1) -> Tensor
@lowering(aten.addmm.default, aten.baddbmm.default)
def addmm(ctx, bias, a, b, beta=1, alpha=1):
    y = _mm(ctx, a, b)
    if alpha != 1:
        y = y * alpha
    if beta == 0:
        return y  # torch ignores self (even NaN) when beta == 0
    bias = cast(bias, ctx.out_dtype)
    return y + (bias if beta == 1 else bias * beta)


# aten::addmv(Tensor self, Tensor mat, Tensor vec, *, Scalar beta=1, Scalar alpha=1) -> Tensor
@lowering(aten.addmv.default)
def addmv(ctx, bias, mat, vec, beta=1, alpha=1):
    return addmm(ctx, bias, mat, vec, beta, alpha)
