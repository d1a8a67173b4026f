"""Backend-neutral table of single-op test rows (in the spirit of jax's lax_test and
litert-torch's test_core_aten_ops).

Each ``OpRow`` is a torch callable plus seeded arguments.  A backend's op test
wraps a row with ``OpModule(row)``, exports it with ``torch.export`` using
``row_inputs(row)`` as the example inputs, converts it, and compares its output
with ``row.fn(*row.args, **row.kwargs)`` run eagerly:

    err = max|got - want| / max(max|want|, 1e-6)   must be <= row.rtol (+ row.atol)

Outputs whose dtype is not floating point (int / bool results, the indices of
topk/sort, ...) are always compared exactly.  ``kind`` names the dtype of the
(main) output: "float", "int" or "bool".

Tensor arguments (positional or keyword) become inputs of the exported program,
everything else is bound as a constant.  ``weights`` lists positional indices of
tensors that are model parameters (conv/linear weights, norm affine params,
running stats, embedding tables); ``OpModule(row, weights_as_params=True)``
registers those as buffers of the module instead of taking them as inputs, which is
how they appear in real models (constants a converter can fold / pre-pack).

Inputs are chosen to keep every op well conditioned: log/sqrt/rsqrt/pow get
positive inputs, divisors stay away from zero, argmax/argmin/sort/topk get values
without ties (torch.randperm based), rounding ops avoid inputs near .5 except for
a dedicated exact-half row.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["OpRow", "ROWS", "OpModule", "row_inputs", "rows_by_id", "dynamic_shapes", "args_at"]


@dataclass
class OpRow:
    id: str  # unique, e.g. "conv2d_stride2_pad1"
    fn: Callable  # torch callable, called as fn(*args, **kwargs)
    args: tuple  # tensors (seeded) and python scalars/lists
    kwargs: dict = field(default_factory=dict)
    rtol: float = 1e-5  # relative error bound: max|a-b| / max(max|b|, 1e-6)
    atol: float = 0.0
    why: str = ""  # required when tolerance is looser than 1e-5
    kind: str = "float"  # or "int", "bool"
    weights: tuple = ()  # positional indices of args that are model parameters
    # symbolic sizes: positional arg index -> {dim: size name}; the row is also exported with those dims
    # dynamic and run at each of ``sizes`` ({name: size}) besides the sample's own
    dyn: dict = field(default_factory=dict)
    sizes: tuple = ()


# --------------------------------------------------------------------------------------
# wrapper used by the backends' op tests
# --------------------------------------------------------------------------------------


def _tensor_slots(row: OpRow):
    """[(where, key)] of tensor arguments: ("a", i) for args[i], ("k", name) for kwargs."""
    slots = [("a", i) for i, a in enumerate(row.args) if isinstance(a, torch.Tensor)]
    slots += [("k", k) for k, v in row.kwargs.items() if isinstance(v, torch.Tensor)]
    return slots


def row_inputs(row: OpRow, weights_as_params: bool = False) -> tuple:
    """The tensor arguments of ``row`` in call order (positional first, then keyword).

    With ``weights_as_params=True`` the positional tensors listed in ``row.weights``
    are left out (``OpModule(row, weights_as_params=True)`` holds them).
    """
    out = []
    for where, key in _tensor_slots(row):
        if weights_as_params and where == "a" and key in row.weights:
            continue
        out.append(row.args[key] if where == "a" else row.kwargs[key])
    return tuple(out)


class OpModule(nn.Module):
    """nn.Module whose forward takes ``row_inputs(row)`` and returns ``row.fn(...)``.

    Non-tensor arguments are bound as constants.  Tuple/list/namedtuple results
    (split, topk, sort, ...) are returned as a plain tuple.
    """

    def __init__(self, row: OpRow, weights_as_params: bool = False):
        super().__init__()
        self.row_id = row.id
        self._fn = row.fn
        self._args = list(row.args)
        self._kwargs = dict(row.kwargs)
        self._slots = []
        for where, key in _tensor_slots(row):
            if weights_as_params and where == "a" and key in row.weights:
                self.register_buffer(f"w{key}", row.args[key].clone())
                self._args[key] = ("__buffer__", f"w{key}")
            else:
                self._slots.append((where, key))

    def forward(self, *tensors):
        assert len(tensors) == len(self._slots), (self.row_id, len(tensors), len(self._slots))
        args = [getattr(self, a[1]) if isinstance(a, tuple) and a[:1] == ("__buffer__",) else a for a in self._args]
        kwargs = dict(self._kwargs)
        for (where, key), t in zip(self._slots, tensors):
            if where == "a":
                args[key] = t
            else:
                kwargs[key] = t
        out = self._fn(*args, **kwargs)
        if isinstance(out, (tuple, list)):
            return tuple(out)
        return out


# --------------------------------------------------------------------------------------
# seeded input helpers (one generator, consumed in table order)
# --------------------------------------------------------------------------------------

_G = torch.Generator().manual_seed(20240607)


def r(*shape, scale=1.0):
    """standard normal * scale"""
    return torch.randn(shape, generator=_G) * scale


def u(*shape, lo=-1.0, hi=1.0):
    return lo + (hi - lo) * torch.rand(shape, generator=_G)


def pos(*shape, lo=0.5, hi=2.0):
    """positive, away from zero"""
    return u(*shape, lo=lo, hi=hi)


def nz(*shape, lo=0.5, hi=2.0):
    """random sign, magnitude in [lo, hi] (safe divisor)"""
    sign = torch.where(torch.rand(shape, generator=_G) < 0.5, -1.0, 1.0)
    return sign * u(*shape, lo=lo, hi=hi)


def distinct(*shape, scale=2.0):
    """values without ties (a permutation of a uniform grid), in [-scale, scale)"""
    n = math.prod(shape)
    return (torch.randperm(n, generator=_G).to(torch.float32) / n * 2 - 1).reshape(shape) * scale


def ints(*shape, lo=-20, hi=20, dtype=torch.int32):
    return torch.randint(lo, hi, shape, generator=_G, dtype=dtype)


def bools(*shape):
    return torch.rand(shape, generator=_G) < 0.5


def away_from_half(*shape, scale=3.0):
    """values whose fractional part is in [0.1, 0.4] or [0.6, 0.9] (stable floor/ceil/round)"""
    whole = torch.randint(-4, 4, shape, generator=_G).to(torch.float32)
    frac = u(*shape, lo=0.1, hi=0.4) + 0.5 * (torch.rand(shape, generator=_G) < 0.5).to(torch.float32)
    return whole + frac


ROWS: list[OpRow] = []


def row(id, fn, *args, kind="float", weights=(), rtol=1e-5, atol=0.0, why="", dyn=None, sizes=(), **kwargs):
    ROWS.append(OpRow(id, fn, tuple(args), kwargs, rtol, atol, why, kind, tuple(weights), dyn or {}, tuple(sizes)))


# --------------------------------------------------------------------------------------
# elementwise binary arithmetic
# --------------------------------------------------------------------------------------

X = (2, 3, 8, 8)
row("add", torch.add, r(*X), r(*X))
row("add_bcast_last", torch.add, r(2, 3, 4), r(4))
row("add_bcast_mid", torch.add, r(2, 1, 4), r(1, 3, 1))
row("add_scalar", lambda x: x + 1.5, r(*X))
row("add_alpha", torch.add, r(3, 4), r(3, 4), alpha=2.0)
row("add_0d_tensor", torch.add, r(3, 4), r())
row("sub", torch.sub, r(*X), r(*X))
row("sub_bcast", torch.sub, r(2, 3, 4), r(3, 1))
row("sub_scalar", lambda x: x - 0.75, r(3, 4))
row("rsub_scalar", lambda x: 1.0 - x, r(3, 4))
row("mul", torch.mul, r(*X), r(*X))
row("mul_bcast_channel", torch.mul, r(*X), r(1, 3, 1, 1))
row("mul_scalar", lambda x: x * -2.5, r(3, 4))
row("div", torch.div, r(*X), nz(*X))
row("div_bcast", torch.div, r(2, 3, 4), nz(4))
row("div_scalar", lambda x: x / 3.0, r(3, 4))
row("rdiv_scalar", lambda x: 2.0 / x, nz(3, 4))
row("neg", torch.neg, r(*X))
row("abs", torch.abs, r(*X))
row("maximum", torch.maximum, r(*X), r(*X))
row("maximum_bcast", torch.maximum, r(2, 3, 4), r(4))
row("minimum", torch.minimum, r(*X), r(*X))
row("minimum_bcast", torch.minimum, r(2, 1, 4), r(3, 1))

# --------------------------------------------------------------------------------------
# elementwise unary math
# --------------------------------------------------------------------------------------

row("exp", torch.exp, r(*X))
row("log", torch.log, pos(*X, lo=0.1, hi=10.0))
row("sqrt", torch.sqrt, pos(*X, lo=0.1, hi=10.0))
row("rsqrt", torch.rsqrt, pos(*X, lo=0.1, hi=10.0))
row("reciprocal", torch.reciprocal, nz(*X))
row("pow_2", lambda x: x.pow(2), r(*X))
row("pow_0p5", lambda x: torch.pow(x, 0.5), pos(*X))
row("pow_3", lambda x: x**3, r(3, 4))
row("pow_neg1", lambda x: x**-1.0, pos(3, 4))
row("pow_tensor", torch.pow, pos(3, 4), u(3, 4, lo=-2.0, hi=2.0))
row("pow_scalar_base", lambda x: torch.pow(2.0, x), u(3, 4, lo=-3.0, hi=3.0))
row("erf", torch.erf, r(*X, scale=1.5))
row("sin", torch.sin, u(*X, lo=-4.0, hi=4.0))
row("cos", torch.cos, u(*X, lo=-4.0, hi=4.0))
row("floor", torch.floor, away_from_half(*X))
row("ceil", torch.ceil, away_from_half(*X))
row("round", torch.round, away_from_half(*X))
row("round_half_even", torch.round, torch.tensor([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 3.5, -3.5]))
row("sign", torch.sign, torch.cat([r(20), torch.zeros(4)]))
row("clamp_minmax", torch.clamp, r(*X), min=-0.5, max=0.5)
row("clamp_min", torch.clamp, r(*X), min=0.1)
row("clamp_max", lambda x: x.clamp(max=-0.2), r(3, 4))
row("clamp_tensor", torch.clamp, r(3, 4), u(3, 4, lo=-1.0, hi=-0.3), u(3, 4, lo=0.3, hi=1.0))

# --------------------------------------------------------------------------------------
# activations
# --------------------------------------------------------------------------------------

A = r(*X, scale=3.0)  # activations: span the interesting -6..6 range
row("relu", F.relu, A)
row("relu6", F.relu6, r(*X, scale=4.0))
row("leaky_relu", F.leaky_relu, r(*X))
row("leaky_relu_0p2", F.leaky_relu, r(*X), 0.2)
row("elu", F.elu, r(*X, scale=2.0))
row("sigmoid", torch.sigmoid, r(*X, scale=3.0))
row("tanh", torch.tanh, r(*X, scale=2.0))
row("gelu", F.gelu, r(*X, scale=2.0))
row("gelu_tanh", F.gelu, r(*X, scale=2.0), approximate="tanh")
row("silu", F.silu, r(*X, scale=3.0))
row("hardswish", F.hardswish, r(*X, scale=3.0))
row("hardsigmoid", F.hardsigmoid, r(*X, scale=3.0))
row("hardtanh", F.hardtanh, r(*X, scale=2.0))
row("hardtanh_m2_2", F.hardtanh, r(*X, scale=3.0), -2.0, 2.0)
row("softmax_last", F.softmax, r(*X, scale=2.0), dim=-1)
row("softmax_dim1", F.softmax, r(*X, scale=2.0), dim=1)
row("log_softmax_last", F.log_softmax, r(*X, scale=2.0), dim=-1)
row("log_softmax_dim1", F.log_softmax, r(*X, scale=2.0), dim=1)

# --------------------------------------------------------------------------------------
# comparisons, logic, where
# --------------------------------------------------------------------------------------

_cmp_a = ints(4, 6, lo=-3, hi=3).to(torch.float32)  # small ints: plenty of equal pairs
_cmp_b = ints(4, 6, lo=-3, hi=3).to(torch.float32)
for _name, _op in [("eq", torch.eq), ("ne", torch.ne), ("lt", torch.lt), ("le", torch.le), ("gt", torch.gt),
                   ("ge", torch.ge)]:
    row(f"{_name}", _op, _cmp_a, _cmp_b, kind="bool")
row("gt_scalar", lambda x: x > 0.0, r(*X), kind="bool")
row("le_scalar", lambda x: x <= 0.5, r(3, 4), kind="bool")
row("eq_scalar", lambda x: x == 1.0, _cmp_a, kind="bool")
row("lt_bcast", torch.lt, r(2, 3, 4), r(4), kind="bool")
row("eq_int", torch.eq, ints(4, 6, lo=-2, hi=2), ints(4, 6, lo=-2, hi=2), kind="bool")
row("logical_and", torch.logical_and, bools(4, 6), bools(4, 6), kind="bool")
row("logical_or", torch.logical_or, bools(4, 6), bools(4, 6), kind="bool")
row("logical_xor", torch.logical_xor, bools(4, 6), bools(4, 6), kind="bool")
row("logical_not", torch.logical_not, bools(4, 6), kind="bool")
row("where", torch.where, bools(*X), r(*X), r(*X))
row("where_bcast", torch.where, bools(1, 3, 1, 8), r(*X), r(1, 1, 8, 8))
row("where_scalar", lambda c, x: torch.where(c, x, 0.0), bools(3, 4), r(3, 4))
row("where_from_cmp", lambda x: torch.where(x > 0, x, x * 0.1), r(*X))
row("masked_fill", lambda x, m: x.masked_fill(m, -1e4), r(2, 4, 8, 8), bools(2, 1, 8, 8))
row("masked_fill_zero", lambda x, m: x.masked_fill(m, 0.0), r(3, 4), bools(3, 4))

# --------------------------------------------------------------------------------------
# reductions
# --------------------------------------------------------------------------------------

for _name, _op in [("sum", torch.sum), ("mean", torch.mean), ("amax", torch.amax), ("amin", torch.amin)]:
    row(f"{_name}_last", _op, r(*X), dim=-1)
    row(f"{_name}_last_keepdim", _op, r(*X), dim=-1, keepdim=True)
    row(f"{_name}_dim1", _op, r(*X), dim=1)
    row(f"{_name}_hw_keepdim", _op, r(*X), dim=(-2, -1), keepdim=True)
row("sum_all", torch.sum, r(*X))
row("mean_all", lambda x: x.mean(), r(*X))
row("sum_neg_dims", torch.sum, r(*X), dim=(-3, -1))
row("prod_dim1", torch.prod, pos(2, 5, 4, lo=0.7, hi=1.4), dim=1)
row("prod_last_keepdim", torch.prod, pos(2, 5, 4, lo=0.7, hi=1.4), dim=-1, keepdim=True)
row("argmax_last", torch.argmax, distinct(*X), dim=-1, kind="int")
row("argmax_dim1_keepdim", torch.argmax, distinct(*X), dim=1, keepdim=True, kind="int")
row("argmin_last", torch.argmin, distinct(*X), dim=-1, kind="int")
row("argmin_neg2_keepdim", torch.argmin, distinct(*X), dim=-2, keepdim=True, kind="int")
row("cumsum_dim1", torch.cumsum, r(2, 6, 5), dim=1)
row("cumsum_last", torch.cumsum, r(2, 6, 5), dim=-1)
row("var_c0", torch.var, r(*X), dim=-1, correction=0)
row("var_c1_keepdim", torch.var, r(*X), dim=(2, 3), correction=1, keepdim=True)
row("std_c0", torch.std, r(*X), dim=1, correction=0)
row("std_c1", torch.std, r(*X), dim=-1, correction=1)
row("var_all", lambda x: x.var(), r(4, 6))
row("std_all_c0", lambda x: x.std(correction=0), r(4, 6))
row("norm_l2", lambda x: torch.linalg.vector_norm(x, dim=-1), r(3, 8))

# --------------------------------------------------------------------------------------
# matmul family
# --------------------------------------------------------------------------------------

row("matmul_2d", torch.matmul, r(4, 8), r(8, 5))
row("matmul_3d", torch.matmul, r(2, 4, 8), r(2, 8, 5))
row("matmul_4d", torch.matmul, r(2, 3, 4, 8), r(2, 3, 8, 5))
row("matmul_bcast_rhs2d", torch.matmul, r(2, 3, 4, 8), r(8, 5))
row("matmul_bcast_batch", torch.matmul, r(2, 1, 4, 8), r(3, 8, 5))
row("matmul_mv", torch.matmul, r(4, 8), r(8))
row("matmul_vm", torch.matmul, r(8), r(8, 5))
row("matmul_transposed_rhs", lambda a, b: a @ b.transpose(-1, -2), r(2, 4, 8), r(2, 6, 8))
row("bmm", torch.bmm, r(3, 4, 8), r(3, 8, 5))
row("mm", torch.mm, r(4, 8), r(8, 5))
row("linear_bias", F.linear, r(4, 16), r(8, 16), r(8), weights=(1, 2))
row("linear_nobias", F.linear, r(4, 16), r(8, 16), weights=(1,))
row("linear_3d_bias", F.linear, r(2, 5, 16), r(8, 16), r(8), weights=(1, 2))
row("linear_3d_nobias", F.linear, r(2, 5, 16), r(8, 16), weights=(1,))
row("linear_4d", F.linear, r(2, 3, 4, 16), r(8, 16), r(8), weights=(1, 2))
row("einsum_bmm", lambda a, b: torch.einsum("bij,bjk->bik", a, b), r(2, 4, 8), r(2, 8, 5))
row("einsum_attn", lambda q, k: torch.einsum("bhqd,bhkd->bhqk", q, k), r(2, 3, 5, 8), r(2, 3, 6, 8))
row("einsum_outer", lambda a, b: torch.einsum("i,j->ij", a, b), r(5), r(7))
row("einsum_rowdot", lambda a, b: torch.einsum("bi,bi->b", a, b), r(4, 8), r(4, 8))

# --------------------------------------------------------------------------------------
# convolutions
# --------------------------------------------------------------------------------------

row("conv1d", F.conv1d, r(2, 4, 16), r(6, 4, 3), r(6), padding=1, weights=(1, 2))
row("conv1d_stride2", F.conv1d, r(2, 4, 16), r(6, 4, 3), r(6), stride=2, weights=(1, 2))
row("conv1d_dilation2_nobias", F.conv1d, r(2, 4, 16), r(6, 4, 3), None, padding=2, dilation=2, weights=(1,))
row("conv1d_groups2", F.conv1d, r(2, 4, 16), r(6, 2, 3), r(6), padding=1, groups=2, weights=(1, 2))
row("conv1d_same", F.conv1d, r(2, 4, 16), r(6, 4, 4), r(6), padding="same", weights=(1, 2))
row("conv2d", F.conv2d, r(*X), r(4, 3, 3, 3), r(4), padding=1, weights=(1, 2))
row("conv2d_valid", F.conv2d, r(*X), r(4, 3, 3, 3), r(4), weights=(1, 2))
row("conv2d_stride2_pad1", F.conv2d, r(*X), r(4, 3, 3, 3), r(4), stride=2, padding=1, weights=(1, 2))
row("conv2d_stride2_k2", F.conv2d, r(*X), r(4, 3, 2, 2), r(4), stride=2, weights=(1, 2))
row("conv2d_same_k3", F.conv2d, r(*X), r(4, 3, 3, 3), r(4), padding="same", weights=(1, 2))
row("conv2d_same_k4", F.conv2d, r(*X), r(4, 3, 4, 4), r(4), padding="same", weights=(1, 2))
row("conv2d_padding_valid_str", F.conv2d, r(*X), r(4, 3, 3, 3), r(4), padding="valid", weights=(1, 2))
row("conv2d_dilation2", F.conv2d, r(*X), r(4, 3, 3, 3), r(4), padding=2, dilation=2, weights=(1, 2))
row("conv2d_groups2", F.conv2d, r(2, 4, 8, 8), r(6, 2, 3, 3), r(6), padding=1, groups=2, weights=(1, 2))
row("conv2d_depthwise", F.conv2d, r(2, 4, 8, 8), r(4, 1, 3, 3), r(4), padding=1, groups=4, weights=(1, 2))
row("conv2d_depthwise_mult2", F.conv2d, r(2, 4, 8, 8), r(8, 1, 3, 3), r(8), padding=1, groups=4, weights=(1, 2))
row("conv2d_depthwise_stride2", F.conv2d, r(2, 4, 8, 8), r(4, 1, 3, 3), r(4), stride=2, padding=1, groups=4,
    weights=(1, 2))
row("conv2d_depthwise_k7", F.conv2d, r(2, 4, 8, 8), r(4, 1, 7, 7), r(4), padding=3, groups=4, weights=(1, 2))
row("conv2d_depthwise_dilated", F.conv2d, r(2, 4, 9, 9), r(4, 1, 3, 3), r(4), padding=2, dilation=2, groups=4,
    weights=(1, 2))
row("conv2d_depthwise_mixed", F.conv2d, r(1, 6, 9, 7), r(6, 1, 3, 5), None, stride=(2, 1), padding=(1, 0), groups=6,
    weights=(1,))
row("conv2d_nobias", F.conv2d, r(*X), r(4, 3, 3, 3), padding=1, weights=(1,))
row("conv2d_1x1", F.conv2d, r(*X), r(5, 3, 1, 1), r(5), weights=(1, 2))
row("conv2d_asym_kernel", F.conv2d, r(*X), r(4, 3, 3, 5), r(4), padding=(1, 2), weights=(1, 2))
row("conv2d_asym_stride", F.conv2d, r(*X), r(4, 3, 3, 3), r(4), stride=(2, 1), padding=1, weights=(1, 2))
row("conv2d_patchify", F.conv2d, r(2, 3, 16, 16), r(8, 3, 4, 4), r(8), stride=4, weights=(1, 2))
row("conv_transpose2d_s2_k4_p1", F.conv_transpose2d, r(2, 4, 5, 5), r(4, 3, 4, 4), r(3), stride=2, padding=1,
    weights=(1, 2))
row("conv_transpose2d_s2_outpad1", F.conv_transpose2d, r(2, 4, 5, 5), r(4, 3, 3, 3), r(3), stride=2, padding=1,
    output_padding=1, weights=(1, 2))
row("conv_transpose2d_s2_k2", F.conv_transpose2d, r(2, 4, 5, 5), r(4, 6, 2, 2), r(6), stride=2, weights=(1, 2))
row("conv_transpose2d_groups2", F.conv_transpose2d, r(2, 4, 5, 5), r(4, 3, 3, 3), r(6), stride=2, padding=1, groups=2,
    weights=(1, 2))
row("conv_transpose2d_nobias", F.conv_transpose2d, r(2, 4, 5, 5), r(4, 3, 3, 3), stride=1, padding=1, weights=(1,))
row("conv_transpose1d_s2", F.conv_transpose1d, r(2, 4, 7), r(4, 3, 4), r(3), stride=2, padding=1, weights=(1, 2))

# --------------------------------------------------------------------------------------
# pooling, resampling
# --------------------------------------------------------------------------------------

row("max_pool2d_k2", F.max_pool2d, distinct(*X), 2)
row("max_pool2d_k3_s2_p1", F.max_pool2d, distinct(*X), 3, stride=2, padding=1)
row("max_pool2d_k3_s2_ceil", F.max_pool2d, distinct(*X), 3, stride=2, ceil_mode=True)
row("max_pool2d_k3_s1_p1", F.max_pool2d, distinct(*X), 3, stride=1, padding=1)
row("max_pool2d_k3_s2_p1_ceil_odd", F.max_pool2d, distinct(2, 3, 9, 9), 3, stride=2, padding=1, ceil_mode=True)
row("avg_pool2d_k2", F.avg_pool2d, r(*X), 2)
row("avg_pool2d_k3_s2_p1_incl", F.avg_pool2d, r(*X), 3, stride=2, padding=1, count_include_pad=True)
row("avg_pool2d_k3_s2_p1_excl", F.avg_pool2d, r(*X), 3, stride=2, padding=1, count_include_pad=False)
row("avg_pool2d_k3_s1_p1_excl", F.avg_pool2d, r(*X), 3, stride=1, padding=1, count_include_pad=False)
row("avg_pool2d_k3_s2_ceil", F.avg_pool2d, r(*X), 3, stride=2, ceil_mode=True)
row("avg_pool1d_k2", F.avg_pool1d, r(2, 4, 10), 2)
row("adaptive_avg_pool2d_1", F.adaptive_avg_pool2d, r(*X), 1)
row("adaptive_avg_pool2d_4", F.adaptive_avg_pool2d, r(*X), 4)
row("adaptive_avg_pool2d_2x4", F.adaptive_avg_pool2d, r(*X), (2, 4))
row("adaptive_avg_pool1d_1", F.adaptive_avg_pool1d, r(2, 6, 10), 1)
row("interp_nearest_x2", F.interpolate, r(2, 3, 5, 6), scale_factor=2, mode="nearest")
row("interp_nearest_size", F.interpolate, r(2, 3, 5, 6), size=(10, 18), mode="nearest")
row("interp_nearest_down", F.interpolate, r(*X), size=(4, 4), mode="nearest")
row("interp_bilinear_x2", F.interpolate, r(2, 3, 5, 6), scale_factor=2, mode="bilinear", align_corners=False)
row("interp_bilinear_x2_ac", F.interpolate, r(2, 3, 5, 6), scale_factor=2, mode="bilinear", align_corners=True)
row("interp_bilinear_size", F.interpolate, r(2, 3, 5, 6), size=(13, 11), mode="bilinear", align_corners=False)
row("interp_bilinear_size_ac", F.interpolate, r(2, 3, 5, 6), size=(13, 11), mode="bilinear", align_corners=True)
row("interp_bilinear_down", F.interpolate, r(*X), size=(5, 3), mode="bilinear", align_corners=False)
row("interp_bilinear_from1x1", F.interpolate, r(2, 3, 1, 1), size=(4, 4), mode="bilinear", align_corners=False)
row("pixel_shuffle", F.pixel_shuffle, r(2, 8, 4, 5), 2)
row("pixel_unshuffle", F.pixel_unshuffle, r(2, 2, 8, 6), 2)

# --------------------------------------------------------------------------------------
# normalisation, embedding
# --------------------------------------------------------------------------------------

row("layer_norm_affine", F.layer_norm, r(2, 5, 16), (16,), 1 + 0.2 * r(16), 0.1 * r(16), weights=(2, 3))
row("layer_norm_noaffine", F.layer_norm, r(2, 5, 16), (16,))
row("layer_norm_2d_shape", F.layer_norm, r(2, 5, 4, 6), (4, 6), 1 + 0.2 * r(4, 6), 0.1 * r(4, 6), eps=1e-6,
    weights=(2, 3))
row("layer_norm_offset", F.layer_norm, r(2, 5, 16) * 3 + 5, (16,), 1 + 0.2 * r(16), 0.1 * r(16), weights=(2, 3))
row("group_norm_g2", F.group_norm, r(2, 4, 6, 6), 2, 1 + 0.2 * r(4), 0.1 * r(4), weights=(2, 3))
row("group_norm_g1_noaffine", F.group_norm, r(2, 4, 6, 6), 1)
row("group_norm_per_channel", F.group_norm, r(2, 4, 6, 6), 4, 1 + 0.2 * r(4), 0.1 * r(4), weights=(2, 3))
row(
    "batch_norm_eval",
    F.batch_norm,
    r(*X),
    0.3 * r(3),
    pos(3),
    1 + 0.2 * r(3),
    0.1 * r(3),
    training=False,
    eps=1e-5,
    weights=(1, 2, 3, 4),
)
row("batch_norm_eval_noaffine", F.batch_norm, r(2, 3, 5), 0.3 * r(3), pos(3), training=False, weights=(1, 2))
row("embedding_i64", F.embedding, ints(2, 5, lo=0, hi=20, dtype=torch.int64), r(20, 8), weights=(1,))
row("embedding_i32", F.embedding, ints(2, 5, lo=0, hi=20, dtype=torch.int32), r(20, 8), weights=(1,))
row("embedding_1d", F.embedding, ints(7, lo=0, hi=20, dtype=torch.int64), r(20, 8), weights=(1,))

# --------------------------------------------------------------------------------------
# attention
# --------------------------------------------------------------------------------------

SDPA = F.scaled_dot_product_attention
row("sdpa", SDPA, r(2, 4, 8, 16), r(2, 4, 8, 16), r(2, 4, 8, 16))
row("sdpa_causal", SDPA, r(2, 4, 8, 16), r(2, 4, 8, 16), r(2, 4, 8, 16), is_causal=True)
row("sdpa_float_mask", SDPA, r(2, 4, 8, 16), r(2, 4, 8, 16), r(2, 4, 8, 16), attn_mask=r(8, 8))
row(
    "sdpa_float_mask_bcast",
    SDPA,
    r(2, 4, 8, 16),
    r(2, 4, 8, 16),
    r(2, 4, 8, 16),
    attn_mask=torch.where(bools(2, 1, 1, 8), -1e4, 0.0).expand(2, 1, 8, 8).contiguous(),
)
_bmask = bools(8, 8)
_bmask[:, 0] = True  # no fully masked rows
row("sdpa_bool_mask", SDPA, r(2, 4, 8, 16), r(2, 4, 8, 16), r(2, 4, 8, 16), attn_mask=_bmask)
row("sdpa_scale", SDPA, r(2, 4, 8, 16), r(2, 4, 8, 16), r(2, 4, 8, 16), scale=0.5)
row("sdpa_cross_len", SDPA, r(2, 4, 8, 16), r(2, 4, 12, 16), r(2, 4, 12, 16))
row("sdpa_3d", SDPA, r(4, 8, 16), r(4, 8, 16), r(4, 8, 16))
row("sdpa_gqa", SDPA, r(2, 4, 8, 16), r(2, 2, 8, 16), r(2, 2, 8, 16), enable_gqa=True)
row("sdpa_gqa_causal", SDPA, r(2, 4, 8, 16), r(2, 1, 8, 16), r(2, 1, 8, 16), is_causal=True, enable_gqa=True)

# --------------------------------------------------------------------------------------
# shape / layout
# --------------------------------------------------------------------------------------

row("reshape", lambda x: x.reshape(2, 3, 64), r(*X))
row("reshape_infer", lambda x: x.reshape(-1, 8), r(*X))
row("view", lambda x: x.view(6, 8, 8), r(*X))
row("view_split_heads", lambda x: x.view(2, 5, 4, 4).transpose(1, 2), r(2, 5, 16))
row("flatten_1", lambda x: torch.flatten(x, 1), r(*X))
row("flatten_1_2", lambda x: x.flatten(1, 2), r(*X))
row("flatten_all", torch.flatten, r(*X))
row("permute_nhwc", lambda x: x.permute(0, 2, 3, 1), r(*X))
row("permute_5d", lambda x: x.permute(2, 0, 3, 1, 4), r(2, 3, 4, 5, 6))
row("transpose", lambda x: x.transpose(1, 2), r(*X))
row("transpose_neg", lambda x: x.transpose(-1, -3), r(*X))
row("t_2d", torch.t, r(4, 7))
row("unsqueeze_0", lambda x: x.unsqueeze(0), r(3, 4))
row("unsqueeze_neg1", lambda x: x.unsqueeze(-1), r(3, 4))
row("squeeze_dim", lambda x: x.squeeze(1), r(3, 1, 4))
row("squeeze_all", torch.squeeze, r(1, 3, 1, 4))
row("squeeze_neg", lambda x: x.squeeze(-1), r(3, 4, 1))
row("expand", lambda x: x.expand(2, 3, 4), r(1, 3, 1))
row("expand_neg1", lambda x: x.expand(5, -1, -1), r(1, 3, 4))
row("expand_new_dim", lambda x: x.expand(2, 3, 4), r(3, 4))
row("repeat", lambda x: x.repeat(2, 1, 3), r(2, 3, 4))
row("repeat_new_dim", lambda x: x.repeat(2, 1, 1), r(3, 4))
row("repeat_interleave", lambda x: x.repeat_interleave(2, dim=1), r(2, 3, 4))
row("cat_dim1", lambda a, b: torch.cat([a, b], dim=1), r(2, 3, 4), r(2, 5, 4))
row("cat_neg1", lambda a, b, c: torch.cat([a, b, c], dim=-1), r(2, 3, 4), r(2, 3, 1), r(2, 3, 2))
row("cat_dim0", lambda a, b: torch.cat((a, b)), r(2, 3), r(1, 3))
row("stack_0", lambda a, b: torch.stack([a, b]), r(3, 4), r(3, 4))
row("stack_neg1", lambda a, b, c: torch.stack([a, b, c], dim=-1), r(3, 4), r(3, 4), r(3, 4))
row("split_size", lambda x: torch.split(x, 2, dim=1), r(2, 6, 4))
row("split_uneven", lambda x: torch.split(x, 4, dim=-1), r(2, 3, 10))
row("split_sizes", lambda x: torch.split(x, [1, 2, 3], dim=1), r(2, 6, 4))
row("chunk_2", lambda x: x.chunk(2, dim=1), r(2, 6, 4))
row("chunk_3_neg", lambda x: torch.chunk(x, 3, dim=-1), r(2, 3, 9))
row("unbind_0", lambda x: torch.unbind(x, 0), r(3, 4, 5))
row("slice_step", lambda x: x[:, 1:-1:2], r(2, 9, 4))
row("slice_last_step", lambda x: x[..., ::2], r(2, 3, 8))
row("slice_neg_start", lambda x: x[:, -3:], r(2, 8, 4))
row("slice_2d", lambda x: x[:, :, 1:5, 2:7], r(*X))
row("slice_odd_even", lambda x: x[:, 1::2, 0::2], r(2, 8, 8, 3))
row("narrow", lambda x: x.narrow(2, 1, 3), r(2, 3, 8))
row("select_0", lambda x: x[:, 0], r(2, 5, 4))
row("select_neg1", lambda x: x[:, -1], r(2, 5, 4))
row("select_last_dim", lambda x: x[..., 2], r(2, 5, 4))
row("index_select", torch.index_select, r(5, 6), 1, torch.tensor([4, 0, 2, 2], dtype=torch.int64))
row("index_select_dim0", torch.index_select, r(5, 6), 0, torch.tensor([3, 1], dtype=torch.int64))
row("index_tensor", lambda x, i: x[i], r(6, 4), torch.tensor([5, 0, 3, 3], dtype=torch.int64))
row("gather_dim1", torch.gather, r(3, 5), 1, ints(3, 4, lo=0, hi=5, dtype=torch.int64))
row("gather_last", torch.gather, r(2, 3, 6), -1, ints(2, 3, 2, lo=0, hi=6, dtype=torch.int64))
row("take_along_dim", lambda x, i: torch.take_along_dim(x, i, dim=1), r(3, 5),
    ints(3, 2, lo=0, hi=5, dtype=torch.int64))
row("roll_1", lambda x: torch.roll(x, 1, 1), r(2, 5, 4))
row("roll_2d", lambda x: torch.roll(x, shifts=(2, -1), dims=(2, 3)), r(*X))
row("roll_flat", lambda x: torch.roll(x, 3), r(3, 4))
row("flip_last", lambda x: torch.flip(x, [-1]), r(*X))
row("flip_hw", lambda x: torch.flip(x, [2, 3]), r(*X))
row("pad_constant", F.pad, r(*X), [1, 1, 2, 0])
row("pad_constant_value", F.pad, r(2, 3, 5), [2, 3], value=0.5)
row("pad_reflect", F.pad, r(2, 3, 5, 6), [1, 2, 2, 1], mode="reflect")
row("pad_replicate", F.pad, r(2, 3, 5, 6), [2, 1, 1, 2], mode="replicate")
row("pad_reflect_1d", F.pad, r(2, 3, 7), [2, 2], mode="reflect")
row("pad_channels", F.pad, r(2, 3, 4, 4), [0, 0, 0, 0, 1, 2])
row("unfold_overlapping", lambda x: x.unfold(1, 3, 2), r(2, 9, 4))
row("unfold_last_dim", lambda x: x.unfold(-1, 4, 4), r(3, 18))
row("unfold_dim0_step1", lambda x: x.unfold(0, 2, 1), r(5, 3))
row("unfold_patches", lambda x: x.unfold(2, 16, 8), r(2, 3, 64))  # PatchTST's patching of a series
row("unfold_int", lambda x: x.unfold(1, 2, 3), ints(2, 8), kind="int")
row("tril", torch.tril, r(6, 6))
row("tril_neg1", torch.tril, r(2, 5, 7), -1)
row("triu", torch.triu, r(6, 6))
row("triu_1", torch.triu, r(2, 5, 7), 1)
row("clone", torch.clone, r(*X))
row("contiguous", lambda x: x.transpose(1, 2).contiguous(), r(2, 3, 4))
row("arange_add", lambda x: x + torch.arange(x.shape[-1]), r(3, 8))
row("arange_float_mul", lambda x: x * torch.arange(x.shape[1], dtype=torch.float32)[:, None], r(2, 5, 3))
row("arange_step", lambda x: x + torch.arange(0, 2 * x.shape[-1], 2), r(3, 6))
row("arange_mask", lambda x: x.masked_fill(torch.arange(x.shape[-1]) >= 5, 0.0), r(3, 8))
row("full_like", lambda x: torch.full_like(x, 2.5), r(3, 4))
row("zeros_like_add", lambda x: x + torch.zeros_like(x), r(3, 4))
row("ones_like_sub", lambda x: torch.ones_like(x) - x, r(3, 4))
row("new_full", lambda x: x.new_full((2, 3), 1.5), r(3, 4))

# --------------------------------------------------------------------------------------
# casts
# --------------------------------------------------------------------------------------

row("to_int32", lambda x: x.to(torch.int32), away_from_half(4, 6), kind="int")
row("to_int64", lambda x: x.to(torch.int64), away_from_half(4, 6), kind="int")
row("float_to_bool", lambda x: x.to(torch.bool), torch.where(bools(4, 6), 0.0, r(4, 6)), kind="bool")
row("bool_to_float", lambda x: x.to(torch.float32), bools(4, 6))
row("bool_to_int", lambda x: x.to(torch.int32), bools(4, 6), kind="int")
row("int_to_float", lambda x: x.float(), ints(4, 6))
row("int64_to_int32", lambda x: x.to(torch.int32), ints(4, 6, dtype=torch.int64), kind="int")
row("int32_to_int64", lambda x: x.long(), ints(4, 6), kind="int")
row("bool_mask_mul", lambda x, m: x * m.to(x.dtype), r(3, 4), bools(3, 4))
row("type_as", lambda x, y: x.type_as(y), ints(3, 4), r(3, 4))

# --------------------------------------------------------------------------------------
# sorting / selection
# --------------------------------------------------------------------------------------

row("topk_3", lambda x: torch.topk(x, 3), distinct(4, 10))
row("topk_smallest_dim1", lambda x: torch.topk(x, 2, dim=1, largest=False), distinct(2, 6, 5))
row("topk_values", lambda x: torch.topk(x, 4).values, distinct(3, 9))
row("topk_indices", lambda x: torch.topk(x, 4).indices, distinct(3, 9), kind="int")
row("sort_last", lambda x: torch.sort(x), distinct(4, 10))
row("sort_desc_dim0", lambda x: torch.sort(x, dim=0, descending=True), distinct(6, 3))
row("argsort", lambda x: torch.argsort(x, dim=-1), distinct(4, 10), kind="int")

# --------------------------------------------------------------------------------------
# integer arithmetic
# --------------------------------------------------------------------------------------

_ia, _ib = ints(4, 6, lo=-50, hi=50), ints(4, 6, lo=-50, hi=50)
row("int_add", torch.add, _ia, _ib, kind="int")
row("int_sub", torch.sub, ints(4, 6), ints(4, 6), kind="int")
row("int_mul", torch.mul, ints(4, 6), ints(4, 6), kind="int")
row("int_add_scalar", lambda x: x + 3, ints(4, 6), kind="int")
row("int_mul_scalar", lambda x: x * -2, ints(4, 6), kind="int")
row("int64_add", torch.add, ints(4, 6, dtype=torch.int64), ints(4, 6, dtype=torch.int64), kind="int")
row("int_neg", torch.neg, ints(4, 6), kind="int")
row("int_abs", torch.abs, ints(4, 6), kind="int")
row("int_maximum", torch.maximum, ints(4, 6), ints(4, 6), kind="int")
row("int_minimum", torch.minimum, ints(4, 6), ints(4, 6), kind="int")
row("int_clamp", lambda x: x.clamp(-5, 5), ints(4, 6), kind="int")
row("int_sum", lambda x: x.sum(dim=1), ints(4, 6), kind="int")
row("int_cumsum", lambda x: torch.cumsum(x, dim=-1), ints(4, 6), kind="int")
row("int_where", torch.where, bools(4, 6), ints(4, 6), ints(4, 6), kind="int")
row("int_floor_divide", torch.floor_divide, ints(4, 6, lo=-50, hi=50),
    ints(4, 6, lo=1, hi=7) * torch.where(bools(4, 6), -1, 1).to(torch.int32), kind="int")
row("int_floor_divide_scalar", lambda x: x // 4, ints(4, 6, lo=-50, hi=50), kind="int")
row("int_remainder", torch.remainder, ints(4, 6, lo=-50, hi=50),
    ints(4, 6, lo=1, hi=7) * torch.where(bools(4, 6), -1, 1).to(torch.int32), kind="int")
row("int_remainder_scalar", lambda x: x % 5, ints(4, 6, lo=-50, hi=50), kind="int")
row("int_fmod", torch.fmod, ints(4, 6, lo=-50, hi=50),
    ints(4, 6, lo=1, hi=7) * torch.where(bools(4, 6), -1, 1).to(torch.int32), kind="int")
row("bitwise_and", torch.bitwise_and, ints(4, 6, lo=0, hi=256), ints(4, 6, lo=0, hi=256), kind="int")
row("bitwise_or", torch.bitwise_or, ints(4, 6, lo=0, hi=256), ints(4, 6, lo=-256, hi=256), kind="int")
row("bitwise_xor", torch.bitwise_xor, ints(4, 6, lo=-256, hi=256), ints(4, 6, lo=0, hi=256), kind="int")
row("bitwise_not", torch.bitwise_not, ints(4, 6, lo=-256, hi=256), kind="int")
row("bitwise_and_scalar", lambda x: x & 7, ints(4, 6, lo=0, hi=256), kind="int")
row("bitwise_left_shift", torch.bitwise_left_shift, ints(4, 6, lo=0, hi=256), ints(4, 6, lo=0, hi=8), kind="int")
row("bitwise_right_shift", torch.bitwise_right_shift, ints(4, 6, lo=-256, hi=256), ints(4, 6, lo=0, hi=8), kind="int")
row("bool_bitwise_and", torch.bitwise_and, bools(4, 6), bools(4, 6), kind="bool")

# float remainder / fmod / floor_divide (sign conventions differ: remainder follows the
# divisor, fmod the dividend); x = q * y with q away from integers keeps x / y clear of
# the discontinuities.
_fy = nz(4, 6, lo=0.7, hi=1.3)
_fx = away_from_half(4, 6) * _fy
row("remainder", torch.remainder, _fx * 1.0, _fy * 1.0)
row("remainder_scalar", lambda x: torch.remainder(x, 1.5), away_from_half(4, 6) * 1.5)
row("fmod", torch.fmod, _fx * 1.0, _fy * 1.0)
row("fmod_scalar", lambda x: torch.fmod(x, 1.5), away_from_half(4, 6) * 1.5)
row("floor_divide", torch.floor_divide, _fx * 1.0, _fy * 1.0)
row("div_floor_mode", lambda a, b: torch.div(a, b, rounding_mode="floor"), _fx * 1.0, _fy * 1.0)
row("div_trunc_mode", lambda a, b: torch.div(a, b, rounding_mode="trunc"), _fx * 1.0, _fy * 1.0)


# --------------------------------------------------------------------------------------
# coverage rows: one or more per core ATen overload a backend lowers (tpu_export/op_support.py
# reads the ops of each row's converted graph). Overloads torch.export only writes when asked
# (add.Scalar, prod.default, ...) are called through torch.ops.aten directly.
# --------------------------------------------------------------------------------------

aten = torch.ops.aten

row("aten_add_scalar", lambda x: aten.add.Scalar(x, 1.5), r(3, 4))
row("aten_add_scalar_alpha", lambda x: aten.add.Scalar(x, 2, 3), ints(3, 4), kind="int")
row("aten_sub_scalar", lambda x: aten.sub.Scalar(x, 0.25), r(3, 4))
row("aten_mul_scalar", lambda x: aten.mul.Scalar(x, -3), ints(3, 4), kind="int")
row("aten_div_scalar", lambda x: aten.div.Scalar(x, 4.0), r(3, 4))
row("aten_div_scalar_floor", lambda x: aten.div.Scalar_mode(x, 1.5, rounding_mode="floor"), r(3, 4, scale=3.0))
row("aten_ge_scalar", lambda x: aten.ge.Scalar(x, 0.1), r(3, 4), kind="bool")
row("aten_lt_scalar_int", lambda x: aten.lt.Scalar(x, 2), ints(3, 4, lo=-5, hi=5), kind="bool")
row("aten_ne_scalar", lambda x: aten.ne.Scalar(x, 1), ints(3, 4, lo=0, hi=3), kind="bool")
row("aten_alias", lambda x: aten.alias.default(x) * 2.0, r(3, 4))
row("addmm", torch.addmm, r(3, 5), r(3, 4), r(4, 5))
row("addmm_beta_alpha", lambda b, x, y: torch.addmm(b, x, y, beta=0.5, alpha=2.0), r(5), r(3, 4), r(4, 5))
row("any_all_dims", lambda x: aten.any.default(x), bools(3, 4), kind="bool")
row("any_dim1", lambda x: torch.any(x, dim=1), bools(3, 4, 2), kind="bool")
row("any_dims_int", lambda x: torch.any(x, dim=(0, 2), keepdim=True), ints(3, 4, 2, lo=0, hi=2), kind="bool")
# the converter folds small constants; these are past its 64 KiB folding limit, so they stay ops
row("arange_step3_add", lambda x: x + torch.arange(2, 51002, 3), r(1))
row("arange_int", lambda x: x * torch.arange(17000, dtype=torch.int32), ints(1), kind="int")
row("as_strided_view", lambda x: torch.as_strided(x, (3, 4), (4, 1)) * 2.0, r(3, 4))
row("expm1", torch.expm1, r(3, 4))
row("log1p", torch.log1p, pos(3, 4, lo=0.0, hi=3.0))
row("full_add", lambda x: x + torch.full((130, 128), 2.5), r(1))
row("max_dim", lambda x: torch.max(x, 1), distinct(3, 5))
row("max_dim_keepdim", lambda x: torch.max(x, 0, keepdim=True), distinct(3, 5))
row("min_dim", lambda x: torch.min(x, -1), distinct(2, 3, 5))
row("reflection_pad1d", lambda x: aten.reflection_pad1d(x, [2, 1]), r(2, 3, 6))
row("reflection_pad2d", lambda x: aten.reflection_pad2d(x, [1, 2, 2, 1]), r(1, 2, 5, 6))
row("reflection_pad3d", lambda x: aten.reflection_pad3d(x, [1, 1, 0, 1, 1, 0]), r(1, 2, 3, 4, 5))
row("replication_pad2d", F.pad, r(1, 2, 4, 5), [1, 2, 0, 1], mode="replicate")
row("replication_pad3d", F.pad, r(1, 2, 3, 3, 4), [1, 0, 1, 1, 0, 1], mode="replicate")
row("adaptive_avg_pool1d_2", F.adaptive_avg_pool1d, r(2, 3, 8), 2)
row("avg_pool1d_k3_s2", F.avg_pool1d, r(2, 3, 9), 3, 2)
row("var_dim_unbiased", lambda x: torch.var(x, 1), r(3, 6))
row("var_dim_biased_keepdim", lambda x: torch.var(x, -1, unbiased=False, keepdim=True), r(2, 3, 5))
row("fill_scalar", lambda x: torch.fill(x, 3.0) + x, r(3, 4))
row("select_scatter", lambda x, s: torch.select_scatter(x, s, 0, 1), r(3, 5), r(5))
row("slice_scatter", lambda x, s: torch.slice_scatter(x, s, 1, 1, 7, 2), r(3, 8), r(3, 3))
row("slice_scatter_dim0", lambda x, s: torch.slice_scatter(x, s, 0, 2), r(5, 3), r(3, 3))
row("scatter_src", lambda x, i, s: x.scatter(1, i, s), r(3, 5),
    torch.stack([torch.randperm(5, generator=_G)[:2] for _ in range(3)]), r(3, 4))
row("scatter_value", lambda x, i: x.scatter(0, i, 2.5), r(3, 5), torch.randperm(3, generator=_G)[:1].expand(1, 5) * 1)
row("scatter_add", lambda x, i, s: x.scatter_add(0, i, s), r(3, 5), torch.randint(0, 3, (4, 5), generator=_G),
    r(4, 5))
row("scatter_reduce_amax", lambda x, i, s: x.scatter_reduce(0, i, s, "amax", include_self=False), r(3, 5),
    torch.randint(0, 3, (4, 5), generator=_G), r(4, 5))
row("scatter_reduce_sum_dim1", lambda x, i, s: x.scatter_reduce(1, i, s, "sum"), r(3, 5),
    torch.randint(0, 5, (3, 4), generator=_G), r(3, 6))
row("scatter_reduce_amin_self", lambda x, i, s: x.scatter_reduce(0, i, s, "amin"), r(3, 5),
    torch.randint(0, 3, (4, 5), generator=_G), r(4, 5))
row("scatter_reduce_prod", lambda x, i, s: x.scatter_reduce(0, i, s, "prod", include_self=False), r(3, 5),
    torch.randint(0, 3, (2, 5), generator=_G), pos(2, 5))
row("scatter_reduce_mean", lambda x, i, s: x.scatter_reduce(0, i, s, "mean"), r(3, 5),
    torch.randint(0, 3, (4, 5), generator=_G), r(4, 5))
row("scatter_reduce_mean_excl", lambda x, i, s: x.scatter_reduce(0, i, s, "mean", include_self=False), r(3, 5),
    torch.randint(0, 3, (4, 5), generator=_G), r(4, 5))
row("scatter_reduce_amax_int", lambda x, i, s: x.scatter_reduce(1, i, s, "amax"), ints(2, 4),
    torch.randint(0, 4, (2, 3), generator=_G), ints(2, 3), kind="int")
row("index_put", lambda x, i, v: x.index_put((i,), v), r(6, 4), torch.tensor([4, 0, -1]), r(3, 4))
row("index_put_acc", lambda x, i, v: x.index_put((i,), v, accumulate=True), r(6, 4), torch.tensor([1, 1, 3]),
    r(3, 4))
row("index_put_2d", lambda x, i, j, v: x.index_put((i, j), v), r(4, 5), torch.tensor([0, 3, 2]),
    torch.tensor([4, 1, 2]), r(3))
# a KV-cache write: new keys at their positions on the sequence axis (index_copy becomes index_put with
# leading full slices)
row("index_copy_seq", lambda x, i, v: x.index_copy(2, i, v), r(1, 2, 8, 4), torch.tensor([3, 4, 5]), r(1, 2, 3, 4))
row("index_put_lead", lambda x, i, v: torch.ops.aten.index_put(x, [None, i], v), r(3, 6, 2),
    torch.tensor([5, 0, -2]), r(3, 3, 2))
row("masked_scatter", lambda x, m, s: x.masked_scatter(m, s), r(3, 4), bools(3, 4), r(12))
row("atan2", torch.atan2, r(3, 4), r(3, 4))
row("atan", torch.atan, r(3, 4, scale=3.0))
row("asin", torch.asin, u(3, 4, lo=-0.95, hi=0.95))
row("acos", torch.acos, u(3, 4, lo=-0.95, hi=0.95))
row("tan", torch.tan, u(3, 4, lo=-1.2, hi=1.2))
row("sinh", torch.sinh, r(3, 4))
row("cosh", torch.cosh, r(3, 4))
row("asinh", torch.asinh, r(3, 4, scale=3.0))
row("acosh", torch.acosh, pos(3, 4, lo=1.05, hi=5.0))
row("atanh", torch.atanh, u(3, 4, lo=-0.9, hi=0.9))
row("log2", torch.log2, pos(3, 4, lo=0.1, hi=10.0))
row("log10", torch.log10, pos(3, 4, lo=0.1, hi=10.0))
row("trunc", torch.trunc, away_from_half(3, 4))
row("isnan", torch.isnan, torch.tensor([1.0, float("nan"), float("inf"), -float("inf"), 0.0, -2.0]), kind="bool")
row("isinf", torch.isinf, torch.tensor([1.0, float("nan"), float("inf"), -float("inf"), 0.0, -2.0]), kind="bool")
row("bool_bitwise_or", torch.bitwise_or, bools(3, 4), bools(3, 4), kind="bool")
row("bool_bitwise_not", torch.bitwise_not, bools(3, 4), kind="bool")
row("bool_bitwise_or_scalar", lambda x: aten.bitwise_or.Scalar(x, False), bools(3, 4), kind="bool")
row("bool_bitwise_and_scalar", lambda x: aten.bitwise_and.Scalar(x, True), bools(3, 4), kind="bool")
row("bitwise_xor_scalar", lambda x: x ^ 5, ints(3, 4, lo=0, hi=64), kind="int")
row("prod_all", torch.prod, pos(2, 3, lo=0.7, hi=1.4))
row("diagonal", lambda x: torch.diagonal(x, 1, -2, -1), r(2, 4, 5))
row("diagonal_neg_offset", lambda x: torch.diagonal(x, -1, 0, 2), r(4, 2, 3))
row("native_layer_norm", lambda x, w, b: aten.native_layer_norm(x, [6], w, b, 1e-5), r(2, 3, 6), r(6), r(6))
row("native_group_norm", lambda x, w, b: aten.native_group_norm(x, w, b, 2, 4, 6, 2, 1e-5), r(2, 4, 2, 3),
    r(4), r(4))
row("cdist_p2", torch.cdist, r(2, 5, 3), r(2, 4, 3))
row("cdist_p1", lambda a, b: torch.cdist(a, b, p=1.0), r(5, 3), r(4, 3))
row("empty_fill", lambda x: x + torch.empty(3, 4).fill_(1.5), r(3, 4))
row("empty_strided_fill", lambda x: x + torch.empty_strided((3, 4), (4, 1)).fill_(0.5), r(3, 4))
row("copy", lambda x, y: aten.copy.default(x, y), r(3, 4), r(4))
# integer / boolean variants of the scatters and data movement above
row("slice_scatter_int", lambda x, s: torch.slice_scatter(x, s, 1, 0, 4, 2), ints(3, 6), ints(3, 2), kind="int")
row("scatter_add_int", lambda x, i, s: x.scatter_add(1, i, s), ints(2, 4), torch.randint(0, 4, (2, 3), generator=_G),
    ints(2, 3), kind="int")
row("index_put_int_acc", lambda x, i, v: x.index_put((i,), v, accumulate=True), ints(5, 3), torch.tensor([0, 4, 0]),
    ints(3, 3), kind="int")
row("masked_scatter_bool", lambda x, m, s: x.masked_scatter(m, s), bools(2, 5), bools(2, 5), bools(10), kind="bool")
row("diagonal_int", lambda x: torch.diagonal(x), ints(4, 4), kind="int")
row("copy_int_to_float", lambda x, y: aten.copy.default(x, y), r(2, 3), ints(2, 3))
row("avg_pool3d", lambda x: F.avg_pool3d(x, 2), r(1, 2, 4, 4, 4))
row("max_pool3d", lambda x: F.max_pool3d(x, 2), distinct(1, 2, 4, 4, 4))
row("avg_pool3d_k323_s212", lambda x: F.avg_pool3d(x, (3, 2, 3), (2, 1, 2)), r(2, 2, 5, 4, 7))
row("max_pool3d_k232_s1", lambda x: F.max_pool3d(x, (2, 3, 2), 1), distinct(1, 3, 3, 5, 4))
row("adaptive_avg_pool3d", lambda x: F.adaptive_avg_pool3d(x, (2, 1, 2)), r(1, 2, 4, 3, 4))
row("grid_sample_bilinear_border_ac", lambda x, g: F.grid_sample(x, g, padding_mode="border", align_corners=True),
    r(2, 3, 5, 4), u(2, 2, 3, 2, lo=-1.2, hi=1.2))
row("grid_sample_nearest", lambda x, g: F.grid_sample(x, g, mode="nearest", align_corners=False), r(1, 2, 5, 6),
    u(1, 4, 3, 2, lo=-1.1, hi=1.1))
row("grid_sample_bilinear", lambda x, g: F.grid_sample(x, g, align_corners=False), r(1, 2, 4, 5),
    u(1, 3, 4, 2, lo=-1.1, hi=1.1))
# dtype breadth: int8 / uint8 variants of elementwise, comparison, data-movement and cast ops.
# Values stay well inside the range of the dtype, so no result wraps (torch) or saturates (LiteRT).
# int8/uint8 add/sub/eq/lt abort the LiteRT interpreter (its int8 kernels expect quantized
# tensors), so an xfail cannot hold them; they live in tests/tpu/test_ops.py LOCAL_ROWS.
D = (2, 3, 4)
row("dt_i8_mul", torch.mul, ints(*D, lo=-8, hi=8, dtype=torch.int8), ints(*D, lo=-8, hi=8, dtype=torch.int8),
    kind="int")
row("dt_i8_maximum", torch.maximum, ints(*D, dtype=torch.int8), ints(*D, dtype=torch.int8), kind="int")
row("dt_i8_minimum", torch.minimum, ints(*D, dtype=torch.int8), ints(*D, dtype=torch.int8), kind="int")
row("dt_i8_neg", torch.neg, ints(*D, dtype=torch.int8), kind="int")
row("dt_i8_abs", torch.abs, ints(*D, dtype=torch.int8), kind="int")
row("dt_i8_relu", torch.relu, ints(*D, dtype=torch.int8), kind="int")
row("dt_i8_clamp", lambda x: x.clamp(-5, 5), ints(*D, dtype=torch.int8), kind="int")
row("dt_i8_where", torch.where, bools(*D), ints(*D, dtype=torch.int8), ints(*D, dtype=torch.int8), kind="int")
row("dt_i8_cat", lambda a, b: torch.cat([a, b], 1), ints(*D, dtype=torch.int8), ints(2, 2, 4, dtype=torch.int8),
    kind="int")
row("dt_i8_permute", lambda x: x.permute(2, 0, 1), ints(*D, dtype=torch.int8), kind="int")
row("dt_i8_slice", lambda x: x[:, 1:, ::2], ints(*D, dtype=torch.int8), kind="int")
row("dt_i8_to_f32", lambda x: x.to(torch.float32), ints(*D, dtype=torch.int8))
row("dt_f32_to_i8", lambda x: x.round().clamp(-100, 100).to(torch.int8),
    away_from_half(*D) + 10 * ints(*D, lo=-9, hi=9).float(), kind="int")
row("dt_u8_mul", torch.mul, ints(*D, lo=0, hi=15, dtype=torch.uint8), ints(*D, lo=0, hi=15, dtype=torch.uint8),
    kind="int")
row("dt_u8_maximum", torch.maximum, ints(*D, lo=0, hi=250, dtype=torch.uint8),
    ints(*D, lo=0, hi=250, dtype=torch.uint8), kind="int")
row("dt_u8_minimum", torch.minimum, ints(*D, lo=0, hi=250, dtype=torch.uint8),
    ints(*D, lo=0, hi=250, dtype=torch.uint8), kind="int")
row("dt_u8_where", torch.where, bools(*D), ints(*D, lo=0, hi=250, dtype=torch.uint8),
    ints(*D, lo=0, hi=250, dtype=torch.uint8), kind="int")
row("dt_u8_reshape", lambda x: x.reshape(4, 6), ints(*D, lo=0, hi=250, dtype=torch.uint8), kind="int")
row("dt_u8_transpose", lambda x: x.transpose(0, 2), ints(*D, lo=0, hi=250, dtype=torch.uint8), kind="int")
row("dt_u8_to_f32", lambda x: x.to(torch.float32), ints(*D, lo=0, hi=250, dtype=torch.uint8))
# scatter with a constant index (a buffer, as a model holds it): coordinates built at conversion time; a
# coordinate written twice keeps its last write, as torch's CPU kernel does (SCATTER_ND alone would add them)
_SCATTER_IDX = torch.tensor([[1, 0, 3], [2, 4, 0]])
_SCATTER_IDX_REPEATED = torch.tensor([[1, 0, 1], [2, 2, 0]])
row("scatter_src_const_index", lambda x, s: x.scatter(1, _SCATTER_IDX, s), r(3, 5), r(2, 4))
row("scatter_src_const_index_repeated", lambda x, s: x.scatter(1, _SCATTER_IDX_REPEATED, s), r(3, 5), r(2, 3))
row("scatter_value_const_index_repeated", lambda x: x.scatter(0, _SCATTER_IDX_REPEATED, -2.5), r(3, 5))


# --------------------------------------------------------------------------------------
# symbolic sizes: each row exported with the named dims dynamic and run at the sample's sizes and at
# every entry of ``sizes`` (the range's ends among them). The shapes an op computes from a dynamic dim
# (reshape targets, iota, masks, gather coordinates, slice bounds) are built in the graph.

BS = ({"b": 1, "s": 2}, {"b": 5, "s": 13})  # with the samples' (2, 6) below
S_ = ({"s": 2}, {"s": 17})
HW = ({"h": 5, "w": 9}, {"h": 16, "w": 16})


def _sym(id, fn, *args, dyn, sizes=BS, **kw):
    row("sym_" + id, fn, *args, dyn=dyn, sizes=sizes, **kw)


BSD = {0: "b", 1: "s"}
_sym("add_bcast", lambda x, y: x + y * 2, r(2, 6, 8), r(8), dyn={0: BSD})
_sym("mul_same", torch.mul, r(2, 6, 8), r(2, 6, 8), dyn={0: BSD, 1: BSD})
_sym("gelu_tanh", lambda x: F.gelu(x, approximate="tanh"), r(2, 6, 8), dyn={0: BSD}, rtol=2e-5,
     why="tanh form on float32")
_sym("exp_log", lambda x: torch.log(torch.exp(x) + 1.0), r(2, 6, 8), dyn={0: BSD}, rtol=2e-6, why="exp/log ulps")
_sym("where_mask", lambda m, x: torch.where(m, x, -x), bools(2, 6, 8), r(2, 6, 8), dyn={0: BSD, 1: BSD})
_sym("masked_fill", lambda x, m: x.masked_fill(m[:, None, :] == 0, -1e4), r(2, 3, 6), ints(2, 6, lo=0, hi=2),
     dyn={0: {0: "b", 2: "s"}, 1: BSD})
_sym("mean_last", lambda x: x.mean(-1, keepdim=True), r(2, 6, 8), dyn={0: BSD})
_sym("sum_seq", lambda x: x.sum(1), r(2, 6, 8), dyn={0: BSD})
_sym("amax_seq", lambda x: x.amax(1), r(2, 6, 8), dyn={0: BSD})
_sym("softmax_seq", lambda x: torch.softmax(x, 1), r(2, 6, 8), dyn={0: BSD})
_sym("softmax_last", lambda x: torch.softmax(x, -1), r(2, 8, 6), dyn={0: {0: "b", 2: "s"}})
_sym("layer_norm", lambda x, w, b: F.layer_norm(x, (8,), w, b), r(2, 6, 8), r(8), r(8), weights=(1, 2),
     dyn={0: BSD}, rtol=2e-5, why="rsqrt of the variance")
_sym("linear", F.linear, r(2, 6, 8), r(16, 8), r(16), weights=(1, 2), dyn={0: BSD})
_sym("matmul_qk", lambda q, k: q @ k.transpose(-1, -2), r(2, 4, 6, 8), r(2, 4, 6, 8),
     dyn={0: BSD, 1: BSD})
_sym("bmm_dynamic_inner", torch.bmm, r(2, 3, 6), r(2, 6, 4), dyn={0: {0: "b", 2: "s"}, 1: BSD})
_sym("view_merge_heads", lambda x: x.transpose(1, 2).reshape(x.shape[0], x.shape[2], -1), r(2, 4, 6, 8),
     dyn={0: {0: "b", 2: "s"}})
_sym("view_split_heads", lambda x: x.view(x.shape[0], x.shape[1], 4, 2).transpose(1, 2), r(2, 6, 8),
     dyn={0: BSD})
_sym("flatten_all", lambda x: x.flatten() * 2, r(2, 6, 8), dyn={0: BSD})
_sym("unsqueeze_expand", lambda m: m[:, None, None, :].expand(-1, 1, m.shape[1], -1).float(), ints(2, 6, lo=0, hi=2),
     dyn={0: BSD})
_sym("cat_seq", lambda x, y: torch.cat([x, y], 1), r(2, 6, 8), r(2, 6, 8), dyn={0: BSD, 1: BSD})
_sym("cat_const_token", lambda x, t: torch.cat([t.expand(x.shape[0], -1, -1), x], 1), r(2, 6, 8), r(1, 1, 8),
     weights=(1,), dyn={0: BSD})
_sym("slice_to_size", lambda p, x: p[:, : x.shape[1]] + x, r(1, 32, 8), r(2, 6, 8), weights=(0,),
     dyn={1: BSD})
_sym("slice_from_one", lambda x: x[:, 1:] * 2, r(2, 6, 8), dyn={0: BSD}, sizes=({"b": 1, "s": 3}, {"b": 5, "s": 13}))
_sym("select_first", lambda x: x[:, 0], r(2, 6, 8), dyn={0: BSD})
_sym("select_last", lambda x: x[:, -1], r(2, 6, 8), dyn={0: BSD})
_sym("arange_seq", lambda x: x + torch.arange(x.shape[1], dtype=torch.float32)[:, None], r(2, 6, 8),
     dyn={0: BSD})
_sym("arange_offset", lambda x: torch.arange(2, x.shape[1] + 2)[None, :] * x.shape[0], ints(2, 6), dyn={0: BSD},
     kind="int")
_sym("full_from_size", lambda x: torch.full((x.shape[0], x.shape[1]), 3.0) + x[..., 0], r(2, 6, 8), dyn={0: BSD})
_sym("ones_like", lambda x: torch.ones_like(x) + x, r(2, 6, 8), dyn={0: BSD})
_sym("empty_fill", lambda x: x + torch.empty(x.shape[0], x.shape[1], 8).fill_(1.5), r(2, 6, 8), dyn={0: BSD})
_sym("new_zeros", lambda x: x.new_zeros(x.shape[0], x.shape[1], 2) + x[..., :2], r(2, 6, 8), dyn={0: BSD})
_sym("embedding", lambda ids, w: F.embedding(ids, w), ints(2, 6, lo=0, hi=30), r(30, 8), weights=(1,),
     dyn={0: BSD})
_sym("gather_positions", lambda t, ids: torch.gather(t.expand(ids.shape[0], -1), 1, ids), ints(1, 32, lo=0, hi=3),
     ints(2, 6, lo=0, hi=32), weights=(0,), dyn={1: BSD}, kind="int")
_sym("index_select_seq", lambda x, i: x.index_select(1, i), r(2, 6, 8), ints(3, lo=0, hi=2), dyn={0: BSD})
_sym("cumsum_seq", lambda x: torch.cumsum(x, 1), r(2, 6, 8), dyn={0: BSD}, rtol=2e-6, why="summation order")
_sym("pad_seq", lambda x: F.pad(x, (0, 0, 1, 2)), r(2, 6, 8), dyn={0: BSD})
_sym("flip_seq", lambda x: x.flip(1), r(2, 6, 8), dyn={0: BSD})
_sym("sdpa", lambda q, k, v: F.scaled_dot_product_attention(q, k, v), r(2, 4, 6, 8), r(2, 4, 6, 8),
     r(2, 4, 6, 8), dyn={0: BSD, 1: BSD, 2: BSD}, rtol=2e-6, why="softmax")
_sym("sdpa_causal", lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), r(2, 4, 6, 8),
     r(2, 4, 6, 8), r(2, 4, 6, 8), dyn={0: {2: "s"}, 1: {2: "s"}, 2: {2: "s"}}, sizes=S_, rtol=2e-6, why="softmax")
_sym("sdpa_gqa_mask", lambda q, k, v, m: F.scaled_dot_product_attention(
    q, k, v, attn_mask=m[:, None, None, :] > 0, enable_gqa=True), r(2, 4, 6, 8), r(2, 2, 6, 8), r(2, 2, 6, 8),
    ints(2, 6, lo=1, hi=3), dyn={0: {0: "b", 2: "s"}, 1: {0: "b", 2: "s"}, 2: {0: "b", 2: "s"}, 3: BSD},
    rtol=2e-6, why="softmax")
_sym("conv2d_hw", F.conv2d, r(1, 3, 8, 10), r(4, 3, 3, 3), r(4), weights=(1, 2), padding=1,
     dyn={0: {2: "h", 3: "w"}}, sizes=HW)
_sym("conv2d_stride2_hw", F.conv2d, r(1, 3, 8, 10), r(4, 3, 3, 3), None, weights=(1,), stride=2, padding=1,
     dyn={0: {2: "h", 3: "w"}}, sizes=HW)
_sym("max_pool_hw", lambda x: F.max_pool2d(x, 3, 2, 1), r(1, 3, 8, 10), dyn={0: {2: "h", 3: "w"}}, sizes=HW)
_sym("avg_pool_global", lambda x: F.adaptive_avg_pool2d(x, 1), r(1, 3, 8, 10), dyn={0: {2: "h", 3: "w"}},
     sizes=HW, rtol=2e-6, why="mean of a variable count")
_sym("batch_norm_hw", lambda x, m, v, w, b: F.batch_norm(x, m, v, w, b), r(2, 3, 8, 10), r(3), pos(3), r(3), r(3),
     weights=(1, 2, 3, 4), dyn={0: {0: "b", 2: "h", 3: "w"}}, sizes=({"b": 1, "h": 5, "w": 9}, {"b": 3, "h": 16,
                                                                                               "w": 16}))
_sym("group_norm_hw", lambda x, w, b: F.group_norm(x, 2, w, b), r(2, 4, 8, 10), r(4), r(4), weights=(1, 2),
     dyn={0: {0: "b", 2: "h", 3: "w"}}, sizes=({"b": 1, "h": 5, "w": 9}, {"b": 3, "h": 16, "w": 16}), rtol=2e-5,
     why="rsqrt of the variance")
_sym("group_norm_length", lambda x, w, b: F.group_norm(x, 4, w, b), r(2, 4, 50), r(4), r(4), weights=(1, 2),
     dyn={0: {0: "b", 2: "s"}}, sizes=({"b": 1, "s": 2}, {"b": 3, "s": 400}), rtol=2e-5, why="rsqrt of the variance")
_sym("interp_bilinear_x2", lambda x: F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=False),
     r(1, 3, 8, 10), dyn={0: {2: "h", 3: "w"}}, sizes=HW)
_sym("interp_to_input_size", lambda x, y: F.interpolate(y, size=x.shape[-2:], mode="bilinear",
                                                        align_corners=False) + x,
     r(1, 3, 8, 10), r(1, 3, 4, 5), dyn={0: {2: "h", 3: "w"}, 1: {2: "h2", 3: "w2"}},
     sizes=({"h": 5, "w": 9, "h2": 3, "w2": 5}, {"h": 16, "w": 16, "h2": 8, "w2": 8}))

# --------------------------------------------------------------------------------------
# recurrent layers (aten.lstm / rnn_tanh / rnn_relu, kept whole), called as nn.LSTM / nn.RNN call them: the
# weights in torch's params order (w_ih, w_hh[, b_ih, b_hh][, w_hr] per layer and direction, weights as module
# parameters), uniform in +-1/sqrt(hidden) as nn.LSTM initializes them; without h0 the zeros nn.LSTM makes
# --------------------------------------------------------------------------------------


def _rnn_row(id, op, inp=6, hidden=8, layers=1, bidirectional=False, proj=0, batch_first=False, bias=True, h0=True,
             seq=7, batch=2):
    dirs, h_out = 2 if bidirectional else 1, proj or hidden
    gates = 4 * hidden if op == "lstm" else hidden
    k = hidden ** -0.5
    params = []
    for layer in range(layers):
        for _ in range(dirs):
            params += [u(gates, inp if layer == 0 else dirs * h_out, lo=-k, hi=k), u(gates, h_out, lo=-k, hi=k)]
            params += [u(gates, lo=-k, hi=k), u(gates, lo=-k, hi=k)] if bias else []
            params += [u(h_out, hidden, lo=-k, hi=k)] if proj else []
    x = r(batch, seq, inp) if batch_first else r(seq, batch, inp)
    shapes = [(layers * dirs, batch, h_out)] + ([(layers * dirs, batch, hidden)] if op == "lstm" else [])
    states = [r(*sh) for sh in shapes] if h0 else []
    flags = (bias, layers, 0.0, False, bidirectional, batch_first)

    def fn(x, *rest):
        hx = list(rest[:len(states)]) or [x.new_zeros(sh) for sh in shapes]
        ps = list(rest[len(states):])
        if op == "lstm":
            return tuple(torch.lstm(x, hx, ps, *flags))
        return tuple(getattr(torch, op)(x, hx[0], ps, *flags))

    first = 1 + len(states)
    row(id, fn, x, *states, *params, weights=range(first, first + len(params)))


_rnn_row("lstm", "lstm")
_rnn_row("lstm_no_h0", "lstm", h0=False)
_rnn_row("lstm_2layer_batch_first", "lstm", layers=2, batch_first=True)
_rnn_row("lstm_bidirectional", "lstm", bidirectional=True, h0=False)
_rnn_row("lstm_2layer_bidirectional_batch_first", "lstm", layers=2, bidirectional=True, batch_first=True)
_rnn_row("lstm_proj", "lstm", proj=3)
_rnn_row("lstm_2layer_bidirectional_proj_no_h0", "lstm", layers=2, bidirectional=True, proj=5, h0=False)
_rnn_row("lstm_no_bias", "lstm", bias=False, layers=2)
_rnn_row("lstm_batch1_seq1", "lstm", seq=1, batch=1)
_rnn_row("rnn_tanh", "rnn_tanh")
_rnn_row("rnn_tanh_2layer_bidirectional_batch_first_no_h0", "rnn_tanh", layers=2, bidirectional=True,
         batch_first=True, h0=False)
_rnn_row("rnn_relu", "rnn_relu", h0=False)
_rnn_row("rnn_relu_2layer_no_bias", "rnn_relu", layers=2, bias=False)
_rnn_row("rnn_relu_bidirectional_batch_first", "rnn_relu", bidirectional=True, batch_first=True)

# --------------------------------------------------------------------------------------
# index tensors on several dims, adaptive and oversized pooling windows (patterns timm / transformers models use)
# --------------------------------------------------------------------------------------

# adjacent index tensors forming an outer product (bicubic resizing decomposes to 16 of these), pairs of index
# tensors after a leading dim, and index tensors split by a full slice (the broadcast dims go first)
row("index_grid_hw", lambda x, i, j: x[:, :, i[:, None], j], r(2, 3, 6, 5), torch.tensor([3, 0, 5, 5]),
    torch.tensor([1, 4, 2]))
_GRID_ROWS, _GRID_COLS = torch.tensor([5, 0, 2, 2]), torch.tensor([4, -1, 0])  # constants, as a model holds them
row("index_grid_const", lambda x: x[:, _GRID_ROWS[:, None], _GRID_COLS], r(2, 6, 5, 3))
row("index_pairs_mid", lambda x, i, j: x[:, i, j], r(2, 6, 5, 4), torch.tensor([3, 0, 5, 5]),
    torch.tensor([0, 4, 1, 2]))
# a classifier's last-token pooling, logits[arange(batch), last] at batch 1: two [1] indices broadcast to one dim
row("index_last_token_batch1", lambda x, i: x[torch.arange(1), i], r(1, 16, 2), torch.tensor([11]))
row("index_pairs_length1", lambda x, i, j: x[:, i, j], r(2, 6, 5, 3), torch.tensor([4]), torch.tensor([2]))
row("index_split_by_slice", lambda x, i, j: x[i, :, j], r(6, 3, 5, 4), torch.tensor([[3, 0], [5, 5]]),
    torch.tensor([0, 4]))
row("interp_bicubic_down", F.interpolate, r(2, 3, 8, 6), size=(7, 5), mode="bicubic", align_corners=False)
row("interp_bicubic_x2_ac", F.interpolate, r(1, 3, 5, 4), scale_factor=2, mode="bicubic", align_corners=True)
row("adaptive_avg_pool2d_uneven", F.adaptive_avg_pool2d, r(2, 3, 10, 9), (7, 4))
row("adaptive_avg_pool2d_up", F.adaptive_avg_pool2d, r(1, 2, 4, 2), (5, 3))
# a window longer than the input, as EfficientNet's final AvgPool2d(hidden_dim, ceil_mode=True) has
row("avg_pool2d_window_past_input", F.avg_pool2d, r(1, 8, 5, 7), 64, ceil_mode=True)
row("avg_pool2d_window_past_padded_input", F.avg_pool2d, r(1, 8, 5, 7), 9, stride=3, padding=(1, 2),
    ceil_mode=True, count_include_pad=False)
row("max_pool2d_window_past_input", F.max_pool2d, distinct(1, 8, 5, 7), 64, ceil_mode=True)
# an empty piece concatenated (timm's RoPE attention with no prefix tokens: cat([x[:, :, :0], rotated], 2))
row("cat_empty_slice", lambda x: torch.cat([x[:, :, :0], x * 2], 2), r(1, 2, 5, 4))
# negative pads crop (NASNet's ZeroPad2d((-1, 1, -1, 1)) before a stride-2 pool)
row("pad_negative_crop", F.pad, r(2, 3, 6, 5), [-1, 1, -1, 1])
row("pad_negative_both_value", F.pad, r(2, 3, 6, 5), [-2, -1, 1, 2], value=0.5)
# gather with a constant index (SEW-D's relative-position attention gathers at a position table it computes)
row("gather_const_index", lambda x: torch.gather(x, 1, _SCATTER_IDX), r(2, 6))

# --------------------------------------------------------------------------------------
# Fourier transforms and a boolean-mask write, which the converter's passes rewrite before either backend sees
# them (converter/passes/lower_complex.py: real cos / sin matmuls; masked_index_put.py: a where)
# --------------------------------------------------------------------------------------

# FNet's token mixing: the real part of a 2-D FFT over the sequence and hidden dims
row("fftn_real", lambda x: torch.fft.fftn(x, dim=(1, 2)).real, r(2, 6, 8))
row("fft_real_imag", lambda x: (lambda f: (f.real, f.imag))(torch.fft.fft(x, dim=-1)), r(2, 3, 7))
row("rfft_ortho", lambda x: torch.view_as_real(torch.fft.rfft(x, dim=1, norm="ortho")), r(2, 9, 3))
row("ifft_complex", lambda x: torch.view_as_real(torch.fft.ifft(torch.view_as_complex(x), dim=0)), r(6, 4, 2))
row("irfft", lambda x: torch.fft.irfft(torch.view_as_complex(x), n=9, dim=-1), r(3, 5, 2))
# a special token's embedding overwritten by one learned row (T5Gemma 2): emb[ids == eoi_id] = eoi_embedding
row("index_put_bool_mask_row", lambda x, m, v: x.index_put((m,), v), r(2, 5, 4), bools(2, 5), r(4))
row("index_put_bool_mask_lead_acc", lambda x, m, v: aten.index_put(x, [None, m], v, True), r(2, 3, 4), bools(3, 4),
    r(2, 1))
# integer division rounding toward zero (JetMoE's token index of each sorted expert slot: position // top_k)
row("div_trunc_int", lambda a, b: torch.div(a, b, rounding_mode="trunc"), ints(3, 5), torch.tensor([3, -2, 5, -7, 4]),
    kind="int")
row("div_trunc_int_scalar", lambda a: torch.div(a, -3, rounding_mode="trunc"), ints(2, 6), kind="int")


def dynamic_shapes(rw: OpRow) -> tuple:
    """torch.export dynamic_shapes for ``row_inputs(rw, weights_as_params=True)``: one Dim per size name,
    ranging over the sample's size and every entry of ``rw.sizes``."""
    seen: dict = {}
    for i, dims in rw.dyn.items():
        for d, nm in dims.items():
            seen.setdefault(nm, []).append(rw.args[i].shape[d])
    for sz in rw.sizes:
        for nm, n in sz.items():
            seen.setdefault(nm, []).append(n)
    dims = {nm: torch.export.Dim(nm, min=min(v), max=max(v)) for nm, v in seen.items()}
    out = []
    for where, key in _tensor_slots(rw):
        if where == "a" and key in rw.weights:
            continue
        out.append({d: dims[nm] for d, nm in rw.dyn.get(key, {}).items()} if where == "a" else None)
    return tuple(out)


