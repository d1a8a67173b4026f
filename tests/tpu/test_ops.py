"""Every row of tests.op_rows through the TPU lowering table, run with jax.jit on CPU and
compared with torch eager.

Error measure: max|got - want| / max(max|want|, 1e-6) <= row.rtol + row.atol for float
outputs (fp32 rows default to 1e-5); int and bool outputs must match exactly. Rows that take
model parameters also run with those parameters as module buffers (Program weights).
"""

from __future__ import annotations

import functools
import warnings

import jax
import numpy as np
import pytest
import torch
import torch.nn.functional as F
import torch.utils._pytree as pytree
from jax import export as jax_export

from tests.numerics import rel_err
from tests.op_rows import ROWS, OpModule, OpRow, row_inputs, rows_by_id
from tpu_export import converter
from tpu_export.tpu_backend.lowering import JAX_LOWERINGS, lower_signature, unsupported

# Rows for lowerings the shared table does not reach (argument corners, index scatters, resize
# modes). Same format and error measure as tests.op_rows.
_G = torch.Generator().manual_seed(7)


def _r(*shape):
    return torch.randn(shape, generator=_G)


def _distinct(*shape):
    n = int(np.prod(shape))
    return (torch.randperm(n, generator=_G).float() / n - 0.5).reshape(shape)


def _idx(*shape, hi):
    return torch.randint(0, hi, shape, generator=_G)


def _ints(lo, hi, dtype, shape=(2, 3, 4)):
    return torch.randint(lo, hi, shape, generator=_G, dtype=dtype)


def _local(id, fn, *args, kind="float", rtol=1e-5, why="", **kwargs):
    return OpRow(id, fn, tuple(args), kwargs, rtol, 0.0, why, kind)


def _setitem(x, v):
    x = x.clone()
    x[:, 1:3] = v
    return x


