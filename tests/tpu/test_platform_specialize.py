"""A two-platform signature specialized to one platform before its compile (tpu_backend/platform_specialize.py):
no platform case is left, the program is the platform's own (the TPU's form run here on the CPU is still the
model), and the TPU executable compiled from it has the cost figures of one compiled from the module as
exported."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from tests.numerics import rel_err
from tpu_export import converter, tpu_backend
from tpu_export.tpu_backend.platform_specialize import for_platform


class Mixed(torch.nn.Module):
    """One conv of each platform-dependent lowering: wide dense (im2col on the CPU), grouped (channels-last on
    the TPU), depthwise (taps on the CPU), and a squeeze-excite pair on the pooled vector."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.wide = torch.nn.Conv2d(32, 256, 3, padding=1)
        self.grouped = torch.nn.Conv2d(256, 256, 3, padding=1, groups=8)
        self.depthwise = torch.nn.Conv2d(256, 256, 3, padding=1, groups=256)
        self.fc1, self.fc2 = torch.nn.Conv2d(256, 16, 1), torch.nn.Conv2d(16, 256, 1)

    def forward(self, x):
        y = self.depthwise(torch.relu(self.grouped(torch.relu(self.wide(x)))))
        s = torch.sigmoid(self.fc2(torch.relu(self.fc1(y.mean((2, 3), keepdim=True)))))
        return y * s


@pytest.fixture(scope="module")
def case():
    model = Mixed().eval()
    x = torch.randn(1, 32, 8, 8, generator=torch.Generator().manual_seed(1))
    bundle = tpu_backend.export_program(converter.prepare(model, (x,)))
    with torch.no_grad():
        want = model(x)
    return bundle, x, want


def _run(bundle, exported, x):
    sig = bundle.signatures["serving_default"]
    ws = [bundle.weights[w].numpy() for w in sig.weight_names]
    (out,) = exported.call(ws, x.numpy())
    return torch.from_numpy(np.asarray(out))


def test_the_exported_module_carries_both_platforms(case):
    bundle, x, want = case
    exported = bundle.signatures["serving_default"].exported
    assert tuple(exported.platforms) == ("tpu", "cpu")
    assert "stablehlo.case" in exported.mlir_module()
    assert rel_err(_run(bundle, exported, x), want) <= 1e-5


def _ops(text: str) -> dict:
    return {op: len(re.findall(rf"stablehlo\.{op}\b", text)) for op in ("convolution", "dot_general", "case",
                                                                          "transpose")}


@pytest.mark.parametrize("platform", ["cpu", "tpu"])
def test_specialized_module_is_that_platforms_program(case, platform):
    bundle, x, want = case
    exported = bundle.signatures["serving_default"].exported
    one = for_platform(exported, platform)
    text = one.mlir_module()
    # the ops of an export for that platform alone, with fewer cases: a single-platform export still wraps each
    # platform_dependent in a case on a constant (the CPU's depthwise taps keep their own conditional)
    prog = converter.prepare(Mixed().eval(), (x,))
    alone = _ops(tpu_backend.export_program(prog, platforms=(platform,)).signatures["serving_default"].exported
                 .mlir_module())
    got = _ops(text)
    assert {k: got[k] for k in got if k != "case"} == {k: alone[k] for k in alone if k != "case"}
    assert got["case"] <= alone["case"] and got["case"] == (1 if platform == "cpu" else 0)
    if platform == "tpu":  # the grouped conv channels-last
        assert "[b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f]" in text
    # the squeeze-excite convs on the 1x1 pooled vector are matmuls on every platform
    assert _ops(text)["dot_general"] >= 2
    # either platform's program is the model: the TPU's form runs on the CPU here too
    assert rel_err(_run(bundle, one, x), want) <= 1e-5
    assert tuple(one.platforms) == tuple(exported.platforms)  # called as the original: the index stays an argument


def test_single_platform_export_is_left_as_is(case):
    bundle, x, _ = case
    prog = converter.prepare(Mixed().eval(), (x,))
    exported = tpu_backend.export_program(prog, platforms=("cpu",)).signatures["serving_default"].exported
    assert for_platform(exported, "cpu") is exported and for_platform(exported, "tpu") is exported


@pytest.mark.libtpu
def test_tpu_executable_has_the_original_modules_cost_figures(case):
    pytest.importorskip("libtpu")
    import jax

    from tpu_export.tpu_backend.aot import topology_devices
    from tpu_export.tpu_backend.aot_signature import compile_signature, signature_job
    from tpu_export.tpu_backend.artifact.report import figures_of
    from tpu_export.tpu_backend.chips import parse_topology
    from tpu_export.tpu_backend.host import prepare_cpu_host

    prepare_cpu_host()
    bundle, _, _ = case
    sig = bundle.signatures["serving_default"]
    device = topology_devices(parse_topology("tpu-v5e", "1x1"))[0]
    place = jax.sharding.SingleDeviceSharding(device)
    job = signature_job(bundle, sig)
    args = [jax.ShapeDtypeStruct(tuple(j["shape"]), a.dtype, sharding=place)
            for j, a in zip(job["weights"] + job["inputs"], sig.exported.in_avals)]
    n_w = len(job["weights"])
    # the module as exported, both platforms' branches in it, compiled directly
    whole = figures_of(jax.jit(sig.exported.call, keep_unused=True).lower(args[:n_w], *args[n_w:]).compile())
    _, ours = compile_signature(sig.exported, job, [device], None, None, "tpu-v5e", "1x1")
    for key in ("flops", "bytes_accessed"):
        assert ours["cost"][key] == pytest.approx(whole["cost"][key], rel=1e-6), key
    assert ours["memory"]["temp_bytes"] == whole["memory"]["temp_bytes"]