def args_at(rw: OpRow, sizes: dict, seed: int = 0) -> tuple:
    """rw.args with the dynamic dims at ``sizes``: fresh seeded values drawn like the sample's (floats uniform
    over its range, ints over its range, bools half set)."""
    g = torch.Generator().manual_seed(seed)
    out = list(rw.args)
    for i, dims in rw.dyn.items():
        a = rw.args[i]
        shape = [sizes.get(dims.get(d), n) for d, n in enumerate(a.shape)]
        if a.dtype == torch.bool:
            out[i] = torch.rand(shape, generator=g) < 0.5
        elif a.dtype.is_floating_point:
            lo, hi = float(a.min()), float(a.max())
            out[i] = (lo + (hi - lo) * torch.rand(shape, generator=g)).to(a.dtype)
        else:
            out[i] = torch.randint(int(a.min()), int(a.max()) + 1, shape, generator=g, dtype=a.dtype)
    return tuple(out)


# --------------------------------------------------------------------------------------


def rows_by_id() -> dict[str, OpRow]:
    return {rw.id: rw for rw in ROWS}


def _check_table():
    ids = [rw.id for rw in ROWS]
    dup = {i for i in ids if ids.count(i) > 1}
    assert not dup, f"duplicate op row ids: {sorted(dup)}"
    for rw in ROWS:
        assert rw.kind in ("float", "int", "bool"), rw.id
        if rw.rtol > 1e-5 or rw.atol > 0:
            assert rw.why, f"{rw.id}: tolerance looser than 1e-5 needs a why"
        for i in rw.weights:
            assert isinstance(rw.args[i], torch.Tensor), (rw.id, i)


_check_table()
