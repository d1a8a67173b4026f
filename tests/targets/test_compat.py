"""Compatibility reports against the delegate tables, and strict mode, on the zoo's CNN and encoder."""

from __future__ import annotations

import pytest

from tpu_export.targets import CompatibilityError, check_for_target
from tpu_export.targets.checks import lower_for_target
from tpu_export.targets.compat import compatibility


@pytest.fixture(scope="module")
def cnn_tflite(cnn):
    return lower_for_target(cnn[2], "android")


@pytest.fixture(scope="module")
def encoder_tflite(encoder):
    return lower_for_target(encoder[2], "android")


def test_cnn_runs_wholly_on_the_android_gpu(cnn_tflite):
    rep = compatibility(cnn_tflite, "android")
    assert rep.delegate == "gpu" and rep.ok
    assert rep.accelerated_count == rep.total > 20
    assert rep.accelerated["CONV_2D"] >= 10 and rep.accelerated["DEPTHWISE_CONV_2D"] >= 5
    assert "0 -> CPU" in rep.summary()


def test_encoder_fallbacks_on_gpu_are_named_with_reasons(encoder_tflite):
    rep = compatibility(encoder_tflite, "android")
    # gpu_compatibility.cc: GATHER takes 1-D indices only (token ids are [batch, seq]).
    assert rep.fallback.get("GATHER") == 1
    assert "only 1-D indices" in rep.reasons["GATHER"]
    assert rep.accelerated["BATCH_MATMUL"] == 4 and rep.accelerated["GELU"] == 2
    assert rep.accelerated_count + rep.fallback_count == rep.total
    text = rep.summary()
    assert "fallback: GATHER x1" in text and "gpu_compatibility.cc" in text


def test_coreml_reports_reshape_and_metal_does_not(cnn_tflite):
    coreml = compatibility(cnn_tflite, "ios")  # Core ML is the default iOS delegate
    metal = compatibility(cnn_tflite, "ios", delegate="metal")
    assert coreml.delegate == "coreml" and coreml.fallback == {"RESHAPE": 1}
    assert metal.ok


def test_tflite_micro_lacks_gelu(encoder_tflite):
    rep = compatibility(encoder_tflite, "iot")
    assert rep.fallback == {"GELU": 2}
    assert "cannot run" in rep.summary()


def test_strict_names_the_fallback_ops(cnn, encoder_tflite):
    with pytest.raises(CompatibilityError) as e:
        check_for_target(encoder_tflite, "android", strict=True, say=lambda m: None)
    assert "GATHER x1 (only 1-D indices)" in str(e.value) and "do not run on GPU" in str(e.value)
    with pytest.raises(CompatibilityError, match="RESHAPE x1"):
        check_for_target(cnn[2], "ios", strict=True, say=lambda m: None)
    lines = []
    reports = check_for_target(cnn[2], "android", strict=True, say=lines.append)  # nothing falls back
    assert reports[0].ok and lines and lines[0].startswith("android [gpu]:")


def test_version_rule_of_coreml():
    from tpu_export.targets.compat.ios_coreml import coreml_common_check
    from tpu_export.targets.compat.model_ops import OpView, TensorView

    f32 = TensorView("x", "float32", (1, 4, 4, 8), False)
    op = OpView(0, 0, "CONV_2D", 2, (f32,), (f32,), None)
    assert coreml_common_check(op) == "version 2 > 1"
    dw = OpView(0, 0, "DEPTHWISE_CONV_2D", 2, (f32,), (f32,), None)
    assert coreml_common_check(dw) is None
    i8 = OpView(0, 0, "ADD", 1, (TensorView("q", "int8", (1, 4), False),), (f32,), None)
    assert "only float32" in coreml_common_check(i8)
