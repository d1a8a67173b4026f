"""ONNX elementwise arithmetic, math functions, Cast and MatMul-free binary ops."""

from __future__ import annotations

import operator

import numpy as np
import torch

from .common import np_binary, onnx_dtype
from .registry import TABLE as T

__all__: list[str] = []


def _binary(name, fn, fold_op=None):
    # ai.onnx::<name>(A, B) -> C  (numpy-style broadcasting; A and B of one type)
    T.op(name, since=13, fold=np_binary(fold_op) if fold_op else None)(lambda ctx, a, b: fn(a, b))


_binary("Add", torch.add, operator.add)
_binary("Sub", torch.sub, operator.sub)
_binary("Mul", torch.mul, operator.mul)


def _div(a, b):
    if not a.is_floating_point():
        # ONNX integer Div truncates toward zero: a floor division of the magnitudes, signed (the edge
        # backend has FLOOR_DIV for integers, not a truncating one)
        q = torch.div(a.abs(), b.abs(), rounding_mode="floor")
        return torch.where((a < 0) ^ (b < 0), -q, q)
    return torch.div(a, b)


def _np_div(a, b):
    if a.dtype == object or b.dtype == object:
        return a // b  # shape arithmetic: sizes are non-negative, so floor == trunc
    if np.issubdtype(a.dtype, np.integer):
        return (np.abs(a) // np.abs(b)) * np.sign(a) * np.sign(b)
    return a / b


_binary("Div", _div, _np_div)


# ai.onnx::Pow(X, Y) -> Z  (Z has X's type); a constant scalar exponent stays a Python number
@T.op("Pow", since=13, maybe_static=(1,))
def pow_(ctx, x, y):
    if isinstance(y, np.ndarray):
        if y.size == 1 and np.issubdtype(y.dtype, np.number):
            e = y.reshape(()).item()
            return (x * x) if e == 2 else torch.pow(x, e).to(x.dtype)
        y = torch.from_numpy(np.ascontiguousarray(y))
    return torch.pow(x, y).to(x.dtype)


# ai.onnx::Mod(A, B) -> C  attrs: fmod
@T.op("Mod", since=13, attrs={"fmod": 0})
def mod(ctx, a, b, fmod):
    return torch.fmod(a, b) if fmod else torch.remainder(a, b)


def _variadic(name, fn):
    # ai.onnx::<name>(data_0, ...) -> out  (broadcasting)
    @T.op(name, since=13)
    def op(ctx, *xs):
        out = xs[0]
        for x in xs[1:]:
            out = fn(out, x)
        return out / len(xs) if name == "Mean" else out

    return op


_variadic("Max", torch.maximum)
_variadic("Min", torch.minimum)
_variadic("Sum", torch.add)
_variadic("Mean", torch.add)

_UNARY = {
    "Abs": torch.abs, "Neg": torch.neg, "Sqrt": torch.sqrt, "Reciprocal": torch.reciprocal, "Exp": torch.exp,
    "Log": torch.log, "Floor": torch.floor, "Ceil": torch.ceil, "Sign": torch.sign, "Erf": torch.erf,
    "Sin": torch.sin, "Cos": torch.cos, "Tan": torch.tan, "Asin": torch.asin, "Acos": torch.acos,
    "Atan": torch.atan, "Sinh": torch.sinh, "Cosh": torch.cosh, "Asinh": torch.asinh, "Acosh": torch.acosh,
    "Atanh": torch.atanh, "Round": torch.round,  # torch.round rounds half to even, as ONNX Round does
}
for _name, _fn in _UNARY.items():
    # ai.onnx::<name>(X) -> Y
    T.op(_name, since=13)(lambda ctx, x, _fn=_fn: _fn(x))


# ai.onnx::Identity(input) -> output
@T.op("Identity", since=13, fold=lambda ctx, x: x)
def identity(ctx, x):
    return x


def _np_cast(ctx, x, to, saturate=1):
    dt = onnx_dtype(ctx, to)
    if x.dtype == object:
        if dt.is_floating_point:
            ctx.fail("casting a dynamic size to float is not supported; give the dynamic dims a size (dim_sizes)")
        return x
    if dt == torch.bfloat16:
        return torch.from_numpy(np.array(x, order="C")).to(dt)
    return x.astype(_NP[dt])


# torch dtype -> numpy dtype, for folds (no torch tensor may be made for this while tracing)
_NP = {torch.float32: np.float32, torch.float16: np.float16, torch.float64: np.float64, torch.int8: np.int8,
       torch.int16: np.int16, torch.int32: np.int32, torch.int64: np.int64, torch.uint8: np.uint8,
       torch.bool: np.bool_, torch.uint32: np.uint32, torch.uint64: np.uint64}


# ai.onnx::Cast(input) -> output  attrs: to (element type), saturate (float8 only, opset 19+)
@T.op("Cast", since=13, attrs={"to": 1, "saturate": 1}, fold=_np_cast)
def cast(ctx, x, to, saturate):
    return x.to(onnx_dtype(ctx, to))


# ai.onnx::CastLike(input, target_type) -> output  attrs: saturate
@T.op("CastLike", since=15, attrs={"saturate": 1})
def cast_like(ctx, x, like, saturate):
    return x.to(like.dtype)


# ai.onnx::BitShift(X, Y) -> Z  attrs: direction
@T.op("BitShift", since=13, attrs={"direction": "LEFT"})
def bit_shift(ctx, x, y, direction):
    return torch.bitwise_left_shift(x, y) if direction == "LEFT" else torch.bitwise_right_shift(x, y)
