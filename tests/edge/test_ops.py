"""The op table (tests.op_rows.ROWS) through the edge backend, checked against torch eager.

Each row is exported (weights as module buffers, as in real models), lowered to LiteRT
builtins, run in the LiteRT interpreter (XNNPACK) and compared with the row's tolerance.
Rows the backend does not lower yet are strict xfails listed below with the reason.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from tests.edge._util import assert_close
from tests.op_rows import ROWS, OpModule, args_at, dynamic_shapes, row_inputs

# row id -> why the edge backend does not lower it (yet)
_NO_INT_BITWISE = "LiteRT has no integer bitwise AND/OR/NOT or left-shift builtin"
_INT8_QUANT = "LiteRT's int8/uint8 kernels assume quantized tensors: plain int8/uint8 gives wrong results"
XFAIL: dict[str, str] = {
    "bitwise_and": _NO_INT_BITWISE,
    "bitwise_and_scalar": _NO_INT_BITWISE,
    "bitwise_or": _NO_INT_BITWISE,
    "bitwise_not": _NO_INT_BITWISE,
    "bitwise_left_shift": _NO_INT_BITWISE,
    "dt_i8_relu": _INT8_QUANT,
    "dt_i8_abs": "LiteRT ABS refuses a non-quantized int8 input (fails to prepare)",
}


def _params():
    for r in ROWS:
        marks = [pytest.mark.xfail(reason=XFAIL[r.id], strict=True)] if r.id in XFAIL else []
        yield pytest.param(r, id=r.id, marks=marks)


@pytest.mark.parametrize("row", list(_params()))
def test_op_row(row):
    from tpu_export import litert_torch

    module = OpModule(row, weights_as_params=True).eval()
    inputs = row_inputs(row, weights_as_params=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = litert_torch.convert(module, inputs)
    got = model(*inputs)
    with torch.no_grad():
        want = row.fn(*row.args, **row.kwargs)
    if isinstance(want, (tuple, list)):
        want = tuple(want)
    assert_close(got, want, row.rtol, row.atol, exact=row.kind != "float", what=row.id)


def _dyn_params():
    for r in ROWS:
        if r.dyn:
            marks = [pytest.mark.xfail(reason=XFAIL_DYNAMIC[r.id], strict=True)] if r.id in XFAIL_DYNAMIC else []
            yield pytest.param(r, id=r.id, marks=marks)


# row id -> why its dynamic form is not lowered (yet)
XFAIL_DYNAMIC: dict[str, str] = {}


@pytest.mark.parametrize("row", list(_dyn_params()))
def test_op_row_symbolic_sizes(row):
    """The row exported with its named dims dynamic: the .tflite marks them -1 in shape_signature, and one
    interpreter resized (resize_tensor_input, strict: only -1 dims may change) to each size matches torch."""
    from ai_edge_litert.interpreter import Interpreter

    from tpu_export import litert_torch

    module = OpModule(row, weights_as_params=True).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = litert_torch.convert(module, row_inputs(row, weights_as_params=True),
                                     dynamic_shapes=(dynamic_shapes(row),))  # forward(*tensors)
    it = Interpreter(model_content=model.tflite_model())
    ins, outs = it.get_input_details(), it.get_output_details()
    for d, spec in zip(ins, dynamic_shapes(row)):
        assert sorted(i for i, n in enumerate(d["shape_signature"]) if n == -1) == sorted(spec or {}), d
    sizes = [{}] + list(row.sizes)
    for k, sz in enumerate(sizes):
        args = args_at(row, sz, seed=k) if sz else row.args
        inputs = row_inputs(_with_args(row, args), weights_as_params=True)
        for d, x in zip(ins, inputs):
            it.resize_tensor_input(d["index"], list(x.shape), strict=True)
        it.allocate_tensors()
        for d, x in zip(ins, inputs):
            it.set_tensor(d["index"], x.numpy().astype(d["dtype"]))
        it.invoke()
        got = [torch.from_numpy(it.get_tensor(o["index"])) for o in outs]
        with torch.no_grad():
            want = row.fn(*args, **row.kwargs)
        want = tuple(want) if isinstance(want, (tuple, list)) else want
        assert_close(got[0] if len(got) == 1 else tuple(got), want, row.rtol, row.atol, exact=row.kind != "float",
                     what=f"{row.id} at {sz or 'the sample sizes'}")


def _with_args(row, args):
    """``row`` with other args (the same slots)."""
    import dataclasses

    return dataclasses.replace(row, args=tuple(args))


# ------------------------------------------------------------------ lowering forms chosen for XNNPACK
# Each case: a small module, the op histogram its .tflite must (not) have, and torch eager
# numerics. XNNPACK (LiteRT's default CPU delegate) takes SLICE, RESHAPE, CONCATENATION and a
# SAME pool, but not a STRIDED_SLICE with steps or a shrink mask, SPLIT_V or BROADCAST_TO: each
# of those splits the delegated graph and runs on the slower builtin kernel.


def _convert_hist(module, args):
    from tpu_export import litert_torch
    from tpu_export.edge import op_histogram

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = litert_torch.convert(module.eval(), args)
    return model, op_histogram(model.tflite_model())


def _check(module, args, rtol=1e-5):
    model, hist = _convert_hist(module, args)
    with torch.no_grad():
        want = module(*args)
    assert_close(model(*args), want, rtol, what=type(module).__name__)
    return hist


class _Fn(torch.nn.Module):
    def __init__(self, fn, *params):
        super().__init__()
        self.fn = fn
        self.ps = torch.nn.ParameterList(params)

    def forward(self, *xs):
        return self.fn(*xs, *self.ps)


def test_select_and_stepped_slices_are_slice_ops():
    """Swin's qkv[0..2] selects and its patch merging x[:, 0::2, 1::2, :]: SLICE + RESHAPE only."""
    torch.manual_seed(0)

    def f(x, y):
        qkv = y.reshape(4, 16, 3, 2, 8).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        merged = torch.cat([x[:, 0::2, 0::2, :], x[:, 1::2, 0::2, :], x[:, 0::2, 1::2, :], x[:, 1::2, 1::2, :]], -1)
        return q * 2 + k - v, merged, x[:, 2:14:4, -1]

    hist = _check(_Fn(f), (torch.randn(1, 16, 16, 8), torch.randn(4, 16, 48)))
    assert "STRIDED_SLICE" not in hist, hist
    assert hist["SLICE"] == 3 + 4 * 2 + 2, hist  # one per aten.select / aten.slice node


