"""The ONNX op rows: (op, attributes, inputs) built with onnx.helper, checked against onnxruntime on both
outputs (tests/onnx/test_onnx_ops.py). Rows are grouped into one model per (family, opset)."""

from __future__ import annotations

import numpy as np

from tests.onnx.harness import Init, OnnxRow

__all__ = ["ROWS", "groups"]

_G = np.random.RandomState(7)
F32, I64 = np.float32, np.int64


def r(*s, scale=1.0):
    return (_G.randn(*s) * scale).astype(F32)


def pos(*s):
    return _G.uniform(0.5, 2.0, s).astype(F32)


def distinct(*s):
    n = int(np.prod(s))
    return ((_G.permutation(n) - n / 2) / n).astype(F32).reshape(s)


def ints(*s, lo=-9, hi=10, dtype=I64):
    return _G.randint(lo, hi, s).astype(dtype)


def nz_ints(*s):
    v = ints(*s, lo=1, hi=7)
    return np.where(_G.rand(*s) < 0.5, -v, v)


def c(v, dtype=I64):
    return Init(np.asarray(v, dtype=dtype))


def _rows(family, opset=18, **common):
    def row(id, op, *inputs, n_out=1, rtol=1e-5, why="", only="", domain="", **attrs):
        return OnnxRow(id, op, list(inputs), attrs, n_out, family, opset, domain, rtol, why, only)

    return row


ROWS: list[OnnxRow] = []

# ------------------------------------------------------------------ elementwise
e = _rows("elementwise")
ROWS += [
    e("add_bcast", "Add", r(2, 3, 4), r(4)),
    e("sub", "Sub", r(2, 3), r(2, 3)),
    e("mul_init", "Mul", r(2, 3), Init(r(3))),
    e("div", "Div", r(2, 3), pos(2, 3)),
    e("div_int_trunc", "Div", ints(2, 5), nz_ints(2, 5)),
    e("pow_const2", "Pow", r(2, 3), c(2.0, F32)),
    e("pow_tensor", "Pow", pos(2, 3), r(2, 3)),
    e("mod_fmod", "Mod", r(2, 4, scale=5), pos(2, 4), fmod=1),
    e("mod_int", "Mod", ints(2, 6), nz_ints(2, 6)),
    e("max3", "Max", r(2, 3), r(2, 3), r(3)),
    e("min2", "Min", r(2, 3), r(1, 3)),
    e("sum3", "Sum", r(2, 3), r(2, 3), r(2, 3)),
    e("mean2", "Mean", r(2, 3), r(2, 3)),
    e("abs", "Abs", r(2, 3)),
    e("neg", "Neg", r(2, 3)),
    e("sqrt", "Sqrt", pos(2, 3)),
    e("reciprocal", "Reciprocal", pos(2, 3)),
    e("exp", "Exp", r(2, 3)),
    e("log", "Log", pos(2, 3)),
    e("floor", "Floor", r(2, 3, scale=3)),
    e("ceil", "Ceil", r(2, 3, scale=3)),
    e("sign", "Sign", r(2, 3)),
    e("erf", "Erf", r(2, 3)),
    e("sin", "Sin", r(2, 3)),
    e("cos", "Cos", r(2, 3)),
    e("tan", "Tan", r(2, 3)),
    e("asin", "Asin", r(2, 3, scale=0.3)),
    e("acos", "Acos", r(2, 3, scale=0.3)),
    e("atan", "Atan", r(2, 3)),
    e("sinh", "Sinh", r(2, 3)),
    e("cosh", "Cosh", r(2, 3)),
    e("asinh", "Asinh", r(2, 3)),
    e("acosh", "Acosh", pos(2, 3) + 1),
    e("atanh", "Atanh", r(2, 3, scale=0.3)),
    e("round_half_even", "Round", np.array([[0.5, 1.5, 2.5, -0.5, -1.5, 0.2]], F32)),
    e("identity", "Identity", r(2, 3)),
    e("cast_f2i", "Cast", r(2, 5, scale=4), to=6),
    e("cast_i2f", "Cast", ints(2, 5), to=1),
    e("castlike", "CastLike", ints(2, 5), Init(np.zeros(1, F32))),
]

