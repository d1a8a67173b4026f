"""Convolution kernels stored HWIO (tpu_backend.weight_layout): which weights are, that both platforms' programs
are still the model (torch eager as the reference), that a partition rule written for torch's shape follows the
kernel, and that XLA:CPU reads the stored kernels as they are instead of copying them on every call."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from torch import nn

from tpu_export import converter, tpu_backend
from tpu_export.converter.numerics import rel_err
from tpu_export.tpu_backend.platform_specialize import for_platform


class Convs(nn.Module):
    """A 3x3 conv, a grouped and a depthwise one, a 1x1 and a wide 3x3 (the two XLA:CPU runs as one matmul), a
    transposed conv, and a conv whose kernel is also read by another op."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 32, 3, padding=1)
        self.grouped = nn.Conv2d(32, 32, 3, padding=1, groups=4)
        self.depthwise = nn.Conv2d(32, 32, 3, padding=1, groups=32)
        self.widen = nn.Conv2d(32, 256, 1)
        self.wide = nn.Conv2d(256, 256, 3, padding=1, bias=False)
        self.up = nn.ConvTranspose2d(256, 8, 2, stride=2)
        self.shared = nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x):
        x = torch.relu(self.stem(x))
        x = self.depthwise(self.grouped(x))
        x = self.wide(torch.relu(self.widen(x)))
        y = self.shared(self.up(x))
        return y, self.shared.weight * y[:, :, :3, :3].mean(0)


def _export(**kw):
    torch.manual_seed(0)
    model = Convs().eval()
    x = torch.randn(2, 3, 6, 6, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = model(x)
    return tpu_backend.export_program(converter.prepare(model, (x,)), **kw), x, want


def _run(bundle, exported, x) -> list:
    names = bundle.signatures["serving_default"].weight_names
    ws = [bundle.weights[w].float().numpy().astype(a.dtype) for w, a in zip(names, exported.in_avals)]
    return [torch.from_numpy(np.asarray(o, dtype=np.float32)) for o in exported.call(ws, x.numpy())]


def test_conv_kernels_are_stored_hwio_and_each_platforms_program_is_the_model():
    bundle, x, want = _export()
    stored = {n: tuple(t.shape) for n, t in bundle.weights.items()}
    for name, oihw in [("stem", (32, 3, 3, 3)), ("grouped", (32, 8, 3, 3)), ("depthwise", (32, 1, 3, 3)),
                       ("widen", (256, 32, 1, 1)), ("wide", (256, 256, 3, 3))]:
        o, i, h, w = oihw
        assert stored.pop(f"{name}.weight.hwio") == (h, w, i, o), name
    # the transposed conv's kernel, and a kernel another op reads too, keep torch's layout and name
    assert stored["up.weight"] == (256, 8, 2, 2) and stored["shared.weight"] == (8, 8, 3, 3)
    assert not any(n.endswith(".hwio") for n in stored)
    exported = bundle.signatures["serving_default"].exported
    for platform in ("tpu", "cpu"):  # each platform's program, run here
        for got, ref in zip(_run(bundle, for_platform(exported, platform), x), want, strict=True):
            assert rel_err(got, ref) <= 1e-5, platform


def test_bfloat16_export_stores_the_kernels_in_bfloat16():
    bundle, x, want = _export(dtype="bfloat16")
    assert bundle.weights["wide.weight.hwio"].dtype == torch.bfloat16
    # bf16 weights and activations through six layers: a few bf16 ulps of the output's scale
    got = _run(bundle, bundle.signatures["serving_default"].exported, x)
    assert rel_err(got[0], want[0]) <= 3e-2


def test_a_partition_rule_for_the_torch_kernel_follows_it_into_hwio():
    bundle, _, _ = _export(mesh={"data": 2, "model": 2},
                           partition_rules=[(r"wide\.weight", ("model", None, None, None))])  # output channels
    assert bundle.weight_shardings["wide.weight.hwio"] == [None, None, None, "model"]


def test_xla_cpu_reads_the_stored_kernels_without_copying_them():
    import jax

    bundle, x, _ = _export(platforms=("cpu",))
    sig = bundle.signatures["serving_default"]
    ws = [jax.ShapeDtypeStruct(tuple(bundle.weights[w].shape), np.float32) for w in sig.weight_names]
    hlo = jax.jit(sig.exported.call).lower(ws, jax.ShapeDtypeStruct(tuple(x.shape), np.float32)).compile().as_text()
    # the 1x1 and the wide conv run as matmuls (ops_conv._im2col): their kernels are read in place, as the
    # parameter or a bitcast of it, never transposed or copied (a copy was half of ResNet-50's CPU time)
    shapes = "|".join(["256,32,1,1", "1,1,32,256", "32,256", "256,32",
                       "256,256,3,3", "3,3,256,256", "2304,256", "256,2304"])
    made = re.findall(rf"= f32\[(?:{shapes})\]\{{[\d,]*\}} (\w+)\(", hlo)
    assert made and set(made) <= {"parameter", "bitcast"}, made


def test_a_weight_named_like_a_stored_kernel_is_refused():
    from tpu_export.tpu_backend.weight_layout import layout_rewrite, plan_layouts

    prog = converter.prepare(Convs().eval(), (torch.randn(1, 3, 6, 6),))
    prog.weights["wide.weight.hwio"] = torch.zeros(1)
    with pytest.raises(ValueError, match=r"already has a weight named 'wide\.weight\.hwio'"):
        layout_rewrite(prog, "serving_default", plan_layouts(prog, ["serving_default"]))
