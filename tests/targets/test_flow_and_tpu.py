"""The backends' writers for the multi-target convert, typed options checked before any work, and TPU
target packaging through tpu_backend."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from tpu_export.targets import OptionsError, get_target, options_for, package
from tpu_export.targets.backends import BACKENDS


def test_edge_writer_writes_and_reports(cnn, tmp_path):
    module, args, prog, ref = cnn
    ios = get_target("ios")
    path, info = BACKENDS["edge"].write_for_target(prog, ios, str(tmp_path), options_for(ios, {"quant_config": "fp16"}),
                                                   lambda m: None)
    assert path.endswith("ios/ios.tflite") and info["files"] == ["ios.tflite"]
    assert info["compatibility"]["metal"]["fallback"] == {}
    assert info["compatibility"]["coreml"]["fallback"] == {"RESHAPE": 1}
    json.dumps(info)  # goes into summary.json


def test_options_fail_before_any_work():
    with pytest.raises(ValueError, match="not runnable there"):  # TFLite Micro: full-integer int8 only
        options_for("iot", {"quant_config": "weight_only_int4"})
    with pytest.raises(TypeError, match="does not take option calibration_data"):
        options_for("android", {"calibration_data": [(torch.zeros(1),)]})
    # a TPU option given to an edge target is refused here, not by the writer after capture
    with pytest.raises(OptionsError, match=r"'android' does not take option\(s\) mesh \(mesh: options of other"):
        options_for("android", {"mesh": {"data": 2}})
    with pytest.raises(OptionsError, match="'cpu-xla' does not take option.* topology"):
        options_for("cpu-xla", {"topology": "2x2"})
    with pytest.raises(OptionsError, match="option flash_kib must be a positive number of KiB, got '1' \\(str\\)"):
        options_for("iot", {"flash_kib": "1", "calibration_data": [(torch.zeros(1),)]})
    with pytest.raises(OptionsError, match="option strict_ops must be True or False"):
        options_for("web", {"strict_ops": "yes"})
    with pytest.raises(OptionsError, match="partition_rules need a mesh"):
        options_for("tpu-v6e", {"partition_rules": [("fc.weight", (None, "model"))]})
    for old, new in (("to_channel_last_io", "channel_last_io"), ("channel_last", "channel_last_io"),
                     ("fp16_weights", "quant_config='fp16'")):
        with pytest.raises(OptionsError, match=f"option {old} is gone; use {new}"):
            options_for("android", {old: True})
    opts = options_for("iot", {"calibration_data": [(torch.zeros(1),)], "ram_kib": 64})
    assert type(opts).__name__ == "IotOptions" and opts.ram_kib == 64 and opts.channel_last_for(get_target("iot"))
    assert type(options_for("tpu-v6e", {"topology": "2x2"})).__name__ == "TpuOptions"
    assert type(options_for("cuda")).__name__ == "XlaOptions"


@pytest.fixture(scope="module")
def small():
    from tpu_export import converter

    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU()).eval()
    x = torch.randn(2, 8)
    return m, x, converter.prepare(m, (x,))


def test_cpu_xla_package_runs(small, tmp_path):
    from tpu_export import tpu_backend

    m, x, prog = small
    written = package("cpu-xla", prog, str(tmp_path), say=lambda s: None)
    out = tpu_backend.load(written["model.tpuexp"])(x)
    np.testing.assert_allclose(np.asarray(out), m(x).detach().numpy(), rtol=1e-5, atol=1e-6)


def tpu_backend_reports(path):
    from tpu_export import tpu_backend

    return tpu_backend.read_artifact(path).reports()


@pytest.mark.libtpu
def test_tpu_package_aot_and_bad_topology(small, tmp_path):
    from tpu_export.tpu_backend.chips import InvalidTopologyError

    m, x, prog = small
    lines = []
    written = package("tpu-v6e", prog, str(tmp_path / "ok"), topology="2x2", aot=True, say=lines.append)
    assert "model.tpuexp" in written and lines[0] == "tpu-v6e: topology v6e:2x2 (4 chips, 4 devices)"
    assert "tpu-v6e: AOT-compiling for 2x2 with libtpu" in lines
    assert tpu_backend_reports(written["model.tpuexp"])
    with pytest.raises(InvalidTopologyError, match="valid topologies: 1x1, 2x2"):
        package("tpu-v6e", prog, str(tmp_path / "bad"), topology="3x3", say=lambda s: None)
    assert not (tmp_path / "bad").exists()  # checked before anything is written