# ------------------------------------------------------------------ activation
a = _rows("activation")
ROWS += [
    a("relu", "Relu", r(2, 3)),
    a("leaky_relu", "LeakyRelu", r(2, 3), alpha=0.1),
    a("sigmoid", "Sigmoid", r(2, 3)),
    a("tanh", "Tanh", r(2, 3)),
    a("hard_sigmoid", "HardSigmoid", r(2, 3, scale=3)),
    a("hard_sigmoid_torch", "HardSigmoid", r(2, 3, scale=3), alpha=1 / 6),
    a("hard_swish", "HardSwish", r(2, 3, scale=3)),
    a("elu", "Elu", r(2, 3), alpha=0.7),
    a("selu", "Selu", r(2, 3)),
    a("celu", "Celu", r(2, 3), alpha=1.3),
    a("softplus", "Softplus", r(2, 3)),
    a("softsign", "Softsign", r(2, 3)),
    a("prelu", "PRelu", r(1, 3, 2, 2), Init(r(3, 1, 1))),
    a("thresholded_relu", "ThresholdedRelu", r(2, 3), alpha=0.3),
    a("clip_relu6", "Clip", r(2, 3, scale=5), c(0.0, F32), c(6.0, F32)),
    a("clip_min_only", "Clip", r(2, 3), c(-0.2, F32)),
    a("clip_runtime_bounds", "Clip", r(2, 3), np.array(-0.3, F32), np.array(0.4, F32)),
    a("softmax_axis1", "Softmax", r(2, 3, 4), axis=1),
    a("log_softmax", "LogSoftmax", r(2, 5)),
    a("mish", "Mish", r(2, 3)),
    a("hardmax", "Hardmax", distinct(2, 5)),
]
g20 = _rows("activation", opset=20)
ROWS += [
    g20("gelu_erf", "Gelu", r(2, 3)),
    g20("gelu_tanh", "Gelu", r(2, 3), approximate="tanh"),
]

# ------------------------------------------------------------------ nn
n = _rows("nn")
ROWS += [
    n("matmul_3d_2d", "MatMul", r(2, 3, 4), Init(r(4, 5))),
    n("matmul_batched", "MatMul", r(2, 3, 4), r(2, 4, 2)),
    n("gemm", "Gemm", r(3, 4), r(4, 5), r(5)),
    n("gemm_trans_alpha_beta", "Gemm", r(4, 3), r(5, 4), r(3, 5), transA=1, transB=1, alpha=0.5, beta=2.0),
    n("gemm_linear", "Gemm", r(2, 4), Init(r(5, 4)), Init(r(5)), transB=1),
    n("gemm_no_c", "Gemm", r(2, 4), Init(r(4, 3))),
    n("einsum_bmm", "Einsum", r(2, 3, 4), r(2, 4, 5), equation="bij,bjk->bik"),
    n("einsum_outer_sum", "Einsum", r(3, 4), r(4), equation="ij,j->i"),
    n("dropout", "Dropout", r(2, 3)),
]

# ------------------------------------------------------------------ conv
v = _rows("conv")
x8 = r(1, 2, 7, 8)
ROWS += [
    v("conv_pad1", "Conv", x8, Init(r(4, 2, 3, 3)), Init(r(4)), pads=[1, 1, 1, 1]),
    v("conv_asym_pads", "Conv", x8, Init(r(3, 2, 3, 3)), pads=[0, 1, 2, 1]),
    v("conv_same_upper_s2", "Conv", x8, Init(r(3, 2, 3, 3)), auto_pad="SAME_UPPER", strides=[2, 2]),
    v("conv_same_lower_s2", "Conv", x8, Init(r(3, 2, 4, 4)), auto_pad="SAME_LOWER", strides=[2, 2]),
    v("conv_valid", "Conv", x8, Init(r(3, 2, 3, 2)), auto_pad="VALID"),
    v("conv_dilated", "Conv", x8, Init(r(3, 2, 3, 3)), dilations=[2, 2], pads=[2, 2, 2, 2]),
    v("conv_depthwise", "Conv", r(1, 4, 6, 6), Init(r(4, 1, 3, 3)), group=4, pads=[1, 1, 1, 1]),
    v("conv_grouped", "Conv", r(1, 4, 6, 6), Init(r(6, 2, 3, 3)), group=2),
    v("conv1d", "Conv", r(1, 2, 9), Init(r(3, 2, 3)), strides=[2]),
    v("conv3d", "Conv", r(1, 2, 4, 5, 5), Init(r(3, 2, 2, 3, 3)), pads=[0, 1, 1, 0, 1, 1], only="tpu",
      why="the edge backend lowers 1-D and 2-D convolutions only"),
    v("convt_s2", "ConvTranspose", r(1, 3, 4, 4), Init(r(3, 2, 3, 3)), Init(r(2)), strides=[2, 2]),
    v("convt_pads_outpad", "ConvTranspose", r(1, 3, 4, 4), Init(r(3, 2, 3, 3)), strides=[2, 2],
      pads=[1, 1, 1, 1], output_padding=[1, 1]),
    v("convt_asym_pads", "ConvTranspose", r(1, 3, 4, 4), Init(r(3, 2, 3, 3)), Init(r(2)), strides=[2, 2],
      pads=[0, 1, 1, 0]),
    v("convt_same_upper", "ConvTranspose", r(1, 3, 4, 5), Init(r(3, 2, 3, 3)), strides=[2, 2],
      auto_pad="SAME_UPPER"),
    v("convt_same_lower", "ConvTranspose", r(1, 3, 4, 5), Init(r(3, 2, 4, 4)), strides=[2, 2],
      auto_pad="SAME_LOWER"),
    v("convt_output_shape", "ConvTranspose", r(1, 3, 4, 4), Init(r(3, 2, 3, 3)), strides=[2, 2],
      output_shape=[9, 10]),
    v("convt_grouped", "ConvTranspose", r(1, 4, 3, 3), Init(r(4, 1, 3, 3)), group=2, strides=[1, 1]),
    v("convt_valid_dilated", "ConvTranspose", r(1, 2, 4, 4), Init(r(2, 2, 2, 2)), dilations=[2, 2],
      auto_pad="VALID", only="tpu", why="the edge backend has no dilated transposed convolution"),
]

