"""ONNX Constant, ConstantOfShape, Range, EyeLike (folded when the model is built wherever their inputs are)."""

from __future__ import annotations

import numpy as np
import torch

from .common import ints, onnx_dtype
from .registry import TABLE as T

__all__: list[str] = []

_CONST_ATTRS = {"value": None, "value_float": None, "value_floats": None, "value_int": None, "value_ints": None,
                "value_string": None, "value_strings": None, "sparse_value": None}


def _constant(ctx, **attrs):
    from onnx import numpy_helper

    given = {k: v for k, v in attrs.items() if v is not None}
    if len(given) != 1:
        ctx.fail(f"needs exactly one value attribute, has {sorted(given) or 'none'}")
    (k, v), = given.items()
    if k == "value":
        return numpy_helper.to_array(v)
    if k in ("value_float", "value_floats"):
        return np.asarray(v, dtype=np.float32)
    if k in ("value_int", "value_ints"):
        return np.asarray(v, dtype=np.int64)
    ctx.fail(f"{k} constants are not supported (tensors of numbers and booleans are)")


# ai.onnx::Constant() -> output  attrs: value | value_float(s) | value_int(s) | value_string(s) | sparse_value
T.op("Constant", since=13, attrs=_CONST_ATTRS, fold=_constant)(_constant)


def _cos_value(ctx, value):
    from onnx import numpy_helper

    return numpy_helper.to_array(value).reshape(-1)[0] if value is not None else np.float32(0)


# ai.onnx::ConstantOfShape(input) -> output  attrs: value (one-element tensor, default float 0)
@T.op("ConstantOfShape", since=9, attrs={"value": None}, static=(0,))
def constant_of_shape(ctx, shape, *, value):
    v = _cos_value(ctx, value)
    dt = torch.from_numpy(np.asarray(v).reshape(1)).dtype
    return torch.full(ints(ctx, shape, "shape"), v.item(), dtype=dt)


def _range_fold(ctx, start, limit, delta):
    if any(np.asarray(v).dtype == object for v in (start, limit, delta)):
        return range_(ctx, start, limit, delta)  # a dynamic size: torch.arange on SymInts
    s, lim, d = (np.asarray(v).reshape(()).item() for v in (start, limit, delta))
    return np.arange(s, lim, d, dtype=np.asarray(start).dtype)


# ai.onnx::Range(start, limit, delta) -> output
@T.op("Range", since=11, maybe_static=(0, 1, 2), fold=_range_fold)
def range_(ctx, start, limit, delta):
    vals, dt = [], None
    for v in (start, limit, delta):
        if isinstance(v, torch.Tensor):
            ctx.fail("start/limit/delta computed at run time are not supported; give dynamic dims a size "
                     "(dim_sizes)")
        dt = dt or torch.from_numpy(np.zeros(1, np.asarray(v).dtype)).dtype if np.asarray(v).dtype != object else dt
        vals.append(np.asarray(v).reshape(()).item())
    return torch.arange(*vals, dtype=dt or torch.int64)


# ai.onnx::EyeLike(input) -> output  attrs: dtype, k
@T.op("EyeLike", since=9, attrs={"dtype": None, "k": 0})
def eye_like(ctx, x, *, dtype, k):
    dt = onnx_dtype(ctx, dtype) if dtype is not None else x.dtype
    n, m = x.shape
    return torch.ones(n, m, dtype=dt).triu(k).tril(k)
