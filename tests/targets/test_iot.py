"""The iot target: int8 via ai-edge-quantizer, run in TFLite Micro, C array compiled with gcc, budgets."""

from __future__ import annotations

import os
import shutil
import subprocess

import numpy as np
import pytest
import torch

from tpu_export.targets import BudgetError, CompatibilityError, QuantizationError, package
from tpu_export.targets.iot import check_budget
from tpu_export.targets.tflm_run import TflmError, run_tflm


def _calibration(args, n=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(args[0].shape, generator=g),) for _ in range(n)]


@pytest.fixture(scope="module")
def iot_pkg(cnn, tmp_path_factory):
    module, args, prog, ref = cnn
    out = tmp_path_factory.mktemp("iot")
    lines = []
    written = package("iot", prog, str(out), name="mnv2", calibration_data=_calibration(args), say=lines.append)
    return written, lines


def test_int8_model_runs_in_tflite_micro(iot_pkg, cnn):
    written, lines = iot_pkg
    module, args, prog, ref = cnn
    tfl = open(written["mnv2.tflite"], "rb").read()
    header = open(written["mnv2_model.h"]).read()
    arena = int(header.split("MNV2_ARENA_SIZE ")[1].split("u")[0])
    assert 16 * 1024 < arena < 1024 * 1024
    x = np.ascontiguousarray(args[0].numpy().transpose(0, 2, 3, 1))  # NHWC on the MCU
    got = run_tflm(tfl, {"x": x}, arena)["output_0"]
    ref = ref.numpy()
    # int8 on a random-weight MobileNetV2: errors of a few quantization steps of the output.
    assert np.abs(got - ref).max() <= 0.2 * (ref.max() - ref.min())
    summary = next(line for line in lines if line.startswith("iot: int8 model"))
    assert "top-1 agreement" in summary and "max abs err" in summary and "arena" in summary
    with pytest.raises(TflmError):  # the measured arena is what it needs, not a guess
        run_tflm(tfl, {"x": x}, arena // 2)


def test_int8_model_is_full_integer_and_tflm_only(iot_pkg):
    from tpu_export.targets.compat import compatibility
    from tpu_export.targets.compat.model_ops import read_ops

    tfl = open(iot_pkg[0]["mnv2.tflite"], "rb").read()
    assert compatibility(tfl, "iot").ok
    for op in read_ops(tfl):
        for t in op.inputs + op.outputs:
            if t is not None and not t.is_const:
                assert t.dtype in ("int8", "int32"), (op.name, t.dtype)


@pytest.mark.subprocess
@pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc is missing")
def test_c_array_compiles_and_equals_the_tflite(iot_pkg, tmp_path):
    written, _ = iot_pkg
    main = tmp_path / "main.c"
    main.write_text(
        '#include <stdio.h>\n#include <stdint.h>\n#include "mnv2_model.h"\n'
        "int main(int argc, char **argv) {\n"
        "  if ((uintptr_t)mnv2_model % 16) return 3;\n"
        '  FILE *f = fopen(argv[1], "wb");\n'
        "  if (!f || fwrite(mnv2_model, 1, mnv2_model_len, f) != mnv2_model_len) return 2;\n"
        "  fclose(f);\n  return mnv2_arena_size == MNV2_ARENA_SIZE ? 0 : 4;\n}\n")
    inc = os.path.dirname(written["mnv2_model.h"])
    obj = tmp_path / "model.o"
    subprocess.run(["gcc", "-std=c11", "-Wall", "-Werror", "-c", written["mnv2_model.c"], "-I", inc, "-o", str(obj)],
                   check=True)
    exe = tmp_path / "dump"
    subprocess.run(["gcc", "-std=c11", "-Wall", "-Werror", str(main), str(obj), "-I", inc, "-o", str(exe)], check=True)
    dumped = tmp_path / "dumped.tflite"
    subprocess.run([str(exe), str(dumped)], check=True)
    assert dumped.read_bytes() == open(written["mnv2.tflite"], "rb").read()


def test_budgets_fail_with_the_numbers(cnn, tmp_path):
    module, args, prog, ref = cnn
    with pytest.raises(BudgetError) as e:
        package("iot", prog, str(tmp_path), calibration_data=_calibration(args, n=2), flash_kib=32, ram_kib=64,
                say=lambda m: None)
    msg = str(e.value)
    assert "flash" in msg and "budget 32 KiB" in msg and "RAM" in msg and "budget 64 KiB" in msg
    assert not os.listdir(tmp_path)  # nothing written
    check_budget(1000, 1000, flash_kib=1, ram_kib=1)  # exactly at / under budget passes


def test_iot_requires_calibration_data(cnn, tmp_path):
    with pytest.raises(QuantizationError, match="calibration_data"):
        package("iot", cnn[2], str(tmp_path), say=lambda m: None)


def test_encoder_fails_on_iot_for_the_documented_reason(encoder, tmp_path):
    # TFLite Micro registers no GELU kernel (python_ops_resolver.cc): the model cannot run there.
    module, args, prog, ref = encoder
    with pytest.raises(CompatibilityError, match="GELU x2"):
        package("iot", prog, str(tmp_path), calibration_data=[args], say=lambda m: None)


def test_a_dense_model_gets_its_arena_measured_without_crashing(tmp_path):
    """TFLite Micro crashes (not fails) when this two-layer MLP gets an arena a few bytes short of its need; the
    arena search probes in a child process, so the conversion finishes, and the measured arena runs it."""
    from tpu_export.converter import prepare

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3)).eval()
    x = torch.randn(1, 4)
    calibration = _calibration((x,))
    written = package("iot", prepare(model, (x,)), str(tmp_path), name="mlp", calibration_data=calibration,
                      say=lambda m: None)
    tfl = open(written["mlp.tflite"], "rb").read()
    arena = int(open(written["mlp_model.h"]).read().split("MLP_ARENA_SIZE ")[1].split("u")[0])
    got = next(iter(run_tflm(tfl, {"input": x.numpy()}, arena).values()))
    want = model(x).detach().numpy()
    # int8 inputs, weights and activations through two layers: within 5% of the range the outputs were calibrated
    # over (255 steps of it; the input's and the hidden layer's rounding add up over 8 and 4 terms)
    seen = torch.cat([model(c) for (c,) in calibration]).detach().numpy()
    assert np.abs(got - want).max() <= 0.05 * (seen.max() - seen.min())
    with pytest.raises(TflmError):
        run_tflm(tfl, {"input": x.numpy()}, arena - 64)
