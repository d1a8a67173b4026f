"""Torch symbolic sizes (sympy expressions over s0, s1...) -> JAX dims.

Under ``jax.export`` shape polymorphism an input's ``x.shape[i]`` is a symbolic dimension that
supports + - * // %. Mapping each torch symbol to the input dim it first appears in lets a
lowering read any output shape torch recorded (``ctx.out_shape``) as a JAX shape.
"""

from __future__ import annotations

import math

import sympy
import torch

__all__ = ["resolve_dim", "symbols_of_inputs"]


def symbols_of_inputs(input_nodes, arrays) -> dict:
    """sympy symbol -> the jax dim of the first input dim that is exactly that symbol."""
    env: dict = {}
    for node, x in zip(input_nodes, arrays):
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor):
            continue
        for i, d in enumerate(val.shape):
            if isinstance(d, torch.SymInt):
                expr = d.node.expr
                if isinstance(expr, sympy.Symbol) and expr not in env:
                    env[expr] = x.shape[i]
    return env


def resolve_dim(d, env: dict):
    if isinstance(d, torch.SymInt):
        return _eval(d.node.expr, env)
    if isinstance(d, sympy.Expr):
        return _eval(d, env)
    return int(d)


def _eval(e, env):
    if e.is_Integer:
        return int(e)
    if e.is_Symbol:
        try:
            return env[e]
        except KeyError:
            raise NotImplementedError(f"symbolic dim {e} is not a dimension of any input") from None
    args = [_eval(a, env) for a in e.args]
    name = type(e).__name__
    if isinstance(e, sympy.Add):
        return sum(args[1:], args[0])
    if isinstance(e, sympy.Mul):
        return math.prod(args[1:], start=args[0])
    if isinstance(e, sympy.Pow) and isinstance(args[1], int) and args[1] >= 0:
        return math.prod([args[0]] * args[1], start=1)
    if name == "FloorDiv":
        return args[0] // args[1]
    if name in ("PythonMod", "Mod"):
        return args[0] % args[1]
    if name == "CeilDiv":
        return -((-args[0]) // args[1])
    if name in ("Max", "Min") and all(isinstance(a, int) for a in args):
        return max(args) if name == "Max" else min(args)
    raise NotImplementedError(f"cannot express the symbolic size {e} as a JAX dimension")
