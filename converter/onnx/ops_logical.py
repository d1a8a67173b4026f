"""ONNX comparisons, boolean logic, Where, IsNaN/IsInf."""

from __future__ import annotations

import operator

import numpy as np
import torch

from .common import np_binary
from .registry import TABLE as T

__all__: list[str] = []

_CMP = {"Equal": (torch.eq, operator.eq), "Less": (torch.lt, operator.lt), "Greater": (torch.gt, operator.gt),
        "LessOrEqual": (torch.le, operator.le), "GreaterOrEqual": (torch.ge, operator.ge),
        "And": (torch.logical_and, np.logical_and), "Or": (torch.logical_or, np.logical_or),
        "Xor": (torch.logical_xor, np.logical_xor)}
for _name, (_fn, _np) in _CMP.items():
    # ai.onnx::<name>(A, B) -> C (bool)
    T.op(_name, since=13 if _name in ("Equal", "Less", "Greater") else 7,
         fold=np_binary(_np))(lambda ctx, a, b, _fn=_fn: _fn(a, b))

# ai.onnx::Not(X) -> Y / IsNaN(X) -> Y
T.op("Not", since=1, fold=lambda ctx, x: np.logical_not(x))(lambda ctx, x: torch.logical_not(x))
T.op("IsNaN", since=13)(lambda ctx, x: torch.isnan(x))


# ai.onnx::IsInf(X) -> Y  attrs: detect_negative, detect_positive
@T.op("IsInf", since=10, attrs={"detect_negative": 1, "detect_positive": 1})
def is_inf(ctx, x, *, detect_negative, detect_positive):
    if detect_negative and detect_positive:
        return torch.isinf(x)
    if detect_positive:
        return torch.isposinf(x)
    return torch.isneginf(x) if detect_negative else torch.zeros_like(x, dtype=torch.bool)


def _where_fold(ctx, c, a, b):
    return np.where(np.asarray(c, dtype=bool), a, b)


# ai.onnx::Where(condition, X, Y) -> output
@T.op("Where", since=16, fold=_where_fold)
def where(ctx, c, a, b):
    return torch.where(c, a, b)