def test_uneven_stepped_slice_keeps_strided_slice():
    """A step that does not divide its dim (9 rows, every 2nd) stays one STRIDED_SLICE."""
    hist = _check(_Fn(lambda x: x[:, 1::2]), (torch.randn(2, 9, 4),))
    assert hist.get("STRIDED_SLICE") == 1 and "SLICE" not in hist, hist


def test_split_is_slices():
    """ShuffleNet's chunk(2): two SLICEs, no SPLIT_V."""
    hist = _check(_Fn(lambda x: [c * (i + 1) for i, c in enumerate(x.chunk(2, dim=1))]), (torch.randn(1, 8, 5, 5),))
    assert "SPLIT_V" not in hist and hist["SLICE"] == 2, hist


def test_ceil_mode_max_pool_is_same_padding():
    """SqueezeNet's 3x3/2 ceil_mode pool overhangs by SAME's trailing pad: no PADV2 in front."""
    torch.manual_seed(0)
    hist = _check(torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(),
                                      torch.nn.MaxPool2d(3, 2, ceil_mode=True)), (torch.randn(1, 3, 34, 34),))
    assert "PADV2" not in hist and "PAD" not in hist and hist["MAX_POOL_2D"] == 1, hist


def test_channel_shuffle_runs_as_three_transposes():
    """[N, 2, C/2] -> [N, C/2, 2] (ShuffleNet's shuffle, NHWC): three row-moving TRANSPOSEs."""
    torch.manual_seed(0)

    class Shuffle(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Conv2d(32, 32, 1)
            self.b = torch.nn.Conv2d(32, 32, 1)

        def forward(self, x):
            y = self.a(x)
            y = y.view(1, 2, 16, 8, 8).transpose(1, 2).reshape(1, 32, 8, 8)
            return self.b(y)

    hist = _check(Shuffle(), (torch.randn(1, 32, 8, 8),))
    assert hist["TRANSPOSE"] == 2 + 3, hist  # boundary in and out, then the shuffle


def test_window_partition_transposes_once():
    """Swin's window partition (view, permute, view to windows, then a merge of the window
    dims) costs one TRANSPOSE, not a second one to undo the first's layout."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(16, 16)

    def f(x, w, b):
        x = x.view(1, 4, 4, 4, 4, 16).permute(0, 1, 3, 2, 4, 5).reshape(16, 4, 4, 16)
        return torch.nn.functional.linear(x.reshape(16, 16, 16), w, b)

    hist = _check(_Fn(f, lin.weight, lin.bias), (torch.randn(1, 16, 16, 16),))
    assert hist["TRANSPOSE"] == 1, hist


def test_layer_norm_affine_folds_into_linears():
    """LayerNorm read only by linear layers (ViT's pre-norm, ConvNeXt's block): its weight and
    bias go into the linears' weights, so the norm ends at its rsqrt MUL."""
    torch.manual_seed(0)

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = torch.nn.LayerNorm(32)
            with torch.no_grad():
                self.norm.weight.uniform_(0.5, 1.5)
                self.norm.bias.uniform_(-0.5, 0.5)
            self.q = torch.nn.Linear(32, 16)
            self.k = torch.nn.Linear(32, 16, bias=False)

        def forward(self, x):
            y = self.norm(x)
            return self.q(y), self.k(y)

    hist = _check(M(), (torch.randn(2, 5, 32),), rtol=1e-5)
    assert hist["MUL"] == 1 and hist["ADD"] == 1 and hist["FULLY_CONNECTED"] == 2, hist  # rsqrt MUL, eps ADD


def test_layer_norm_with_other_readers_keeps_affine():
    """A post-norm output also read by a residual ADD keeps its MUL and ADD (no fold)."""
    torch.manual_seed(0)
    norm, lin = torch.nn.LayerNorm(32), torch.nn.Linear(32, 32)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)

    def f(x, nw, nb, w, b):
        y = torch.nn.functional.layer_norm(x, (32,), nw, nb)
        return torch.nn.functional.linear(y, w, b) + y

    hist = _check(_Fn(f, norm.weight, norm.bias, lin.weight, lin.bias), (torch.randn(2, 5, 32),))
    assert hist["MUL"] == 2, hist


