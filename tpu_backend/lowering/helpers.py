"""Small helpers shared by the op modules: casts, dim normalisation, int-tuple arguments."""

from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = ["is_array", "cast", "cast_all", "norm_dim", "norm_dims", "ntuple", "acc_dtype", "static_int"]


def is_array(x) -> bool:
    return isinstance(x, jax.Array)  # includes tracers


def cast(x, dtype):
    """x as ``dtype``: a no-op when it already is; python scalars become arrays."""
    if is_array(x):
        return x if x.dtype == dtype else x.astype(dtype)
    return jnp.asarray(x, dtype=dtype)


def cast_all(dtype, *xs):
    """Arrays cast to ``dtype``; python scalars left alone (jax keeps them weakly typed, so they
    take the array's dtype, as torch's wrapped scalars do)."""
    return [cast(x, dtype) if is_array(x) else x for x in xs]


def norm_dim(d: int, ndim: int) -> int:
    if ndim == 0 and d in (0, -1):
        return 0  # torch lets a 0-d tensor be reduced over dim 0 / -1
    return d + ndim if d < 0 else d


def norm_dims(dims, ndim: int) -> tuple:
    """None or [] (torch's "all dims") -> every dim; negatives wrapped; order kept."""
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return tuple(range(ndim))
    if isinstance(dims, int):
        dims = [dims]
    if ndim == 0:
        return ()
    return tuple(norm_dim(d, ndim) for d in dims)


def ntuple(v, n: int) -> tuple:
    """Torch's int[n] arguments: a bare int or a 1-element list stands for all n."""
    if isinstance(v, int):
        return (v,) * n
    v = tuple(v)
    return v * n if len(v) == 1 else v


def acc_dtype(dtype):
    """Accumulate low-precision floats in f32 (as torch's CPU kernels and TPU MXUs do)."""
    dtype = jnp.dtype(dtype)
    if dtype in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
        return jnp.dtype(jnp.float32)
    return dtype


def static_int(d):
    """d as a python int, or None when it is a symbolic dimension."""
    try:
        return int(d)
    except Exception:  # noqa: BLE001 - jax raises its own error type for symbolic dims
        return None