_full_mask = torch.ones(8, 8, dtype=torch.bool)
_full_mask[3] = False  # one query row sees no key: torch's safe softmax gives zeros there
LOCAL_ROWS = [
    _local("tpu_max_pool2d_indices", lambda x: F.max_pool2d(x, 3, 2, 1, return_indices=True), _distinct(2, 3, 9, 9)),
    _local("tpu_max_pool2d_dilation_ceil", lambda x: F.max_pool2d(x, 2, 2, 0, 2, ceil_mode=True),
           _distinct(1, 2, 9, 10)),
    _local("tpu_max_pool3d", lambda x: F.max_pool3d(x, 2), _distinct(1, 2, 4, 4, 6)),
    _local("tpu_avg_pool2d_ceil_pad_incl", lambda x: F.avg_pool2d(x, 3, 2, 1, ceil_mode=True), _r(1, 2, 8, 8)),
    _local("tpu_avg_pool2d_ceil_pad_excl",
           lambda x: F.avg_pool2d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False), _r(1, 2, 8, 8)),
    _local("tpu_avg_pool2d_divisor", lambda x: F.avg_pool2d(x, 2, divisor_override=3), _r(1, 2, 6, 6)),
    _local("tpu_avg_pool3d", lambda x: F.avg_pool3d(x, 2, padding=1), _r(1, 2, 4, 4, 4)),
    _local("tpu_adaptive_avg_pool2d_uneven", lambda x: F.adaptive_avg_pool2d(x, (3, 5)), _r(2, 3, 7, 9)),
    _local("tpu_adaptive_max_pool2d", lambda x: F.adaptive_max_pool2d(x, (3, 2), return_indices=True),
           _distinct(1, 2, 7, 5)),
    _local("tpu_interp_bicubic", lambda x: F.interpolate(x, size=(9, 7), mode="bicubic", align_corners=False),
           _r(1, 2, 5, 4)),
    _local("tpu_interp_bicubic_ac", lambda x: F.interpolate(x, scale_factor=2, mode="bicubic", align_corners=True),
           _r(1, 2, 5, 4)),
    _local("tpu_interp_nearest_exact", lambda x: F.interpolate(x, size=(7, 3), mode="nearest-exact"), _r(1, 2, 5, 4)),
    _local("tpu_interp_bilinear_x1p5", lambda x: F.interpolate(x, scale_factor=1.5, mode="bilinear"), _r(1, 2, 5, 4)),
    _local("tpu_interp_nearest_x1p5", lambda x: F.interpolate(x, scale_factor=1.5, mode="nearest"), _r(1, 2, 5, 4)),
    _local("tpu_interp_linear1d", lambda x: F.interpolate(x, size=11, mode="linear"), _r(2, 3, 6)),
    _local("tpu_interp_trilinear", lambda x: F.interpolate(x, size=(3, 5, 4), mode="trilinear"),
           _r(1, 2, 2, 3, 3)),
    _local("tpu_conv3d", lambda x, w: F.conv3d(x, w, stride=(1, 2, 1), padding=1), _r(1, 2, 4, 6, 5),
           _r(3, 2, 3, 3, 3)),
    _local("tpu_conv_transpose2d_dil_outpad",
           lambda x, w: F.conv_transpose2d(x, w, stride=3, padding=2, output_padding=1, dilation=2),
           _r(1, 2, 4, 5), _r(2, 3, 3, 3)),
    _local("tpu_conv_transpose2d_pad_gt_k", lambda x, w: F.conv_transpose2d(x, w, stride=2, padding=3),
           _r(1, 2, 6, 6), _r(2, 2, 3, 3)),
    _local("tpu_conv2d_unbatched", lambda x, w: F.conv2d(x, w, padding=1), _r(3, 6, 6), _r(4, 3, 3, 3)),
    _local("tpu_sdpa_fully_masked_row", lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=_full_mask),
           _r(1, 2, 8, 4), _r(1, 2, 8, 4), _r(1, 2, 8, 4)),
    _local("tpu_sdpa_causal_cross", lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
           _r(1, 2, 4, 8), _r(1, 2, 6, 8), _r(1, 2, 6, 8)),
    _local("tpu_sdpa_mask_and_scale", lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, m, scale=0.3),
           _r(2, 2, 5, 8), _r(2, 2, 5, 8), _r(2, 2, 5, 8), _r(2, 1, 5, 5)),
    _local("tpu_rms_norm", lambda x, w: F.rms_norm(x, (8,), w, eps=1e-6), _r(2, 3, 8), _r(8)),
    _local("tpu_rms_norm_default_eps", lambda x: F.rms_norm(x, (3, 8)), _r(2, 3, 8)),
    _local("tpu_index_put", lambda x, i, v: x.index_put((i,), v), _r(6, 4), torch.tensor([4, 0, -1]), _r(3, 4)),
    _local("tpu_index_put_acc", lambda x, i, v: x.index_put((i,), v, accumulate=True), _r(6, 4),
           torch.tensor([1, 1, 3]), _r(3, 4)),
    _local("tpu_index_2d_nonadjacent", lambda x, i, j: x[i, :, j], _r(5, 3, 6), _idx(2, 4, hi=5), _idx(2, 4, hi=6)),
    _local("tpu_setitem_slice", lambda x, v: _setitem(x, v), _r(4, 5), _r(4, 2)),
    _local("tpu_gather_small_index", lambda x, i: torch.gather(x, 1, i), _r(4, 6), _idx(2, 3, hi=6)),
    _local("tpu_scatter_src", lambda x, i, s: x.scatter(1, i, s), _r(3, 5),
           torch.stack([torch.randperm(5, generator=_G)[:2] for _ in range(3)]), _r(3, 4)),
    _local("tpu_scatter_value", lambda x, i: x.scatter(0, i, 2.5), _r(3, 5), _idx(1, 5, hi=3)),
    _local("tpu_scatter_add", lambda x, i, s: x.scatter_add(0, i, s), _r(3, 5), _idx(4, 5, hi=3), _r(4, 5)),
    _local("tpu_scatter_reduce_amax", lambda x, i, s: x.scatter_reduce(0, i, s, "amax", include_self=False),
           _r(3, 5), _idx(4, 5, hi=3), _r(4, 5)),
    _local("tpu_scatter_reduce_mean", lambda x, i, s: x.scatter_reduce(0, i, s, "mean"), _r(3, 5),
           _idx(4, 5, hi=3), _r(4, 5)),
    _local("tpu_slice_scatter", lambda x, s: torch.slice_scatter(x, s, 1, 1, 7, 2), _r(3, 8), _r(3, 3)),
    _local("tpu_select_scatter", lambda x, s: torch.select_scatter(x, s, 0, -1), _r(3, 8), _r(8)),
    _local("tpu_index_add", lambda x, i, s: x.index_add(1, i, s, alpha=2.0), _r(3, 5), torch.tensor([0, 4, 0]),
           _r(3, 3)),
    _local("tpu_cumprod", lambda x: torch.cumprod(x, 1), _r(2, 5) * 0.5 + 1),
    _local("tpu_logsumexp", lambda x: torch.logsumexp(x, dim=-1), _r(3, 7)),
    _local("tpu_any_all", lambda x: (x.any(dim=1), x.all(), x.any()), torch.rand(4, 5, generator=_G) > 0.3,
           kind="bool"),
    _local("tpu_argmax_flat", lambda x: torch.argmax(x), _distinct(3, 4), kind="int"),
    _local("tpu_max_min_dim", lambda x: (*torch.max(x, 1), *torch.min(x, 0, keepdim=True)), _distinct(3, 4)),
    _local("tpu_var_mean", lambda x: torch.var_mean(x, dim=1, correction=0), _r(3, 6)),
    _local("tpu_expm1_log1p_softplus", lambda x: (torch.expm1(x), torch.log1p(x.abs()), F.softplus(x * 10)), _r(3, 5)),
    _local("tpu_mish_elu_selu", lambda x: (F.mish(x), F.selu(x), F.celu(x, 0.5)), _r(3, 5) * 2),
    _local("tpu_prelu", lambda x, w: F.prelu(x, w), _r(2, 3, 4), torch.tensor([0.1, 0.2, 0.3])),
    _local("tpu_int_div_true", lambda a, b: a / b, _idx(3, 4, hi=9), _idx(3, 4, hi=5) + 1),
    _local("tpu_int_div_trunc", lambda a, b: torch.div(a, b, rounding_mode="trunc"), _idx(3, 4, hi=9) - 4,
           _idx(3, 4, hi=5) + 1, kind="int"),
    _local("tpu_bool_sum", lambda m: m.sum(-1), torch.rand(3, 5, generator=_G) > 0.5, kind="int"),
    _local("tpu_stack_cat_mixed_dtype", lambda a, b: torch.cat([a, b], 1), _r(2, 3), _idx(2, 2, hi=5)),
    _local("tpu_unfold", lambda x: x.unfold(1, 3, 2), _r(2, 9, 2)),
    _local("tpu_new_zeros_ones", lambda x: (x.new_zeros(2, 3), x.new_ones(3), torch.zeros(2), torch.ones(1, 2)),
           _r(2)),
    _local("tpu_arange_float", lambda x: x + torch.arange(0.5, 3.0, 0.5), _r(2, 5)),
    _local("tpu_linspace", lambda x: x * torch.linspace(-1, 1, 6), _r(6)),
    _local("tpu_sort_stable_desc", lambda x: torch.sort(x, dim=1, descending=True, stable=True),
           torch.randint(0, 4, (3, 7), generator=_G).float()),
    _local("tpu_trig",
           lambda x: (torch.tan(x), torch.atan(x), torch.asin(x * 0.9), torch.sinh(x), torch.atan2(x, x + 2)),
           _r(3, 4) * 0.5),
    _local("tpu_grid_sample_bilinear_zeros", lambda x, g: F.grid_sample(x, g, align_corners=False),
           _r(2, 3, 5, 6), torch.rand(2, 4, 7, 2, generator=_G) * 2.4 - 1.2),
    _local("tpu_grid_sample_bilinear_border_ac",
           lambda x, g: F.grid_sample(x, g, padding_mode="border", align_corners=True),
           _r(1, 2, 5, 6), torch.rand(1, 4, 3, 2, generator=_G) * 2.4 - 1.2),
    _local("tpu_grid_sample_nearest_reflection",
           lambda x, g: F.grid_sample(x, g, mode="nearest", padding_mode="reflection", align_corners=False),
           _r(1, 2, 5, 6), torch.rand(1, 4, 3, 2, generator=_G) * 2.4 - 1.2),
    _local("tpu_cdist", lambda a, b: (torch.cdist(a, b), torch.cdist(a, b, p=1.0)), _r(2, 5, 3), _r(2, 4, 3)),
    _local("tpu_diagonal", lambda x: (torch.diagonal(x, 1, -2, -1), x.diagonal()), _r(2, 4, 5)),
    _local("tpu_var_unbiased", lambda x: torch.var(x, 1, unbiased=False), _r(3, 6)),
    _local("tpu_masked_scatter", lambda x, m, s: x.masked_scatter(m, s), _r(3, 4),
           torch.rand(3, 4, generator=_G) > 0.5, _r(12)),
    _local("tpu_fill", lambda x: torch.fill(x, 3.0), _r(2, 3)),
    _local("tpu_isnan_family", lambda x: (torch.isnan(x), torch.isinf(x), torch.isfinite(x), torch.nan_to_num(x)),
           torch.tensor([1.0, float("nan"), float("inf"), -float("inf")]), kind="bool"),
    # int8/uint8 arithmetic and comparisons (these abort the LiteRT interpreter, so they are not
    # in the shared table; the other int8/uint8 rows are tests.op_rows dt_*). In range: no wrap.
    _local("tpu_dt_i8_add", torch.add, _ints(-20, 20, torch.int8), _ints(-20, 20, torch.int8), kind="int"),
    _local("tpu_dt_i8_sub", torch.sub, _ints(-20, 20, torch.int8), _ints(-20, 20, torch.int8), kind="int"),
    _local("tpu_dt_i8_eq", torch.eq, _ints(-2, 2, torch.int8), _ints(-2, 2, torch.int8), kind="bool"),
    _local("tpu_dt_i8_lt", torch.lt, _ints(-20, 20, torch.int8), _ints(-20, 20, torch.int8), kind="bool"),
    _local("tpu_dt_u8_add", torch.add, _ints(0, 100, torch.uint8), _ints(0, 100, torch.uint8), kind="int"),
    _local("tpu_dt_u8_sub", torch.sub, _ints(100, 200, torch.uint8), _ints(0, 100, torch.uint8), kind="int"),
    _local("tpu_dt_u8_eq", torch.eq, _ints(0, 3, torch.uint8), _ints(0, 3, torch.uint8), kind="bool"),
    _local("tpu_dt_u8_lt", torch.lt, _ints(0, 250, torch.uint8), _ints(0, 250, torch.uint8), kind="bool"),
    # float16 inputs (TPU only: the shared table has no per-backend rows). torch computes in fp16 on
    # CPU too; fp16 eps is 2**-10, so one or two roundings stay under 2e-3 of the largest value.
    _local("tpu_dt_f16_add", torch.add, _r(2, 3, 4).half(), _r(2, 3, 4).half(), rtol=2e-3, why="fp16 rounding"),
    _local("tpu_dt_f16_mul", torch.mul, _r(2, 3, 4).half(), _r(2, 3, 4).half(), rtol=2e-3, why="fp16 rounding"),
    _local("tpu_dt_f16_relu_max", lambda a, b: torch.maximum(torch.relu(a), b), _r(2, 3, 4).half(),
           _r(2, 3, 4).half()),
    _local("tpu_dt_f16_to_f32", lambda x: x.float() * 2, _r(2, 3, 4).half()),
]



