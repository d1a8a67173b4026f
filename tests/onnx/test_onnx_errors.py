"""Bad ONNX input fails with one clear line naming the file, node or tensor; the entry points take .onnx files
and ModelProtos (dynamic dims, dim_sizes, external data) and match onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from tests.numerics import rel_err
from tpu_export.converter.onnx import OnnxImportError, UnsupportedOnnxOpsError, import_onnx


def _model(nodes, inputs, outputs, inits=(), opset=18, domains=()):
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)] +
                          [helper.make_opsetid(d, 1) for d in domains])
    m.ir_version = 9
    return m


def _mlp(batch="batch"):
    """x[batch, 4] -> Gemm(W, b) -> Relu -> y[batch, 3], weights named like a torch export's."""
    g = np.random.RandomState(0)
    inits = [numpy_helper.from_array(g.randn(3, 4).astype(np.float32), "fc.weight"),
             numpy_helper.from_array(g.randn(3).astype(np.float32), "fc.bias")]
    nodes = [helper.make_node("Gemm", ["x", "fc.weight", "fc.bias"], ["h"], name="fc", transB=1),
             helper.make_node("Relu", ["h"], ["y"], name="act")]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 4])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 3])], inits)


def _ort(model, **feeds):
    import onnxruntime as ort

    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]


def _one_line(e) -> str:
    text = str(e.value)
    assert "\n" not in text, text
    return text


def test_malformed_file_names_the_file(tmp_path):
    bad = tmp_path / "broken.onnx"
    bad.write_bytes(b"\x08\x07garbage that is not a protobuf" * 3)
    with pytest.raises(OnnxImportError) as e:
        import_onnx(bad)
    assert "broken.onnx" in _one_line(e) and "not a valid ONNX protobuf" in str(e.value)


def test_unknown_domain_names_the_node():
    node = helper.make_node("Frobnicate", ["x"], ["y"], name="frob_1", domain="acme.ops")
    m = _model([node], [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])], domains=["acme.ops"])
    with pytest.raises(OnnxImportError) as e:
        import_onnx(m)
    assert "frob_1" in _one_line(e) and "'acme.ops'" in str(e.value)


def test_unresolvable_shape_names_the_node():
    # Reshape to a shape the model computes from an input's values: no static size to give torch
    nodes = [helper.make_node("Reshape", ["x", "s"], ["y"], name="reshape_by_values")]
    m = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6]),
                       helper.make_tensor_value_info("s", TensorProto.INT64, [2])],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    m.graph.output[0].type.tensor_type.shape.dim.add()
    m.graph.output[0].type.tensor_type.shape.dim.add()
    imp = import_onnx(m)
    with pytest.raises(OnnxImportError) as e:
        imp.module(*imp.sample_args)
    assert "'reshape_by_values' (Reshape)" in _one_line(e) and "known when the model is built" in str(e.value)


def test_unsupported_nodes_are_listed_at_once():
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="ok"),
             helper.make_node("Det", ["a"], ["b"], name="det_1"),
             helper.make_node("Det", ["a"], ["c"], name="det_2"),
             helper.make_node("Bernoulli", ["a"], ["d"], name="coin")]
    m = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 3])],
               [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in "bcd"])
    for o in m.graph.output:
        o.type.tensor_type.shape.dim.add()
    with pytest.raises(UnsupportedOnnxOpsError) as e:
        import_onnx(m)
    text = str(e.value)
    assert "3 node(s) of 2 ONNX op(s)" in text
    assert "ai.onnx::Det opset 18  x2: det_1, det_2" in text and "ai.onnx::Bernoulli opset 18  x1: coin" in text


def test_opset_out_of_range_says_how_to_convert():
    m = _mlp()
    m.opset_import[0].version = 11
    with pytest.raises(OnnxImportError) as e:
        import_onnx(m)
    assert "opset is 11" in _one_line(e) and "version_converter" in str(e.value)


def _external(tmp_path, location: str, length: int | None = None, folder=None):
    m = _mlp()
    w = m.graph.initializer[0]
    data = numpy_helper.to_array(w).tobytes()
    (tmp_path / "weights.bin").write_bytes(data)
    w.ClearField("raw_data")
    w.data_location = TensorProto.EXTERNAL
    for k, v in (("location", location), ("offset", "0"), ("length", str(length or len(data)))):
        e = w.external_data.add()
        e.key, e.value = k, v
    path = (folder or tmp_path) / "model.onnx"
    path.write_bytes(m.SerializeToString())
    return path


