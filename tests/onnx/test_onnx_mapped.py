"""An .onnx file's large weights are read from a map of the file and copied once (converter/onnx/wire.py): the
model imported from the path is the one onnx.load gives, layouts other than the plain one are parsed whole,
and malformed files fail with one line."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from tests.numerics import rel_err
from tpu_export.converter.onnx import OnnxImportError, import_onnx
from tpu_export.converter.onnx.graph import build_graph
from tpu_export.converter.onnx.load import check_and_infer, load_model


def _model():
    """x[2, 64] @ W[64, 64] + b, then @ V[64, 32] -> y: W and V are large (16 and 8 KiB), b (256 B) is not."""
    g = np.random.RandomState(0)
    inits = [numpy_helper.from_array(g.randn(64, 64).astype(np.float32), "W"),
             numpy_helper.from_array(g.randn(64).astype(np.float32), "b"),
             numpy_helper.from_array(g.randn(64, 32).astype(np.float32), "V")]
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
             helper.make_node("Add", ["h", "b"], ["a"], name="add"),
             helper.make_node("MatMul", ["a", "V"], ["y"], name="mm2")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 32])], inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 9
    return m


def _ort(data: bytes, x):
    import onnxruntime as ort

    return ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def _write(tmp_path, data: bytes):
    path = tmp_path / "model.onnx"
    path.write_bytes(data)
    return path


def test_large_weights_come_from_the_map_and_the_import_matches_onnxruntime(tmp_path):
    m = _model()
    path = _write(tmp_path, m.SerializeToString())
    proto, _, mapped = load_model(path)
    try:
        assert sorted(mapped.spans) == [0, 2]  # W and V left in the map, b parsed
        assert [t.HasField("raw_data") for t in proto.graph.initializer] == [False, True, False]
        stripped = onnx.ModelProto()
        stripped.CopyFrom(m)
        for i in (0, 2):
            stripped.graph.initializer[i].ClearField("raw_data")
        assert proto == stripped  # everything else is the model as onnx.load gives it
        view = mapped.array(2, proto.graph.initializer[2], "model.onnx")
        assert mapped.owns(view) and mapped.owns(view.T) and not view.flags.writeable
        assert np.array_equal(view, numpy_helper.to_array(m.graph.initializer[2]))
        mapped.release(view)  # its pages leave the process; a read maps them again from the page cache
        mapped.release(np.zeros(3))  # not a view of the map: nothing to do
        assert np.array_equal(view, numpy_helper.to_array(m.graph.initializer[2]))
        del view
        graph = build_graph(proto, check_and_infer(proto, "model.onnx", None, mapped), "model.onnx", 18, mapped)
        assert not any(mapped.owns(v) for v in graph.consts.values())  # each weight copied out of the map
    finally:
        mapped.close()
    assert all(m.closed for m in mapped._maps)  # no view of the map is left anywhere
    imp = import_onnx(path)
    x = np.random.RandomState(1).randn(2, 64).astype(np.float32)
    assert rel_err(imp.module(torch.from_numpy(x))["y"], _ort(m.SerializeToString(), x)) <= 1e-6
    for p in imp.module.parameters():  # copies the module owns (the map is closed), writable
        p.data.add_(0)
    assert torch.equal(imp.module.V.data, torch.tensor(numpy_helper.to_array(m.graph.initializer[2])))


def _field(num: int, body: bytes) -> bytes:
    """A length-delimited protobuf field: key, length (varints), body."""
    out = bytearray()
    for v in ((num << 3) | 2, len(body)):
        while v >= 0x80:
            out.append((v & 0x7F) | 0x80)
            v >>= 7
        out.append(v)
    return bytes(out) + body


def test_a_tensor_with_two_raw_data_fields_is_parsed_whole_last_one_wins(tmp_path):
    # protobuf keeps the last of a repeated singular field: the map must not take the first
    m = _model()
    real = m.graph.initializer[0].raw_data
    decoy = TensorProto()
    decoy.CopyFrom(m.graph.initializer[0])
    decoy.raw_data = bytes(len(real))
    tensor = decoy.SerializeToString() + _field(9, real)  # TensorProto.raw_data twice: zeros, then the real one
    rest = onnx.GraphProto()
    rest.CopyFrom(m.graph)
    del rest.initializer[0]
    head = onnx.ModelProto()
    head.CopyFrom(m)
    head.ClearField("graph")
    data = head.SerializeToString() + _field(7, _field(5, tensor) + rest.SerializeToString())
    assert onnx.load_model_from_string(data).graph.initializer[0].raw_data == real
    x = np.random.RandomState(1).randn(2, 64).astype(np.float32)
    imp = import_onnx(_write(tmp_path, data))
    assert rel_err(imp.module(torch.from_numpy(x))["y"], _ort(data, x)) <= 1e-6


def test_a_large_tensor_with_two_value_fields_gets_its_bytes_back_for_the_checker(tmp_path):
    m = _model()
    m.graph.initializer[0].float_data.extend([1.0])  # raw_data and float_data: not plain
    path = _write(tmp_path, m.SerializeToString())
    proto, _, mapped = load_model(path)
    try:
        assert proto.graph.initializer[0].raw_data == m.graph.initializer[0].raw_data
        assert sorted(mapped.spans) == [2]
    finally:
        mapped.close()
    with pytest.raises(OnnxImportError) as e:
        import_onnx(path)
    assert "onnx.checker rejects the model" in str(e.value) and "one and only one value field" in str(e.value)


def test_raw_data_longer_than_its_shape_names_the_tensor(tmp_path):
    m = _model()
    m.graph.initializer[2].raw_data += bytes(8)
    with pytest.raises(OnnxImportError) as e:
        import_onnx(_write(tmp_path, m.SerializeToString()))
    text = str(e.value)
    assert "\n" not in text and "'V'" in text and "8200 bytes" in text and "take 8192" in text


@pytest.mark.parametrize("cut", [0, 100, 9000])
def test_empty_and_truncated_files_fail_in_one_line(tmp_path, cut):
    data = _model().SerializeToString()
    path = _write(tmp_path, data[:cut])
    with pytest.raises(OnnxImportError) as e:
        import_onnx(path)
    text = str(e.value)
    assert "\n" not in text and "model.onnx" in text
    assert ("not an ONNX model" if cut == 0 else "not a valid ONNX protobuf") in text


def test_a_file_that_cannot_be_mapped_is_read_whole(tmp_path, monkeypatch):
    import tpu_export.converter.onnx.wire as wire

    def refuse(*a, **k):  # what mmap raises on a filesystem without mmap support (ENODEV)
        raise OSError(19, "No such device")

    monkeypatch.setattr(wire.mmap, "mmap", refuse)
    m = _model()
    path = _write(tmp_path, m.SerializeToString())
    proto, _, mapped = load_model(path)
    assert mapped is None and proto == m


def test_external_data_weights_stay_in_a_map_of_their_file(tmp_path):
    m = _model()
    for t, off in ((m.graph.initializer[0], 0), (m.graph.initializer[2], 16384)):  # W and V in weights.bin
        data = t.raw_data
        with open(tmp_path / "weights.bin", "ab") as f:
            f.write(data)
        t.ClearField("raw_data")
        t.data_location = TensorProto.EXTERNAL
        for k, v in (("location", "weights.bin"), ("offset", str(off)), ("length", str(len(data)))):
            e = t.external_data.add()
            e.key, e.value = k, v
    path = _write(tmp_path, m.SerializeToString())
    proto, _, mapped = load_model(path)
    try:
        assert sorted(mapped.spans) == [0, 2]
        assert all(not t.external_data and not t.HasField("raw_data") for t in proto.graph.initializer[::2])
    finally:
        mapped.close()
    full = onnx.load(str(path))  # onnx.load reads the external data in
    x = np.random.RandomState(1).randn(2, 64).astype(np.float32)
    imp = import_onnx(path)
    assert rel_err(imp.module(torch.from_numpy(x))["y"], _ort(full.SerializeToString(), x)) <= 1e-6