# Rows the table cannot lower yet: id -> reason. strict: a row that starts passing fails here.
XFAIL: dict[str, str] = {}

# dtype="bfloat16" rows: floats computed in bf16 (8-bit mantissa, eps 2**-8 = 0.0039), compared
# with torch fp32. Elementwise ops round once or twice (<= 1e-2 relative to the largest value);
# contractions, norms and pooling sum many rounded products (<= 3e-2).
BF16_ROWS: dict[str, float] = {
    "add": 1e-2,
    "mul_bcast_channel": 1e-2,
    "gelu": 1e-2,
    "silu": 1e-2,
    "hardswish": 1e-2,
    "softmax_last": 1e-2,
    "matmul_3d": 3e-2,
    "linear_3d_bias": 3e-2,
    "conv2d_stride2_pad1": 3e-2,
    "conv2d_depthwise": 3e-2,
    "conv_transpose2d_s2_k4_p1": 3e-2,
    "layer_norm_affine": 3e-2,
    "group_norm_g2": 3e-2,
    "batch_norm_eval": 3e-2,
    "avg_pool2d_k3_s2_p1_excl": 3e-2,
    "interp_bilinear_x2": 3e-2,
    "sdpa_causal": 3e-2,
    "sdpa_gqa": 3e-2,
    "mean_hw_keepdim": 1e-2,
    "embedding_i64": 1e-2,
}


