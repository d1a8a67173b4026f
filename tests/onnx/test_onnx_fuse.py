"""GELU written out as arithmetic (what torch's exporters write before opset 20) is imported as one GELU
(converter/onnx/fuse.py): the .tflite holds one GELU op and no ERF/TANH/MUL, and both outputs match
onnxruntime. Patterns whose constants differ or whose inner values have another consumer are left as written
(and still match onnxruntime)."""

from __future__ import annotations

import io
import math
import warnings

import numpy as np
import pytest
import torch

from tests.numerics import rel_err


class _LinearGelu(torch.nn.Module):
    def __init__(self, approximate):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)
        self.approximate = approximate

    def forward(self, x):
        return torch.nn.functional.gelu(self.fc(x), approximate=self.approximate)


def _export(approximate, kind) -> bytes:
    m = _LinearGelu(approximate).eval()
    x = torch.randn(2, 8)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        if kind == "torchscript17":
            buf = io.BytesIO()
            torch.onnx.export(m, (x,), buf, opset_version=17, dynamo=False, input_names=["x"])
            return buf.getvalue()
        return torch.onnx.export(m, (x,), opset_version=18, dynamo=True, verbose=False,
                                 input_names=["x"]).model_proto.SerializeToString()


def _ort(data, *xs):
    import onnxruntime as ort

    sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    return sess.run(None, {i.name: x for i, x in zip(sess.get_inputs(), xs)})


def _imported_ops(data):
    import onnx

    from tpu_export.converter.onnx import import_onnx

    imp = import_onnx(onnx.load_model_from_string(data))
    return imp, [ctx.op_type for _, ctx, *_ in imp.module._nodes]


@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("kind", ["torchscript17", "dynamo18"])
def test_exported_gelu_is_one_op(kind, approximate):
    import jax

    from tpu_export import converter, litert_torch
    from tpu_export.edge import convert_program, op_histogram
    from tpu_export.tpu_backend.lowering import lower_signature

    data = _export(approximate, kind)
    imp, ops = _imported_ops(data)
    assert ops == ["Gemm", "Gelu" if approximate == "none" else "FastGelu"], ops
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prog = converter.prepare(imp.module, imp.sample_args)
    fb = convert_program(prog)
    assert op_histogram(fb) == {"FULLY_CONNECTED": 1, "GELU": 1}
    x = (np.random.RandomState(0).randn(2, 8) * 3).astype(np.float32)
    (want,) = _ort(data, x)
    edge = list(litert_torch.Model(fb)(torch.from_numpy(x)).values())[0]
    assert rel_err(np.asarray(edge), want) <= 1e-5
    low = lower_signature(prog)
    (tpu,) = jax.jit(low.fn)(low.weight_arrays(prog), x)
    assert rel_err(np.asarray(tpu), want) <= 1e-5


_SQRT2 = math.sqrt(2.0)