# ------------------------------------------------------------------ norm
m = _rows("norm")
ROWS += [
    m("batchnorm", "BatchNormalization", r(2, 3, 4, 4), Init(pos(3)), Init(r(3)), Init(r(3)), Init(pos(3))),
    m("layernorm_last", "LayerNormalization", r(2, 3, 8), Init(pos(8)), Init(r(8))),
    m("layernorm_axis1", "LayerNormalization", r(2, 3, 4), Init(pos(3, 4)), axis=1, epsilon=1e-3),
    m("layernorm_stats", "LayerNormalization", r(2, 3, 8), Init(pos(8)), Init(r(8)), n_out=3),
    m("instancenorm", "InstanceNormalization", r(2, 3, 4, 4), Init(pos(3)), Init(r(3))),
    m("lpnorm_l2", "LpNormalization", r(2, 5), axis=1),
    m("lpnorm_l1", "LpNormalization", r(2, 5), p=1),
]
m21 = _rows("norm", opset=21)
ROWS += [
    m21("groupnorm_21", "GroupNormalization", r(2, 6, 3, 3), Init(pos(6)), Init(r(6)), num_groups=3),
]

# ------------------------------------------------------------------ pool
p = _rows("pool")
xp = distinct(1, 2, 7, 8)
ROWS += [
    p("maxpool_3s2p1", "MaxPool", xp, kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
    p("maxpool_same_upper", "MaxPool", xp, kernel_shape=[3, 3], strides=[2, 2], auto_pad="SAME_UPPER"),
    p("maxpool_same_lower", "MaxPool", xp, kernel_shape=[2, 2], strides=[2, 2], auto_pad="SAME_LOWER"),
    p("maxpool_ceil", "MaxPool", xp, kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1),
    p("maxpool_asym", "MaxPool", xp, kernel_shape=[3, 3], pads=[0, 1, 2, 0]),
    p("maxpool_dilated", "MaxPool", xp, kernel_shape=[2, 2], dilations=[2, 2], only="tpu",
      why="the edge backend has no dilated max pool"),
    p("maxpool1d", "MaxPool", distinct(1, 2, 9), kernel_shape=[3], strides=[2]),
    p("avgpool_incl_pad", "AveragePool", r(1, 2, 6, 6), kernel_shape=[3, 3], pads=[1, 1, 1, 1],
      count_include_pad=1),
    p("avgpool_excl_pad", "AveragePool", r(1, 2, 6, 6), kernel_shape=[3, 3], strides=[2, 2],
      pads=[1, 1, 1, 1]),
    p("avgpool_same_upper", "AveragePool", r(1, 2, 7, 7), kernel_shape=[3, 3], strides=[2, 2],
      auto_pad="SAME_UPPER"),
    p("avgpool_asym_excl", "AveragePool", r(1, 2, 6, 6), kernel_shape=[2, 2], pads=[0, 0, 1, 1]),
    p("avgpool_asym_incl", "AveragePool", r(1, 2, 6, 6), kernel_shape=[2, 2], pads=[1, 0, 0, 1],
      count_include_pad=1),
    p("global_avg", "GlobalAveragePool", r(2, 3, 4, 5)),
    p("global_max", "GlobalMaxPool", r(2, 3, 4, 5)),
]

# ------------------------------------------------------------------ reduce
d = _rows("reduce")
xr = distinct(2, 3, 4)
ROWS += [d(f"{op.lower()}_axes_input", op, pos(2, 3, 4) if "Log" in op else xr, c([1]), keepdims=k)
         for op, k in [("ReduceMean", 1), ("ReduceSum", 0), ("ReduceMax", 1), ("ReduceMin", 0), ("ReduceProd", 1),
                       ("ReduceL1", 0), ("ReduceL2", 1), ("ReduceSumSquare", 0), ("ReduceLogSum", 1),
                       ("ReduceLogSumExp", 0)]]
ROWS += [
    d("reducemean_all", "ReduceMean", xr),
    d("reducesum_noop", "ReduceSum", xr, c(np.zeros(0)), noop_with_empty_axes=1),
    d("reducemax_two_axes", "ReduceMax", xr, c([0, -1]), keepdims=0),
    d("argmax", "ArgMax", xr, axis=1),
    d("argmin_flat", "ArgMin", xr, axis=-1, keepdims=0),
    d("argmax_last", "ArgMax", np.array([[1, 3, 3, 0], [2, 2, 1, 2]], F32), axis=1, select_last_index=1),
    d("topk_largest", "TopK", xr, c([2]), n_out=2),
    d("topk_smallest_axis1", "TopK", xr, c([2]), axis=1, largest=0, n_out=2),
    d("cumsum", "CumSum", r(2, 5), c(1)),
    d("cumsum_excl_rev", "CumSum", r(2, 5), c(1), exclusive=1, reverse=1),
]
d17 = _rows("reduce", opset=17)
ROWS += [
    d17("reducemean_axes_attr", "ReduceMean", xr, axes=[2]),
    d17("reducemax_axes_attr", "ReduceMax", xr, axes=[0, 1], keepdims=0),
    d17("reducesum_13_input", "ReduceSum", xr, c([-1])),
]

# ------------------------------------------------------------------ shape
s = _rows("shape")
ROWS += [
    s("reshape_zero_minus1", "Reshape", r(2, 3, 4), c([0, -1])),
    s("reshape_allowzero", "Reshape", r(2, 3, 4), c([4, 3, 2]), allowzero=1),
    s("flatten_axis2", "Flatten", r(2, 3, 4, 2), axis=2),
    s("transpose", "Transpose", r(2, 3, 4), perm=[2, 0, 1]),
    s("transpose_default", "Transpose", r(2, 3, 4)),
    s("squeeze_axes", "Squeeze", r(2, 1, 3, 1), c([1])),
    s("squeeze_all", "Squeeze", r(2, 1, 3, 1)),
    s("unsqueeze", "Unsqueeze", r(2, 3), c([0, 3])),
    s("concat_axis1", "Concat", r(2, 3), r(2, 1), Init(r(2, 2)), axis=1),
    s("expand", "Expand", r(3, 1), c([2, 3, 4])),
    s("expand_bidirectional", "Expand", r(1, 4), c([3, 1])),
    s("tile", "Tile", r(2, 3), c([2, 1])),
    s("depth_to_space_dcr", "DepthToSpace", r(1, 8, 2, 3), blocksize=2),
    s("depth_to_space_crd", "DepthToSpace", r(1, 8, 2, 3), blocksize=2, mode="CRD"),
    s("space_to_depth", "SpaceToDepth", r(1, 2, 4, 6), blocksize=2),
    s("size", "Size", r(2, 3, 4)),
    s("shape_start_end", "Shape", r(2, 3, 4), start=1, end=-1),
]

# ------------------------------------------------------------------ slice
sl = _rows("slice")
big = np.iinfo(np.int64).max
ROWS += [
    sl("slice_basic", "Slice", r(4, 6), c([1, 0]), c([3, 5])),
    sl("slice_axes_steps", "Slice", r(4, 6), c([0, 1]), c([big, 6]), c([0, 1]), c([2, 2])),
    sl("slice_negative_step", "Slice", r(4, 6), c([-1]), c([-big]), c([1]), c([-2])),
    sl("slice_negative_starts", "Slice", r(4, 6), c([-3]), c([-1]), c([0])),
    sl("split_equal", "Split", r(4, 6), axis=1, num_outputs=3, n_out=3),
    sl("split_sizes", "Split", r(4, 6), c([1, 3]), n_out=2),
    sl("split_num_outputs_uneven", "Split", r(2, 7), axis=1, num_outputs=3, n_out=3),
    sl("pad_constant", "Pad", r(1, 2, 3, 3), c([0, 0, 1, 2, 0, 0, 2, 1]), c(1.5, F32)),
    sl("pad_negative", "Pad", r(2, 5), c([0, -1, 1, 2])),
    sl("pad_reflect", "Pad", r(1, 2, 4, 4), c([0, 0, 1, 2, 0, 0, 2, 1]), mode="reflect"),
    sl("pad_edge", "Pad", r(1, 2, 4, 4), c([0, 0, 1, 0, 0, 0, 2, 3]), mode="edge"),
    sl("pad_wrap", "Pad", r(1, 2, 4, 4), c([0, 0, 1, 2, 0, 0, 2, 1]), mode="wrap"),
    sl("pad_axes", "Pad", r(2, 3, 4), c([1, 2]), None, c([2]), mode="reflect"),
]

# ------------------------------------------------------------------ index
ix = _rows("index")
ROWS += [
    ix("gather_runtime_idx", "Gather", r(5, 3), np.array([[0, 4], [-1, 2]], I64)),
    ix("gather_axis1_const", "Gather", r(2, 5, 3), c([3, 0, -2]), axis=1),
    ix("gather_scalar", "Gather", r(2, 5, 3), c(2), axis=1),
    ix("gather_embedding", "Gather", Init(r(10, 4)), np.array([[1, 9, 0]], I64)),
    ix("gather_elements", "GatherElements", r(3, 4), np.array([[0, 3, -1, 2], [1, 1, 0, 0]], I64), axis=1),
    ix("gather_nd", "GatherND", r(3, 4, 2), np.array([[0, 1], [2, 3]], I64)),
    ix("scatter_nd", "ScatterND", r(4, 3), c([[1], [3]]), r(2, 3)),
    ix("scatter_nd_add", "ScatterND", r(4, 3), c([[1], [1]]), r(2, 3), reduction="add"),
    # distinct indices per row: ONNX leaves repeated ones undefined without a reduction
    ix("scatter_elements", "ScatterElements", r(3, 4), c([[1, 0, 3], [2, -1, 0]]), r(2, 3), axis=1),
    ix("scatter_elements_add", "ScatterElements", r(3, 4), c([[1, 0, 1], [2, 2, 0]]), r(2, 3), axis=0,
       reduction="add"),
    ix("trilu_upper_k1", "Trilu", r(2, 4, 5), c(1)),
    ix("trilu_lower", "Trilu", r(4, 5), upper=0),
    ix("onehot", "OneHot", np.array([0, 2, -1], I64), c(4), c([0.0, 1.0], F32)),
]

# ------------------------------------------------------------------ logical
lo = _rows("logical")
b1, b2 = _G.rand(2, 4) < 0.5, _G.rand(2, 4) < 0.5
ROWS += [
    lo("equal", "Equal", ints(2, 4, lo=0, hi=3), ints(2, 4, lo=0, hi=3)),
    lo("less", "Less", r(2, 4), r(2, 4)),
    lo("greater", "Greater", r(2, 4), r(4)),
    lo("less_or_equal", "LessOrEqual", ints(2, 4, lo=0, hi=3), ints(2, 4, lo=0, hi=3)),
    lo("greater_or_equal", "GreaterOrEqual", r(2, 4), r(2, 4)),
    lo("and", "And", b1, b2),
    lo("or", "Or", b1, b2),
    lo("xor", "Xor", b1, b2),
    lo("not", "Not", b1),
    lo("where", "Where", b1, r(2, 4), r(4)),
    lo("isinf", "IsInf", np.array([1.0, np.inf, -np.inf, 0.0], F32)),
    lo("isnan", "IsNaN", np.array([1.0, np.nan, 0.0], F32)),
]

# ------------------------------------------------------------------ creation (folded at build time)
cr = _rows("creation")
ROWS += [
    cr("constant_of_shape", "ConstantOfShape", c([2, 3])),
    cr("range", "Range", c(1), c(10), c(3)),
    cr("range_float", "Range", c(0.5, F32), c(2.0, F32), c(0.25, F32)),
    cr("eyelike", "EyeLike", r(3, 4), k=1),
]

# ------------------------------------------------------------------ resize
rs = _rows("resize")
_BICUBIC = "the edge backend has no bicubic resize (torch's bicubic exports as index ops it refuses)"
xi = r(1, 2, 4, 5)


def _resize(id, mode, coord, scales=None, sizes=None, **kw):
    sc = c(scales, F32) if scales is not None else None
    sz = c(sizes) if sizes is not None else None
    return rs(id, "Resize", xi, None, sc, sz, mode=mode, coordinate_transformation_mode=coord, **kw)


ROWS += [
    _resize("resize_nearest_asym_floor", "nearest", "asymmetric", [1, 1, 2, 2], nearest_mode="floor"),
    _resize("resize_nearest_half_pixel", "nearest", "half_pixel", sizes=[1, 2, 7, 9]),
    _resize("resize_nearest_exact", "nearest", "half_pixel", sizes=[1, 2, 7, 3], nearest_mode="round_prefer_ceil"),
    _resize("resize_nearest_align_ceil", "nearest", "align_corners", sizes=[1, 2, 6, 8], nearest_mode="ceil"),
    _resize("resize_nearest_pytorch_hp", "nearest", "pytorch_half_pixel", [1, 1, 1.5, 0.5]),
    _resize("resize_nearest_symmetric", "nearest", "half_pixel_symmetric", [1, 1, 1.7, 1.3]),
    _resize("resize_linear_half_pixel", "linear", "half_pixel", [1, 1, 2, 2]),
    _resize("resize_linear_x1p5", "linear", "half_pixel", [1, 1, 1.5, 1.5], only="tpu",
            why="5 x 1.5 is no whole size: the edge backend's RESIZE_BILINEAR maps coordinates by the sizes, "
                "not by the scale ONNX and torch use"),
    _resize("resize_linear_x1p5_whole", "linear", "half_pixel", [1, 1, 1.5, 2]),
    _resize("resize_linear_align", "linear", "align_corners", sizes=[1, 2, 7, 9]),
    _resize("resize_linear_pytorch_down", "linear", "pytorch_half_pixel", sizes=[1, 2, 1, 3]),
    _resize("resize_cubic_half_pixel", "cubic", "half_pixel", [1, 1, 2, 2], only="tpu", why=_BICUBIC),
    _resize("resize_cubic_align", "cubic", "align_corners", sizes=[1, 2, 6, 7], only="tpu", why=_BICUBIC),
    rs("resize_axes", "Resize", xi, None, c([2, 3], F32), axes=[2, 3], mode="linear"),
]

# ------------------------------------------------------------------ com.microsoft contrib ops
ms = _rows("attention")
H = 8
ROWS += [
    ms("ms_attention", "Attention", r(2, 4, H), Init(r(H, 3 * H, scale=0.3)), Init(r(3 * H)),
       np.array([[1, 1, 1, 0], [1, 1, 0, 0]], np.int32), num_heads=2, domain="com.microsoft"),
    ms("ms_attention_causal", "Attention", r(2, 4, H), Init(r(H, 3 * H, scale=0.3)), Init(r(3 * H)),
       num_heads=2, unidirectional=1, domain="com.microsoft"),
    ms("ms_skip_layernorm", "SkipLayerNormalization", r(2, 3, H), r(2, 3, H), Init(pos(H)), Init(r(H)),
       Init(r(H)), epsilon=1e-5, domain="com.microsoft"),
    ms("ms_bias_gelu", "BiasGelu", r(2, 3, H), Init(r(H)), domain="com.microsoft"),
    ms("ms_fast_gelu", "FastGelu", r(2, 3, H), Init(r(H)), domain="com.microsoft"),
    ms("ms_gelu", "Gelu", r(2, 3, H), domain="com.microsoft"),
]


def groups() -> dict[str, list[OnnxRow]]:
    """Rows by '<family>_opset<N>': one model each."""
    out: dict[str, list[OnnxRow]] = {}
    for row in ROWS:
        out.setdefault(f"{row.family}_opset{row.opset}" + (f"_{row.only}_only" if row.only else ""), []).append(row)
    return out


def _check():
    ids = [row.id for row in ROWS]
    dup = {i for i in ids if ids.count(i) > 1}
    assert not dup, f"duplicate row ids {dup}"
    for row in ROWS:
        assert (row.rtol <= 1e-5 and not row.only) or row.why, f"{row.id}: a looser tolerance or only= needs a why"


_check()