_ALL_ROWS = {**rows_by_id(), **{r.id: r for r in LOCAL_ROWS}}


@functools.lru_cache(maxsize=None)
def _prepared(row_id: str, weights_as_params: bool):
    # torch.export dominates a row's cost; the bf16 tests reuse the fp32 tests' programs.
    row = _ALL_ROWS[row_id]
    module = OpModule(row, weights_as_params=weights_as_params).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the 64->32 bit policy warns on int64 inputs
        return converter.prepare(module, row_inputs(row, weights_as_params=weights_as_params))


def _run_row(row, *, weights_as_params=False, dtype=None, export_tpu=False):
    inputs = row_inputs(row, weights_as_params=weights_as_params)
    prog = _prepared(row.id, weights_as_params)
    lowered = lower_signature(prog, dtype=dtype)
    if export_tpu:  # the same function also lowers to StableHLO for TPU (no TPU needed)
        w_avals, in_avals = lowered.abstract_args()
        exported = jax_export.export(jax.jit(lowered.fn), platforms=["tpu", "cpu"])(w_avals, *in_avals)
        assert exported.platforms == ("tpu", "cpu")
    flat = [np.asarray(x.numpy()).astype(dt) for x, dt in zip(lowered.signature.flatten_inputs(inputs),
                                                               lowered.input_dtypes)]
    got = jax.jit(lowered.fn)(lowered.weight_arrays(prog), *flat)
    with torch.no_grad():
        want = pytree.tree_leaves(row.fn(*row.args, **row.kwargs))
    assert len(got) == len(want), (len(got), len(want))
    for g, w, dt in zip(got, want, lowered.output_dtypes):
        assert g.dtype == dt, f"output dtype {g.dtype}, signature says {dt}"
        assert tuple(g.shape) == tuple(w.shape), (g.shape, w.shape)
    return got, want


