"""Reductions, softmax, scans (cumsum/cumprod), sort and topk.

Low-precision floats (bf16/f16) accumulate in f32 and are cast back once, as torch's kernels
and the TPU's reduction units do.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch
from jax import lax

from .helpers import acc_dtype, cast, norm_dim, norm_dims
from .registry import lowering

aten = torch.ops.aten


def _sum_like(jfn):
    def lower(ctx, x, dim=None, keepdim=False, dtype=None):
        axes = norm_dims(dim, x.ndim)
        acc = acc_dtype(ctx.out_dtype)
        return cast(jfn(cast(x, acc), axis=axes, keepdims=keepdim), ctx.out_dtype)

    return lower


# aten::sum.dim_IntList(Tensor self, int[1]? dim, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor
# aten::mean.dim(Tensor self, int[1]? dim, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor
lowering(aten.sum.dim_IntList)(_sum_like(jnp.sum))
lowering(aten.mean.dim)(_sum_like(jnp.mean))


# aten::sum(Tensor self, *, ScalarType? dtype=None) -> Tensor
@lowering(aten.sum.default)
def sum_all(ctx, x, dtype=None):
    return cast(jnp.sum(cast(x, acc_dtype(ctx.out_dtype))), ctx.out_dtype)


# aten::mean(Tensor self, *, ScalarType? dtype=None) -> Tensor
@lowering(aten.mean.default)
def mean_all(ctx, x, dtype=None):
    return cast(jnp.mean(cast(x, acc_dtype(ctx.out_dtype))), ctx.out_dtype)


# aten::prod.dim_int(Tensor self, int dim, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor
@lowering(aten.prod.dim_int)
def prod_dim(ctx, x, dim, keepdim=False, dtype=None):
    return jnp.prod(cast(x, acc_dtype(ctx.out_dtype)), axis=norm_dims(dim, x.ndim), keepdims=keepdim)


# aten::prod(Tensor self, *, ScalarType? dtype=None) -> Tensor
@lowering(aten.prod.default)
def prod_all(ctx, x, dtype=None):
    return jnp.prod(cast(x, acc_dtype(ctx.out_dtype)))


# aten::amax(Tensor self, int[1] dim=[], bool keepdim=False) -> Tensor
@lowering(aten.amax.default)
def amax(ctx, x, dim=(), keepdim=False):
    return jnp.max(x, axis=norm_dims(dim, x.ndim), keepdims=keepdim)


# aten::amin(Tensor self, int[1] dim=[], bool keepdim=False) -> Tensor
@lowering(aten.amin.default)
def amin(ctx, x, dim=(), keepdim=False):
    return jnp.min(x, axis=norm_dims(dim, x.ndim), keepdims=keepdim)


# aten::max(Tensor self) -> Tensor
@lowering(aten.max.default)
def max_all(ctx, x):
    return jnp.max(x)


# aten::min(Tensor self) -> Tensor
@lowering(aten.min.default)
def min_all(ctx, x):
    return jnp.min(x)


# aten::max.dim(Tensor self, int dim, bool keepdim=False) -> (Tensor values, Tensor indices)
@lowering(aten.max.dim)
def max_dim(ctx, x, dim, keepdim=False):
    d = norm_dim(dim, x.ndim)
    return jnp.max(x, axis=d, keepdims=keepdim), jnp.argmax(x, axis=d, keepdims=keepdim)


# aten::min.dim(Tensor self, int dim, bool keepdim=False) -> (Tensor values, Tensor indices)
@lowering(aten.min.dim)
def min_dim(ctx, x, dim, keepdim=False):
    d = norm_dim(dim, x.ndim)
    return jnp.min(x, axis=d, keepdims=keepdim), jnp.argmin(x, axis=d, keepdims=keepdim)


def _arg_reduce(jfn):
    def lower(ctx, x, dim=None, keepdim=False):
        if dim is None:
            out = jfn(x.reshape(-1))
            return out.reshape((1,) * x.ndim) if keepdim else out
        return jfn(x, axis=norm_dim(dim, x.ndim), keepdims=keepdim)

    return lower


# aten::argmax(Tensor self, int? dim=None, bool keepdim=False) -> Tensor   (first maximum, as torch)
# aten::argmin(Tensor self, int? dim=None, bool keepdim=False) -> Tensor
lowering(aten.argmax.default)(_arg_reduce(jnp.argmax))
lowering(aten.argmin.default)(_arg_reduce(jnp.argmin))


def _correction(correction):
    return 1 if correction is None else correction


# aten::var.correction(Tensor self, int[1]? dim=None, *, Scalar? correction=None, bool keepdim=False) -> Tensor
@lowering(aten.var.correction)
def var(ctx, x, dim=None, correction=None, keepdim=False):
    x = cast(x, acc_dtype(ctx.out_dtype))
    return jnp.var(x, axis=norm_dims(dim, x.ndim), ddof=_correction(correction), keepdims=keepdim)


# aten::var.dim(Tensor self, int[1]? dim, bool unbiased=True, bool keepdim=False) -> Tensor
@lowering(aten.var.dim)
def var_dim(ctx, x, dim, unbiased=True, keepdim=False):
    x = cast(x, acc_dtype(ctx.out_dtype))
    return jnp.var(x, axis=norm_dims(dim, x.ndim), ddof=1 if unbiased else 0, keepdims=keepdim)


# aten::std.correction(Tensor self, int[1]? dim=None, *, Scalar? correction=None, bool keepdim=False) -> Tensor
@lowering(aten.std.correction)
def std(ctx, x, dim=None, correction=None, keepdim=False):
    x = cast(x, acc_dtype(ctx.out_dtype))
    return jnp.std(x, axis=norm_dims(dim, x.ndim), ddof=_correction(correction), keepdims=keepdim)


# aten::var_mean.correction(Tensor self, int[1]? dim=None, *, Scalar? correction=None, bool keepdim=False)
#     -> (Tensor, Tensor)
@lowering(aten.var_mean.correction)
def var_mean(ctx, x, dim=None, correction=None, keepdim=False):
    x = cast(x, acc_dtype(ctx.out_dtype))
    axes = norm_dims(dim, x.ndim)
    return (jnp.var(x, axis=axes, ddof=_correction(correction), keepdims=keepdim),
            jnp.mean(x, axis=axes, keepdims=keepdim))


def _bool_reduce(jfn):
    def lower(ctx, x, dim=None, keepdim=False):
        return jfn(x, axis=norm_dims(dim, x.ndim), keepdims=keepdim)

    return lower


# aten::any(Tensor self) -> Tensor;  aten::any.dim(Tensor self, int dim, bool keepdim=False) -> Tensor
# aten::any.dims(Tensor self, int[1]? dim=None, bool keepdim=False) -> Tensor;  all.* alike
lowering(aten.any.default, aten.any.dim, aten.any.dims)(_bool_reduce(jnp.any))
lowering(aten.all.default, aten.all.dim, aten.all.dims)(_bool_reduce(jnp.all))


# aten::logsumexp(Tensor self, int[1] dim, bool keepdim=False) -> Tensor
@lowering(aten.logsumexp.default)
def logsumexp(ctx, x, dim, keepdim=False):
    x = cast(x, acc_dtype(ctx.out_dtype))
    return jax.nn.logsumexp(x, axis=norm_dims(dim, x.ndim), keepdims=keepdim)


# aten::linalg_vector_norm(Tensor self, Scalar ord=2, int[1]? dim=None, bool keepdim=False, *,
#     ScalarType? dtype=None) -> Tensor
@lowering(aten.linalg_vector_norm.default)
def vector_norm(ctx, x, ord=2, dim=None, keepdim=False, dtype=None):
    x = jnp.abs(cast(x, acc_dtype(ctx.out_dtype)))
    axes = norm_dims(dim, x.ndim)
    if ord == float("inf"):
        return jnp.max(x, axis=axes, keepdims=keepdim)
    if ord == float("-inf"):
        return jnp.min(x, axis=axes, keepdims=keepdim)
    if ord == 0:
        return jnp.sum((x != 0).astype(x.dtype), axis=axes, keepdims=keepdim)
    if ord == 1:
        return jnp.sum(x, axis=axes, keepdims=keepdim)
    if ord == 2:
        return jnp.sqrt(jnp.sum(x * x, axis=axes, keepdims=keepdim))
    return jnp.sum(x**ord, axis=axes, keepdims=keepdim) ** (1.0 / ord)


# aten::_softmax(Tensor self, int dim, bool half_to_float) -> Tensor
@lowering(aten._softmax.default)
def softmax(ctx, x, dim, half_to_float=False):
    x = cast(x, acc_dtype(ctx.out_dtype))
    return jax.nn.softmax(x, axis=norm_dim(dim, x.ndim))


# aten::_log_softmax(Tensor self, int dim, bool half_to_float) -> Tensor
@lowering(aten._log_softmax.default)
def log_softmax(ctx, x, dim, half_to_float=False):
    x = cast(x, acc_dtype(ctx.out_dtype))
    return jax.nn.log_softmax(x, axis=norm_dim(dim, x.ndim))


# aten::cumsum(Tensor self, int dim, *, ScalarType? dtype=None) -> Tensor
@lowering(aten.cumsum.default)
def cumsum(ctx, x, dim, dtype=None):
    x = cast(x, acc_dtype(ctx.out_dtype))
    return jnp.cumsum(x, axis=norm_dim(dim, x.ndim)) if x.ndim else x


# aten::cumprod(Tensor self, int dim, *, ScalarType? dtype=None) -> Tensor
@lowering(aten.cumprod.default)
def cumprod(ctx, x, dim, dtype=None):
    x = cast(x, acc_dtype(ctx.out_dtype))
    return jnp.cumprod(x, axis=norm_dim(dim, x.ndim)) if x.ndim else x


def _sort(x, dim, descending, stable=True):
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int32)
    d = norm_dim(dim, x.ndim)
    idx = lax.broadcasted_iota(jnp.int32, x.shape, d)
    keys = -x if descending and not jnp.issubdtype(x.dtype, jnp.unsignedinteger) else x
    if x.dtype == jnp.bool_:
        keys = jnp.logical_not(x) if descending else x
    _, values, indices = lax.sort((keys, x, idx), dimension=d, is_stable=stable, num_keys=1)
    return values, indices


# aten::sort(Tensor self, int dim=-1, bool descending=False) -> (Tensor values, Tensor indices)
@lowering(aten.sort.default)
def sort(ctx, x, dim=-1, descending=False):
    return _sort(x, dim, descending)


# aten::sort.stable(Tensor self, *, bool? stable, int dim=-1, bool descending=False) -> (Tensor, Tensor)
@lowering(aten.sort.stable)
def sort_stable(ctx, x, stable=None, dim=-1, descending=False):
    return _sort(x, dim, descending)


# aten::topk(Tensor self, SymInt k, int dim=-1, bool largest=True, bool sorted=True) -> (Tensor, Tensor)
@lowering(aten.topk.default)
def topk(ctx, x, k, dim=-1, largest=True, sorted=True):
    d = norm_dim(dim, x.ndim)
    moved = jnp.moveaxis(x, d, -1)
    values, indices = lax.top_k(moved if largest else -moved, k)
    if not largest:
        values = -values
    return jnp.moveaxis(values, -1, d), jnp.moveaxis(indices, -1, d)