def _pattern(*, half=0.5, sqrt2=_SQRT2, as_mul=False, order="ts", extra_output=None, erf_of_other=False):
    """The exact-GELU pattern over input x (2, 8), built with onnx.helper; variations for the negative cases."""
    from onnx import TensorProto, helper, numpy_helper

    def const(name, v):
        return numpy_helper.from_array(np.asarray(v, np.float32), name)

    inits = [const("c_half", half), const("c_one", 1.0),
             const("c_div", 1 / sqrt2 if as_mul else sqrt2)]
    src = "z" if erf_of_other else "x"
    nodes = [helper.make_node("Mul" if as_mul else "Div", [src, "c_div"], ["d"]),
             helper.make_node("Erf", ["d"], ["e"]),
             helper.make_node("Add", ["c_one", "e"], ["a"])]
    if order == "ts":  # (x * a) * 0.5
        nodes += [helper.make_node("Mul", ["x", "a"], ["m"]), helper.make_node("Mul", ["m", "c_half"], ["y"])]
    else:  # (0.5 * x) * a
        nodes += [helper.make_node("Mul", ["c_half", "x"], ["m"]), helper.make_node("Mul", ["a", "m"], ["y"])]
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 8]) for n in ["x"] + (["z"] * erf_of_other)]
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 8]) for n in ["y"] + [extra_output or ""]
               if n]
    m = helper.make_model(helper.make_graph(nodes, "g", inputs, outputs, inits),
                          opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    return m.SerializeToString()


@pytest.mark.parametrize("variant,fused", [
    (dict(as_mul=True), True),                      # x * (1/sqrt2) for the Div
    (dict(order="hf"), True),                       # (0.5 * x) * (1 + erf): another association
    (dict(half=0.6), False),                        # not 0.5
    (dict(sqrt2=1.5), False),                       # not sqrt(2)
    (dict(extra_output="a"), False),                # an inner value is also a graph output
    (dict(extra_output="m"), False),
    (dict(erf_of_other=True), False),               # erf of another tensor than the one multiplied
])
def test_gelu_pattern_variants(variant, fused):
    data = _pattern(**variant)
    imp, ops = _imported_ops(data)
    assert (ops == ["Gelu"]) == fused, ops
    rs = np.random.RandomState(1)
    args = [(rs.randn(2, 8) * 3).astype(np.float32) for _ in imp.input_names]
    want = _ort(data, *args)
    with torch.no_grad():
        got = imp.module(*[torch.from_numpy(a) for a in args])
    for g, w in zip(got.values(), want):
        assert rel_err(g.numpy(), w) <= 1e-6


class _Mlp(torch.nn.Module):
    """A transformer's MLP on [batch, seq, dim]: the exporters write each Linear as MatMul + Add."""

    def __init__(self):
        super().__init__()
        self.ln = torch.nn.LayerNorm(8)
        self.fc1, self.fc2 = torch.nn.Linear(8, 16), torch.nn.Linear(16, 8)
        with torch.no_grad():
            self.ln.weight.uniform_(0.5, 1.5)
            self.ln.bias.uniform_(-0.5, 0.5)

    def forward(self, x):
        return self.fc2(torch.nn.functional.gelu(self.fc1(self.ln(x))))


@pytest.mark.parametrize("kind", ["torchscript17", "dynamo18"])
def test_exported_linear_layers_are_fully_connected(kind):
    """MatMul + Add with constant weights imports as aten.linear: the .tflite holds the same ops as the torch
    model's (FULLY_CONNECTED with its bias, the norm's affine folded into it), and matches onnxruntime."""
    from tpu_export import converter, litert_torch
    from tpu_export.edge import convert_program, op_histogram

    torch.manual_seed(0)
    m = _Mlp().eval()
    x = torch.randn(2, 5, 8)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        if kind == "torchscript17":
            buf = io.BytesIO()
            torch.onnx.export(m, (x,), buf, opset_version=17, dynamo=False, input_names=["x"])
            data = buf.getvalue()
        else:
            data = torch.onnx.export(m, (x,), opset_version=18, dynamo=True, verbose=False,
                                     input_names=["x"]).model_proto.SerializeToString()
        imp, ops = _imported_ops(data)
        assert ops.count("Gemm") == 2 and "MatMul" not in ops, ops
        prog = converter.prepare(imp.module, imp.sample_args)
        ref = converter.prepare(m, (x,))
    fb = convert_program(prog)
    assert op_histogram(fb) == op_histogram(convert_program(ref))
    (want,) = _ort(data, x.numpy())
    got = list(litert_torch.Model(fb)(x).values())[0]
    assert rel_err(np.asarray(got), want) <= 1e-5


@pytest.mark.parametrize("shared_weight", [False, True])
def test_matmul_add_fold_only_with_its_own_weight(shared_weight):
    """A weight that another MatMul also reads stays as written (the folded one is stored transposed)."""
    from onnx import TensorProto, helper, numpy_helper

    rs = np.random.RandomState(2)
    inits = [numpy_helper.from_array(rs.randn(8, 4).astype(np.float32), "w"),
             numpy_helper.from_array(rs.randn(4).astype(np.float32), "b")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Add", ["y", "b"], ["out"])]
    outs = [helper.make_tensor_value_info("out", TensorProto.FLOAT, [2, 3, 4])]
    if shared_weight:
        nodes.append(helper.make_node("MatMul", ["x", "w"], ["out2"]))
        outs.append(helper.make_tensor_value_info("out2", TensorProto.FLOAT, [2, 3, 4]))
    m = helper.make_model(helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                                      [2, 3, 8])], outs, inits),
                          opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    data = m.SerializeToString()
    imp, ops = _imported_ops(data)
    assert ops == (["MatMul", "Add", "MatMul"] if shared_weight else ["Gemm"]), ops
    x = rs.randn(2, 3, 8).astype(np.float32)
    with torch.no_grad():
        got = imp.module(torch.from_numpy(x))
    for g, w in zip(got.values(), _ort(data, x)):
        assert rel_err(g.numpy(), w) <= 1e-6
