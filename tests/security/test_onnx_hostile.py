"""Hostile ONNX models, built in the tests with onnx.helper: a few bytes asking the constant folder for gigabytes, and
external data that is a FIFO, a device, or a link out of the model's folder. Each is an OnnxImportError naming the
node (or tensor and file), refused quickly and without the memory it asks for."""

from __future__ import annotations

import os

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from tests.security.probe import probe  # noqa: E402
from tpu_export.converter.onnx import import_onnx  # noqa: E402
from tpu_export.converter.onnx.load import OnnxImportError  # noqa: E402


def _bomb(op: str = "Expand") -> bytes:
    """A 3 GB constant in ~120 bytes: Expand of one float32 to [16384, 16384, 3] (or ConstantOfShape / Tile)."""
    x = numpy_helper.from_array(np.zeros((1,), np.float32), "x")
    shape = numpy_helper.from_array(np.array([1 << 14, 1 << 14, 3], np.int64), "shape")
    if op == "Expand":
        node, inits = helper.make_node("Expand", ["x", "shape"], ["y"], name="bomb"), [x, shape]
    elif op == "ConstantOfShape":
        node, inits = helper.make_node("ConstantOfShape", ["shape"], ["y"], name="bomb"), [shape]
    else:
        x3 = numpy_helper.from_array(np.zeros((1, 1, 1), np.float32), "x")
        node, inits = helper.make_node("Tile", ["x", "shape"], ["y"], name="bomb"), [x3, shape]
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["a", "b", "c"])
    g = helper.make_graph([node], "g", [], [y], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


@pytest.mark.subprocess
@pytest.mark.parametrize("op", ["Expand", "ConstantOfShape", "Tile"])
def test_a_tiny_graph_folding_into_gigabytes_is_refused(tmp_path, op):
    path = tmp_path / "bomb.onnx"
    path.write_bytes(_bomb(op))
    assert path.stat().st_size < 256
    r = probe(f"import_onnx({str(path)!r})", setup="import torch\nfrom tpu_export.converter.onnx import import_onnx",
              timeout=120, mem_limit_gb=4)
    assert r["error"] == "OnnxImportError", r
    assert f"node 'bomb' ({op})" in r["message"] and "3221225472-byte constant" in r["message"], r
    assert "TPU_EXPORT_MAX_FOLD_BYTES" in r["message"] and "\n" not in r["message"], r
    assert r["seconds"] < 5 and r["hwm_mb"] < 1200, r


def test_the_fold_cap_is_checked_even_where_inference_does_not_know_the_shape():
    """The shape comes out of an Abs, whose values ONNX inference does not propagate: the output shape is unknown
    to it, and the cap is still checked from the shape input before the fold allocates."""
    x = numpy_helper.from_array(np.zeros((1,), np.float32), "x")
    shape = numpy_helper.from_array(np.array([1 << 14, 1 << 14, 3], np.int64), "shape")
    nodes = [helper.make_node("Abs", ["shape"], ["s"]), helper.make_node("Expand", ["x", "s"], ["y"], name="bomb")]
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["a", "b", "c"])
    m = helper.make_model(helper.make_graph(nodes, "g", [], [y], [x, shape]),
                          opset_imports=[helper.make_opsetid("", 17)])
    inferred = onnx.shape_inference.infer_shapes(m, data_prop=True)
    assert [d.dim_value for d in inferred.graph.output[0].type.tensor_type.shape.dim] == [0, 0, 0]  # unknown
    with pytest.raises(OnnxImportError, match=r"node 'bomb' \(Expand\).*3221225472-byte constant"):
        import_onnx(m)


def test_the_fold_cap_can_be_raised_for_one_process(monkeypatch):
    """A fold under the cap folds; the same under a lowered cap is refused (the variable names the cap)."""
    x = numpy_helper.from_array(np.ones((1,), np.float32), "x")
    shape = numpy_helper.from_array(np.array([4, 8], np.int64), "shape")
    w = numpy_helper.from_array(np.arange(32, dtype=np.float32).reshape(4, 8), "w")
    nodes = [helper.make_node("Expand", ["x", "shape"], ["e"], name="grow"), helper.make_node("Add", ["e", "w"], ["y"])]
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])
    g = helper.make_graph(nodes, "g", [], [y], [x, shape, w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    imp = import_onnx(m)
    np.testing.assert_array_equal(imp.module()["y"].numpy(), np.arange(32, dtype=np.float32).reshape(4, 8) + 1)
    monkeypatch.setenv("TPU_EXPORT_MAX_FOLD_BYTES", "64")
    with pytest.raises(OnnxImportError, match=r"node 'grow' \(Expand\): .*128-byte constant, more than the 64-byte"):
        import_onnx(m)


def _external(tmp_path, location: str):
    """An .onnx whose one weight lives in external file ``location``."""
    w = numpy_helper.from_array(np.arange(8, dtype=np.float32).reshape(2, 4), "w")
    w.ClearField("raw_data")
    w.data_location = TensorProto.EXTERNAL
    for k, v in (("location", location), ("offset", "0"), ("length", "32")):
        e = w.external_data.add()
        e.key, e.value = k, v
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])
    g = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "g", [x], [y], [w])
    path = tmp_path / "model.onnx"
    path.write_bytes(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    return path


def test_external_data_inside_the_folder_imports(tmp_path):
    (tmp_path / "w.bin").write_bytes(np.arange(8, dtype=np.float32).tobytes())
    imp = import_onnx(_external(tmp_path, "w.bin"))
    x = np.ones((2, 4), np.float32)
    import torch

    got = imp.module(torch.from_numpy(x))["y"].numpy()
    np.testing.assert_array_equal(got, x + np.arange(8, dtype=np.float32).reshape(2, 4))


def test_external_data_symlink_leaving_the_folder_is_refused(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "w.bin").write_bytes(np.arange(8, dtype=np.float32).tobytes())
    (tmp_path / "m" / "w.bin").symlink_to(tmp_path / "w.bin")
    with pytest.raises(OnnxImportError, match=r"tensor 'w'.*'w.bin' is outside the model's folder"):
        import_onnx(_external(tmp_path / "m", "w.bin"))


@pytest.mark.subprocess
@pytest.mark.parametrize("kind", ["fifo", "dev_zero"])
def test_external_data_that_is_a_fifo_or_a_device_is_refused_at_once(tmp_path, kind):
    if kind == "fifo":
        os.mkfifo(tmp_path / "w.bin")
        needle = "is a FIFO"
    else:
        (tmp_path / "w.bin").symlink_to("/dev/zero")
        needle = "outside the model's folder"
    path = _external(tmp_path, "w.bin")
    r = probe(f"import_onnx({str(path)!r})", setup="import torch\nfrom tpu_export.converter.onnx import import_onnx",
              timeout=60, mem_limit_gb=4)
    assert r["error"] == "OnnxImportError" and "tensor 'w'" in r["message"] and needle in r["message"], r
    assert r["seconds"] < 5 and r["hwm_mb"] < 1200, r


@pytest.mark.subprocess
def test_a_fifo_as_the_onnx_file_is_refused_at_once(tmp_path):
    os.mkfifo(tmp_path / "model.onnx")
    r = probe(f"import_onnx({str(tmp_path / 'model.onnx')!r})",
              setup="import torch\nfrom tpu_export.converter.onnx import import_onnx", timeout=60, mem_limit_gb=4)
    assert r["error"] == "OnnxImportError" and "model.onnx: the .onnx file is a FIFO" in r["message"], r
    assert r["seconds"] < 5, r
