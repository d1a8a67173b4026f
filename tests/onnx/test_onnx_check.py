"""The import's onnx.checker pass runs on a copy of the model without its large weights (serializing them cost
seconds on real-size files) and still gives the checker's verdict: each stripped weight's data is checked on
the real tensor with the checker's own words, everything else by onnx.checker itself."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from tests.numerics import rel_err
from tpu_export.converter.onnx import OnnxImportError, import_onnx


def _model(w_as_input=False):
    """x[2, 64] @ W[64, 64] + b -> Relu: W (16 KiB) is large enough to be stripped, b (256 B) is not."""
    g = np.random.RandomState(0)
    inits = [numpy_helper.from_array(g.randn(64, 64).astype(np.float32), "W"),
             numpy_helper.from_array(g.randn(64).astype(np.float32), "b")]
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
             helper.make_node("Add", ["h", "b"], ["a"], name="add"),
             helper.make_node("Relu", ["a"], ["y"], name="act")]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64])]
    if w_as_input:  # an initializer also listed as a graph input (older exporters' keep_initializers_as_inputs)
        inputs.append(helper.make_tensor_value_info("W", TensorProto.FLOAT, [64, 64]))
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 64])],
                              inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 9
    return m


def _checker_says(m) -> str:
    with pytest.raises(onnx.checker.ValidationError) as e:
        onnx.checker.check_model(m)
    return str(e.value).strip()


@pytest.mark.parametrize("w_as_input", [False, True])
def test_checker_gets_the_model_without_its_weights_and_the_import_matches_onnxruntime(monkeypatch, w_as_input):
    import onnxruntime as ort

    m = _model(w_as_input)
    seen = []
    real = onnx.checker.check_model

    def recording(model, *a, **k):
        seen.append(model.ByteSize())
        return real(model, *a, **k)

    monkeypatch.setattr(onnx.checker, "check_model", recording)
    imp = import_onnx(m)
    assert len(seen) == 1 and seen[0] < 1024 and m.ByteSize() > 16384, (seen, m.ByteSize())
    x = np.random.RandomState(1).randn(2, 64).astype(np.float32)
    feeds = {"x": x, **({"W": numpy_helper.to_array(m.graph.initializer[0])} if w_as_input else {})}
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    assert rel_err(imp.module(torch.from_numpy(x))["y"], want) <= 1e-6
    assert list(m.graph.initializer[0].dims) == [64, 64] and len(m.graph.initializer[0].raw_data) == 16384


@pytest.mark.parametrize("keep", [100, 0])
def test_a_weight_short_of_its_shape_is_refused_in_the_checkers_words(keep):
    m = _model()
    w = m.graph.initializer[0]
    w.raw_data = w.raw_data[:keep]
    with pytest.raises(OnnxImportError) as e:
        import_onnx(m)
    text = str(e.value)
    assert "\n" not in text and "onnx.checker rejects the model" in text
    assert _checker_says(m) in text, (_checker_says(m), text)


def test_a_broken_node_beside_large_weights_is_still_the_checkers_to_refuse():
    m = _model()
    m.graph.node[2].input.append("b")  # Relu takes one input
    with pytest.raises(OnnxImportError) as e:
        import_onnx(m)
    assert "onnx.checker rejects the model" in str(e.value) and "act" in str(e.value)
    assert _checker_says(m).split("\n")[0][:60] in str(e.value)