def _compare(row, got, want, tol):
    for g, w in zip(got, want):
        if w.is_floating_point():
            err = rel_err(np.asarray(g, np.float64), w.double().numpy())
            assert err <= tol, f"{row.id}: rel err {err:.3g} > {tol:.3g}"
        else:
            np.testing.assert_array_equal(np.asarray(g).astype(np.int64), w.numpy().astype(np.int64),
                                          err_msg=row.id)


def _params(rows):
    out = []
    for r in rows:
        marks = [pytest.mark.xfail(reason=XFAIL[r.id], strict=True)] if r.id in XFAIL else []
        out.append(pytest.param(r, id=r.id, marks=marks))
    return out


@pytest.mark.parametrize("row", _params(ROWS + LOCAL_ROWS))
def test_op_row(row):
    got, want = _run_row(row, export_tpu=True)
    _compare(row, got, want, row.rtol + row.atol)


@pytest.mark.parametrize("row", _params([r for r in ROWS if r.weights]))
def test_op_row_weights_as_params(row):
    got, want = _run_row(row, weights_as_params=True)
    _compare(row, got, want, row.rtol + row.atol)


@pytest.mark.parametrize("row_id", sorted(BF16_ROWS))
def test_op_row_bfloat16(row_id):
    row = _ALL_ROWS[row_id]
    got, want = _run_row(row, weights_as_params=bool(row.weights), dtype="bfloat16")
    for g in got:
        assert g.dtype == jax.numpy.bfloat16 or not np.issubdtype(np.asarray(g).dtype, np.floating)
    _compare(row, [np.asarray(g, np.float32) for g in got], want, BF16_ROWS[row_id])


