"""The conversion-flow hook for edge targets, and TPU target packaging through tpu_backend."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from targets import package
from targets.flow import write_edge_target


def test_edge_hook_writes_and_reports(cnn, tmp_path):
    module, args, prog, ref = cnn
    path, info = write_edge_target(prog, "ios", str(tmp_path), {"quant_config": "fp16", "topology": "2x2"})
    assert path.endswith("ios/ios.tflite") and info["files"] == ["ios.tflite"]
    assert info["compatibility"]["metal"]["fallback"] == {}
    assert info["compatibility"]["coreml"]["fallback"] == {"RESHAPE": 1}
    json.dumps(info)  # goes into summary.json
    with pytest.raises(ValueError, match="not runnable there"):  # TFLite Micro: full-integer int8 only
        write_edge_target(prog, "iot", str(tmp_path), {"quant_config": "weight_only_int4"})
    with pytest.raises(TypeError, match="does not take option"):
        write_edge_target(prog, "android", str(tmp_path), {"calibration_data": [args]})


@pytest.fixture(scope="module")
def small():
    import converter

    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU()).eval()
    x = torch.randn(2, 8)
    return m, x, converter.prepare(m, (x,))


def test_cpu_xla_package_runs(small, tmp_path):
    import tpu_backend

    m, x, prog = small
    written = package("cpu-xla", prog, str(tmp_path), say=lambda s: None)
    out = tpu_backend.load(written["model.tpuexp"])(x)
    np.testing.assert_allclose(np.asarray(out), m(x).detach().numpy(), rtol=1e-5, atol=1e-6)


def test_tpu_package_aot_and_bad_topology(small, tmp_path):
    from tpu_backend.chips import InvalidTopologyError

    m, x, prog = small
    lines = []
    written = package("tpu-v6e", prog, str(tmp_path / "ok"), topology="2x2", aot=True, say=lines.append)
    assert "model.tpuexp" in written and lines == ["tpu-v6e: topology v6e:2x2 (4 chips, 4 devices)"]
    with pytest.raises(InvalidTopologyError, match="valid topologies: 1x1, 2x2"):
        package("tpu-v6e", prog, str(tmp_path / "bad"), topology="3x3", say=lambda s: None)
    assert not (tmp_path / "bad").exists()  # checked before anything is written
