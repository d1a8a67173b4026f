"""android / ios / cpu / web packages for the zoo's CNN and encoder: files written, numbers right."""

from __future__ import annotations

import os

import numpy as np
import pytest

from tpu_export.targets import package
from tpu_export.targets.tflite_io import signatures


def _run(tflite, inputs):
    from ai_edge_litert.interpreter import Interpreter

    return Interpreter(model_content=tflite).get_signature_runner()(**inputs)


def _quiet(msg):
    pass


@pytest.mark.parametrize("target", ["android", "ios", "cpu", "web"])
def test_cnn_package(cnn, target, tmp_path):
    module, args, prog, ref = cnn
    written = package(target, prog, str(tmp_path), name="net", say=_quiet)
    tfl = open(written["net.tflite"], "rb").read()
    (ins, _), = signatures(tfl).values()
    x = args[0].numpy()
    if target in ("android", "ios"):  # NHWC image I/O by default on mobile
        assert ins[0].shape == (1, 64, 64, 3)
        x = x.transpose(0, 2, 3, 1)
    else:
        assert ins[0].shape == (1, 3, 64, 64)
    out = _run(tfl, {ins[0].name: np.ascontiguousarray(x)})
    np.testing.assert_allclose(next(iter(out.values())), ref.numpy(), rtol=1e-4, atol=1e-5)
    if target == "web":
        assert set(written) == {"net.tflite", "net.js"}
        js = open(written["net.js"]).read()
        assert '"name": "x", "shape": [1, 3, 64, 64], "dtype": "float32"' in js
        assert "loadAndCompile" in js and "accelerator: 'wasm'" in js


def test_channel_last_is_overridable(cnn, tmp_path):
    written = package("android", cnn[2], str(tmp_path), channel_last_io=False, say=_quiet)
    (ins, _), = signatures(open(written["model.tflite"], "rb").read()).values()
    assert ins[0].shape == (1, 3, 64, 64)


@pytest.mark.parametrize("target", ["android", "ios", "web"])
def test_encoder_package(encoder, target, tmp_path):
    module, args, prog, ref = encoder
    written = package(target, prog, str(tmp_path), say=_quiet)
    tfl = open(written["model.tflite"], "rb").read()
    (ins, outs), = signatures(tfl).values()
    assert [s.dtype for s in ins] == ["int32", "int32"]  # token ids: no image layout change
    out = _run(tfl, {s.name: a.numpy().astype(np.int32) for s, a in zip(ins, args)})
    for o, r in zip(outs, ref):
        np.testing.assert_allclose(out[o.name], r.numpy(), rtol=1e-4, atol=1e-4)


def test_fp16_weights_for_gpu_delegates(cnn, tmp_path):
    from tpu_export.targets.compat.model_ops import read_ops

    module, args, prog, ref = cnn
    float_size = len(package("android", prog, str(tmp_path / "f32"), say=_quiet) and
                     open(tmp_path / "f32" / "model.tflite", "rb").read())
    written = package("android", prog, str(tmp_path / "f16"), quant_config="fp16", say=_quiet)
    tfl = open(written["model.tflite"], "rb").read()
    assert len(tfl) < 0.7 * float_size
    ops = read_ops(tfl)
    assert any(op.name == "DEQUANTIZE" and op.inputs[0].dtype == "float16" for op in ops)
    x = np.ascontiguousarray(args[0].numpy().transpose(0, 2, 3, 1))
    out = next(iter(_run(tfl, {"x": x}).values()))
    np.testing.assert_allclose(out, ref.numpy(), rtol=2e-2, atol=2e-2)
    # the float16 weights' DEQUANTIZE nodes are taken by the delegates' partition helpers
    from tpu_export.targets.compat import compatibility

    assert compatibility(tfl, "android").ok and compatibility(tfl, "ios", delegate="metal").ok
    assert compatibility(tfl, "ios").fallback == {"RESHAPE": 1}


def test_unknown_option_is_refused(cnn, tmp_path):
    with pytest.raises(TypeError, match="does not take option"):
        package("web", cnn[2], str(tmp_path), fp16=True, say=_quiet)
    assert not os.listdir(tmp_path)