def test_xfail_ids_exist():
    ids = _ALL_ROWS
    assert len(ids) == len(ROWS) + len(LOCAL_ROWS), "a local row id repeats a shared one"
    assert set(XFAIL) <= set(ids), sorted(set(XFAIL) - set(ids))
    assert set(BF16_ROWS) <= set(ids), sorted(set(BF16_ROWS) - set(ids))


def test_unsupported_op_is_reported_before_lowering():
    class Zeta(torch.nn.Module):
        def forward(self, x):
            return torch.special.zeta(x, x) + 1  # zeta has no TPU lowering

    prog = converter.prepare(Zeta().eval(), (torch.rand(3) + 2,))
    missing = unsupported(prog)
    assert [k for k in missing if "zeta" in k] and not [k for k in missing if "add" in k], missing
    with pytest.raises(converter.UnsupportedOpsError, match="zeta"):
        lower_signature(prog)


def test_registry_refuses_duplicates():
    from tpu_export.converter.registry import DuplicateLoweringError
    from tpu_export.tpu_backend.lowering.registry import lowering

    with pytest.raises(DuplicateLoweringError):
        lowering(torch.ops.aten.add.Tensor)(lambda ctx, x, y, alpha=1: x)
    assert len(JAX_LOWERINGS) > 200


