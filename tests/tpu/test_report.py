"""report.json honesty: figures XLA does not know are unknown with a reason, never a number; our
roofline estimate sits beside XLA's figures with the chip facts' sources."""

from __future__ import annotations

import pytest
import torch

from tpu_export import converter, tpu_backend
from tpu_export.tpu_backend.artifact.report import build_report, figures_of, unknown_reason
from tpu_export.tpu_backend.chips import CHIPS

pytest.importorskip("libtpu", reason="AOT compilation for TPU needs libtpu (pip install 'libtpu==0.0.42.*')")


@pytest.mark.parametrize("key, raw, known", [
    ("optimal_seconds", -3.0, False),  # what libtpu gave for a real-size ResNet-18 on v6e
    ("optimal_seconds", 0.0, False),
    ("optimal_seconds", 1e-5, True),
    ("flops", -1.0, False),
    ("flops", None, False),
    ("flops", float("nan"), False),
    ("transcendentals", 0.0, True),  # a program without exp/tanh: a real zero
    ("bytes accessed", 123.0, True),
])
def test_unknown_reason(key, raw, known):
    why = unknown_reason(key, raw)
    assert (why is None) == known
    if not known:
        assert key in why and ("no " in why or str(float(raw)) in why)


class _XlaSaid:
    """What libtpu's cost analysis returned for resnet18 at 224x224 on v6e (optimal_seconds -3.0),
    with its real memory analysis: that program takes minutes to compile, so its answer is
    replayed here; every other test in this file reads a real compile."""

    def __init__(self, compiled, **cost):
        self._c, self._cost = compiled, cost

    def cost_analysis(self):
        return {**self._c.cost_analysis(), **self._cost}

    def memory_analysis(self):
        return self._c.memory_analysis()


@pytest.fixture(scope="module")
def matvec():
    """A 4096x4096 float32 matrix-vector product: 64 MiB of weight read for 33 MFLOPs, memory bound."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4096, 4096, bias=False).eval()
    bundle = tpu_backend.export_program(converter.prepare(model, (torch.randn(1, 4096),)), platforms=("tpu",))
    return bundle, bundle.compile_for("tpu-v6e")


@pytest.mark.libtpu
def test_roofline_beside_xla(matvec):
    _, c = matvec
    s = c.report["signatures"]["serving_default"]
    chip = CHIPS["tpu-v6e"]
    r = s["roofline"]
    assert r["sources"] == {"peak_bf16_flops": chip.source, "hbm_bandwidth": chip.bandwidth_source}
    assert r["peak_bf16_flops_per_device"] == 918e12 and r["hbm_bandwidth_bytes_per_s_per_device"] == 1638e9
    flops = s["cost"]["flops"]["per_device"]
    assert 4096 * (2 * 4096 - 1) <= flops < 1.1 * 2 * 4096 * 4096  # XLA counts n-1 adds per dot
    assert r["compute_seconds"] == flops / 918e12
    weight = 4096 * 4096 * 4
    least = r["least_bytes"]
    assert weight < least["bytes"] < weight + 65536 and least["memory_seconds"] == least["bytes"] / 1638e9
    assert least["bound"] == "memory" and least["seconds"] == least["memory_seconds"]
    xla = r["xla_bytes"]
    assert xla["bytes"] == s["cost"]["bytes_accessed"]["per_device"] >= least["bytes"]
    # XLA's own step estimate of a memory-bound program is its bytes at the HBM bandwidth: our bandwidth fact
    # (from the v6e page) agrees with libtpu's model of the chip to within 10%
    opt = s["cost"]["optimal_seconds"]["value"]
    assert 0.9 < xla["seconds"] / opt < 1.1
    assert least["seconds"] <= opt * 1.1
    assert c.report["chip"]["bandwidth_source"] == chip.bandwidth_source


@pytest.mark.libtpu
def test_unknown_xla_figures_are_never_numbers(matvec):
    bundle, c = matvec
    import jax

    from tpu_export.tpu_backend.aot import topology_devices
    from tpu_export.tpu_backend.chips import parse_topology

    sig = bundle.signatures["serving_default"]
    dev = topology_devices(parse_topology("tpu-v6e"))[0]
    sds = [jax.ShapeDtypeStruct(tuple(bundle.weights[w].shape), jax.numpy.float32,
                                sharding=jax.sharding.SingleDeviceSharding(dev)) for w in sig.weight_names]
    x = jax.ShapeDtypeStruct((1, 4096), jax.numpy.float32, sharding=jax.sharding.SingleDeviceSharding(dev))
    compiled = jax.jit(sig.exported.call).lower(sds, x).compile()
    f = figures_of(_XlaSaid(compiled, optimal_seconds=-3.0, flops=-1.0))
    assert f["cost"]["optimal_seconds"] is None and f["cost"]["flops"] is None
    assert "-3.0" in f["unknown"]["optimal_seconds"] and "-1.0" in f["unknown"]["flops"]
    assert f["cost"]["bytes_accessed"] > 4096 * 4096 * 4
    f.update(compile_seconds=1.0, input_shapes=[[1, 4096]], executable_bytes=1, hbm_needed_bytes_per_device=1)
    rep = build_report("tpu-v6e", "1x1", "v6e:1x1", CHIPS["tpu-v6e"], [dev], None, {"s": f}, 2**30)
    s = rep["signatures"]["s"]
    assert s["cost"]["optimal_seconds"]["value"] is None and "-3.0" in s["cost"]["optimal_seconds"]["unknown"]
    assert s["cost"]["flops"] == {"per_device": None, "whole_program": None, "per_chip": None,
                                  "unknown": f["unknown"]["flops"]}
    assert s["implied_utilisation_at_bf16_peak"]["value"] is None
    assert s["roofline"]["compute_seconds"]["value"] is None
    assert s["roofline"]["least_bytes"]["seconds"]["value"] is None
    # what XLA does know stays a number
    assert s["roofline"]["least_bytes"]["memory_seconds"] > 0 and s["cost"]["bytes_accessed"]["per_device"] > 0