def test_external_data_outside_the_folder_is_refused(tmp_path):
    (tmp_path / "sub").mkdir()
    with pytest.raises(OnnxImportError) as e:
        import_onnx(_external(tmp_path, "../weights.bin", folder=tmp_path / "sub"))
    assert "'fc.weight'" in _one_line(e) and "outside the model's folder" in str(e.value)
    with pytest.raises(OnnxImportError) as e:
        import_onnx(_external(tmp_path, "weights.bin", length=7))
    assert "does not fit" in _one_line(e)


def test_external_data_inside_the_folder_imports(tmp_path):
    path = _external(tmp_path, "weights.bin")
    x = np.random.RandomState(1).randn(2, 4).astype(np.float32)
    imp = import_onnx(path)
    want = _ort(onnx.load(str(path)), x=x)
    assert rel_err(imp.module(torch.from_numpy(x))["y"], want) <= 1e-6


def test_entry_points_take_onnx_files_with_dynamic_and_fixed_dims(tmp_path):
    import tpu_export
    from tpu_export import litert_torch, tpu_backend
    from tpu_export.cli import main

    path = tmp_path / "mlp.onnx"
    path.write_bytes(_mlp().SerializeToString())
    x = np.random.RandomState(2).randn(3, 4).astype(np.float32)
    want = _ort(_mlp(), x=x)
    written = tpu_export.convert(path, targets=["cpu-xla", "cpu"], out_dir=tmp_path / "out")
    tpu = tpu_backend.load(written["cpu-xla"])(torch.from_numpy(x))  # batch 3: the dim_param stayed dynamic
    edge = litert_torch.load(written["cpu"])(torch.from_numpy(x))
    assert rel_err(tpu["y"], want) <= 1e-5 and rel_err(edge["y"], want) <= 1e-5
    fixed = litert_torch.convert(_mlp(), dim_sizes={"batch": 3})  # a ModelProto, one named dim fixed
    assert rel_err(fixed(torch.from_numpy(x))["y"], want) <= 1e-5
    with pytest.raises(ValueError):
        fixed(torch.from_numpy(x[:2]))  # batch is 3 now
    assert main(["convert", str(path), "--target", "android", "--dim", "batch=3", "-o", str(tmp_path / "cli"),
                 "--quiet"]) == 0
    cli = litert_torch.load(tmp_path / "cli" / "android" / "android.tflite")
    assert rel_err(cli(torch.from_numpy(x))["y"], want) <= 1e-5


def test_registering_an_op_twice_for_overlapping_opsets_fails():
    from tpu_export.converter.onnx.registry import DuplicateOnnxOpError, OnnxOpTable

    t = OnnxOpTable()
    t.op("Foo", since=13, until=17)(lambda ctx, x: x)
    t.op("Foo", since=18)(lambda ctx, x: x)  # disjoint ranges: fine
    with pytest.raises(DuplicateOnnxOpError, match="ai.onnx::Foo opset 16 registered twice"):
        t.op("Foo", since=16)(lambda ctx, x: x)
    assert t.lookup("", "Foo", 15) is not None and t.lookup("", "Foo", 12) is None


def test_resize_variant_torch_cannot_express_is_refused_naming_the_attribute():
    scales = numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], name="up", mode="linear",
                            coordinate_transformation_mode="asymmetric")
    m = _model([node], [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 3, 3])],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 6, 6])], [scales])
    imp = import_onnx(m)
    with pytest.raises(OnnxImportError) as e:
        imp.module(*imp.sample_args)
    assert "node 'up' (Resize)" in _one_line(e) and "coordinate_transformation_mode='asymmetric'" in str(e.value)


def test_dim_ranges_and_sample_inputs():
    from tpu_export import converter

    imp = import_onnx(_mlp(), dim_sizes={"batch": (1, 8)})
    prog = converter.prepare(imp.module, imp.sample_args, dynamic_shapes=imp.dynamic_shapes)
    sig = prog.signature()
    assert sig.inputs[0].shape == ("batch", 4) and sig.dim_ranges["batch"] == (1, 8)
    assert sorted(prog.weights) == ["fc.bias", "fc.weight"]  # initializer names kept
    x = torch.randn(5, 4)
    imp = import_onnx(_mlp(), (x,))  # traced with the caller's sample; batch stays dynamic
    assert imp.sample_args[0] is not None and imp.dynamic_shapes is not None
    with pytest.raises(OnnxImportError, match="sample input 'x' has shape \\[5, 3\\]"):
        import_onnx(_mlp(), (torch.randn(5, 3),))