# Shape-polymorphic lowering: dim 0 dynamic in torch.export, symbolic in jax.export, run at
# two batch sizes. These exercise sym_size, SymInt arithmetic and shapes read from the node.
class _Dyn(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


DYNAMIC_CASES = {
    "flatten": lambda x: x.view(x.shape[0], -1),
    "reshape_infer_batch": lambda x: x.reshape(-1, 4),
    "arange_over_batch": lambda x: x + torch.arange(x.shape[0])[:, None, None],
    "full_batch": lambda x: torch.full((x.shape[0], 3), 2.0) + x[:, 0, :3],
    "slice_tail_of_batch": lambda x: x[-2:] * 2,
    "slice_drop_first": lambda x: x[1:] * 2,
    "expand_batch": lambda x: x[:, :1].expand(x.shape[0], 3, 4) + x,
    "split_cat": lambda x: torch.cat(torch.split(x, [1, 2], dim=1)[::-1], dim=1),
    "interp_bilinear": lambda x: F.interpolate(x[:, None], scale_factor=2, mode="bilinear"),
    "sdpa": lambda x: F.scaled_dot_product_attention(x, x, x, is_causal=True),
    "new_zeros_like_batch": lambda x: x.new_zeros(x.shape) + x.sum(0),
    "softmax_batch_dim": lambda x: torch.softmax(x, dim=0),
}


@pytest.mark.parametrize("case", sorted(DYNAMIC_CASES))
def test_dynamic_batch(case):
    fn = DYNAMIC_CASES[case]
    sample = torch.randn(3, 3, 4, generator=torch.Generator().manual_seed(3))
    batch = torch.export.Dim("batch", min=3, max=64)
    prog = converter.prepare(_Dyn(fn).eval(), (sample,), dynamic_shapes=({0: batch},))
    lowered = lower_signature(prog)
    assert lowered.signature.inputs[0].shape[0] == "batch"
    w_avals, in_avals = lowered.abstract_args()
    exported = jax_export.export(jax.jit(lowered.fn), platforms=["cpu"])(w_avals, *in_avals)
    weights = lowered.weight_arrays(prog)
    for n in (3, 7):
        x = torch.randn(n, 3, 4, generator=torch.Generator().manual_seed(n))
        got = exported.call(weights, x.numpy())
        want = pytree.tree_leaves(fn(x))
        for g, w in zip(got, want):
            assert tuple(g.shape) == tuple(w.shape)
            err = rel_err(np.asarray(g, np.float64), w.double().numpy())
            assert err <= 1e-5, f"{case} at batch {n}: rel err {err:.3g}"


def test_kernel_hook_runs_only_with_use_pallas():
    from tpu_export.tpu_backend.lowering import KERNEL_HOOKS, kernel_hook

    aten = torch.ops.aten
    if aten.hypot.default not in KERNEL_HOOKS:  # registration is per process
        kernel_hook(aten.hypot.default)(lambda ctx, x, y: jax.numpy.full(x.shape, 42.0, x.dtype))
        kernel_hook(aten.copysign.Tensor)(lambda ctx, x, y: NotImplemented)  # declines: table runs

    class M(torch.nn.Module):
        def forward(self, x, y):
            return torch.hypot(x, y), torch.copysign(x, y)

    x, y = torch.randn(3, 4), torch.randn(3, 4)
    prog = converter.prepare(M().eval(), (x, y))
    plain = lower_signature(prog).fn([], x.numpy(), y.numpy())
    hooked = lower_signature(prog, use_pallas=True).fn([], x.numpy(), y.numpy())
    np.testing.assert_allclose(np.asarray(plain[0]), torch.hypot(x, y).numpy(), rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(hooked[0]), np.full((3, 4), 42.0, np.float32))
    np.testing.assert_array_equal(np.asarray(hooked[1]), torch.copysign(x, y).numpy())


def test_enable_x64_keeps_64_bit_values():
    class M(torch.nn.Module):
        def forward(self, ids, x):
            return ids * 3_000_000_000 + torch.arange(ids.shape[-1]), x.double() * 3

    ids, x = torch.tensor([[1, 2, 3]]), torch.randn(1, 3)
    prog = converter.prepare(M().eval(), (ids, x), enable_x64=True)
    lowered = lower_signature(prog)
    assert lowered.x64 and [str(d) for d in lowered.output_dtypes] == ["int64", "float64"]
    with jax.enable_x64(True):  # scoped: callers trace x64 programs in 64-bit mode
        got = jax.jit(lowered.fn)(lowered.weight_arrays(prog), ids.numpy(), x.numpy())
    want = M()(ids, x)
    np.testing.assert_array_equal(np.asarray(got[0]), want[0].numpy())
    np.testing.assert_allclose(np.asarray(got[1]), want[1].numpy(), rtol=1e-12)


def test_boolean_mask_index_is_reported_unsupported():
    class M(torch.nn.Module):
        def forward(self, x, m):
            return x[m]

    prog = converter.prepare(M().eval(), (torch.randn(4, 3), torch.tensor([True, False, True, True])))
    assert list(unsupported(prog)) == ["aten.index.Tensor"]
    with pytest.raises(converter.UnsupportedOpsError, match="index"):
        lower_signature(prog)


def test_multi_signature_program_shares_weights():
    torch.manual_seed(0)
    lin = torch.nn.Linear(4, 3).eval()

    class Scaled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = lin

        def forward(self, x):
            return self.lin(x) * 2

    x = torch.randn(2, 4)
    prog = converter.prepare_many([
        converter.SignatureRequest("plain", lin, (x,)),
        converter.SignatureRequest("scaled", Scaled().eval(), (x,)),
    ])
    for name, want in (("plain", lin(x)), ("scaled", lin(x) * 2)):
        lowered = lower_signature(prog, name)
        assert sorted(lowered.weight_names) == sorted(prog.weights)  # one stored copy, both read it
        (got,) = jax.jit(lowered.fn)(lowered.weight_arrays(prog), x.numpy())
        assert rel_err(np.asarray(got, np.float64), want.detach().double().numpy()) <= 1e-6
