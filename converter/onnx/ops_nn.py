"""ONNX MatMul, Gemm, Einsum and Dropout (inference: identity)."""

from __future__ import annotations

import torch

from .registry import TABLE as T

__all__: list[str] = []


# ai.onnx::MatMul(A, B) -> Y  (numpy matmul semantics)
@T.op("MatMul", since=13)
def matmul(ctx, a, b):
    return torch.matmul(a, b)


# ai.onnx::Gemm(A, B, C?) -> Y = alpha * A' @ B' + beta * C  attrs: alpha, beta, transA, transB
@T.op("Gemm", since=13, attrs={"alpha": 1.0, "beta": 1.0, "transA": 0, "transB": 0})
def gemm(ctx, a, b, c=None, *, alpha, beta, transA, transB):
    if transA:
        a = a.t()
    if c is not None and transB and alpha == 1.0 and beta == 1.0 and c.dim() <= 1:
        return torch.nn.functional.linear(a, b, c)  # the form both backends lower as one fully-connected op
    y = torch.matmul(a, b.t() if transB else b)
    if alpha != 1.0:
        y = y * alpha
    if c is not None:
        y = y + (c * beta if beta != 1.0 else c)
    return y


# ai.onnx::Einsum(Inputs...) -> Output  attrs: equation
@T.op("Einsum", since=12, attrs={"equation": ""})
def einsum(ctx, *xs, equation):
    if not equation:
        ctx.fail("attribute 'equation' is empty")
    return torch.einsum(equation.replace(" ", ""), *xs)


# ai.onnx::Dropout(data, ratio?, training_mode?) -> output, mask?  attrs: seed  (inference: identity)
@T.op("Dropout", since=13, attrs={"seed": 0}, maybe_static=(1, 2))
def dropout(ctx, x, ratio=None, training_mode=None, *, seed):
    if training_mode is not None and not isinstance(training_mode, torch.Tensor) and bool(training_mode.reshape(())):
        ctx.fail("training_mode is true; only inference graphs are imported")
    if ctx.n_out > 1:
        return x, torch.ones_like(x, dtype=torch.bool)
    return x