def test_rms_weight_folds_into_linears():
    """Llama's RMSNorm (weight * normalized) read by the q/k/v projections: no weight MUL."""
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.rand(32) + 0.5)
    q, kv = torch.nn.Linear(32, 32, bias=False), torch.nn.Linear(32, 16, bias=False)

    def f(x, g, wq, wkv):
        n = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        y = g * n
        return torch.nn.functional.linear(y, wq), torch.nn.functional.linear(y, wkv)

    hist = _check(_Fn(f, w, q.weight, kv.weight), (torch.randn(1, 7, 32),))
    assert hist.get("MUL", 0) == 1, hist  # only x * rsqrt(...)


def test_hardsigmoid_after_conv_folds_into_its_bias():
    """MobileNetV3's squeeze-excite gate: conv -> hardsigmoid is CONV_2D (+3 in the bias, RELU6
    fused) and one MUL by 1/6, no ADD."""
    torch.manual_seed(0)
    hist = _check(torch.nn.Sequential(torch.nn.Conv2d(8, 16, 1), torch.nn.Hardsigmoid()),
                  (torch.randn(1, 8, 4, 4) * 4,))
    assert "ADD" not in hist and hist["MUL"] == 1, hist


def test_repeat_kv_expand_is_concatenation():
    """Grouped-query attention's repeat_kv (expand x2 on a new axis): one CONCATENATION of the
    tensor with itself, no BROADCAST_TO."""
    torch.manual_seed(0)

    def f(k):
        return (k[:, :, None, :, :].expand(1, 2, 2, 6, 8).reshape(1, 4, 6, 8)) * 3

    hist = _check(_Fn(f), (torch.randn(1, 2, 6, 8),))
    assert "BROADCAST_TO" not in hist and hist["CONCATENATION"] == 1, hist


def test_div_by_constant_is_mul():
    """Attention's / sqrt(d): a MUL by the reciprocal (XNNPACK's DIV is slower)."""
    hist = _check(_Fn(lambda x: x / 3.0 + x / torch.tensor([2.0, 5.0, 7.0])), (torch.randn(2, 3),), rtol=2e-7)
    assert "DIV" not in hist and hist["MUL"] == 2, hist


def test_fused_qkv_head_split_transposes_once():
    """ViT's attention: a fused qkv projection viewed as heads, permute(2, 0, 3, 1, 4) and unbind into q, k, v,
    attention, then the heads merged: one TRANSPOSE before the split (each piece plain, k^T as BATCH_MATMUL's
    adj_y) and one for the merge, not one per piece."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(32, 96)

    def f(x, w, b):
        qkv = torch.nn.functional.linear(x, w, b).reshape(1, 10, 3, 4, 8).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        o = torch.softmax(q @ k.transpose(-1, -2) * 8**-0.5, -1) @ v
        return o.transpose(1, 2).reshape(1, 10, 32)

    hist = _check(_Fn(f, lin.weight, lin.bias), (torch.randn(1, 10, 32),))
    assert hist["TRANSPOSE"] == 2, hist
