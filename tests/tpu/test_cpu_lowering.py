"""CPU-platform lowering choices (tpu_backend/lowering/ops_conv.py): a wide dense conv runs on XLA:CPU as
one matmul over im2col patches, the TPU keeps its convolution; both match torch."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from tests.numerics import rel_err
from tpu_export import converter, tpu_backend
from tpu_export.tpu_backend.platform_specialize import for_platform


class Conv(torch.nn.Module):
    def __init__(self, cin, cout, k, stride, padding, dilation, bias):
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(cin, cout, k, stride, padding, dilation, bias=bias)

    def forward(self, x):
        return torch.relu(self.conv(x))


@pytest.mark.parametrize("cin, cout, k, stride, padding, dilation, hw, bias, matmul", [
    (256, 256, 3, 1, 1, 1, 7, False, True),  # resnet18's layer4 shape (at 256 ch)
    (288, 256, 3, 2, 1, 1, 9, True, True),
    (256, 320, 3, (1, 2), (2, 0), 2, 8, True, True),  # dilated, mixed strides, one-sided padding per axis
    (64, 64, 3, 1, 1, 1, 8, False, False),  # narrow: XLA:CPU's own convolution is faster
    (32, 96, 1, 1, 0, 1, 8, True, True),  # pointwise
    (64, 128, 1, 2, 0, 1, 8, False, True),  # a strided 1x1 (ResNet downsample)
])
def test_wide_conv_is_a_matmul_on_cpu(cin, cout, k, stride, padding, dilation, hw, bias, matmul):
    model = Conv(cin, cout, k, stride, padding, dilation, bias).eval()
    x = torch.randn(2, cin, hw, hw, generator=torch.Generator().manual_seed(1))
    prog = converter.prepare(model, (x,))
    cpu = tpu_backend.export_program(prog, platforms=("cpu",))
    text = cpu.signatures["serving_default"].exported.mlir_module()
    assert ("stablehlo.convolution" not in text) == matmul
    with torch.no_grad():
        want = model(x)
    assert rel_err(cpu(x), want) <= 1e-5
    # the two-platform artifact: the TPU branch keeps the convolution, the CPU fallback takes the matmul
    both = tpu_backend.export_program(prog)
    text = both.signatures["serving_default"].exported.mlir_module()
    assert "stablehlo.convolution" in text and ("stablehlo.dot_general" in text) == matmul
    assert rel_err(both(x), want) <= 1e-5


def test_depthwise_taps_computed_once_before_a_layer_norm():
    """ConvNeXt's block head (depthwise 7x7 -> channels-last -> LayerNorm): on XLA:CPU the taps sit in a
    conditional, so the norm's three fusions read one buffer instead of each recomputing 49 taps."""
    torch.manual_seed(0)
    from tests.zoo import CNBlock

    head = torch.nn.Sequential(*CNBlock(32).block[:3]).eval()
    x = torch.randn(1, 32, 14, 14, generator=torch.Generator().manual_seed(1))
    b = tpu_backend.export_program(converter.prepare(head, (x,)), platforms=("cpu",))
    sig = b.signatures["serving_default"]
    import jax

    ws = [b.weights[w].numpy() for w in sig.weight_names]
    hlo = jax.jit(sig.exported.call).lower(ws, x.numpy()).compile().as_text()
    assert hlo.count("conditional(") == 1
    with torch.no_grad():
        assert rel_err(b(x), head(x)) <= 1e-5


@pytest.mark.parametrize("cin, cout, groups, stride, hw", [(48, 48, 6, 1, 9), (104, 208, 13, 2, 10), (16, 32, 4, 1, 6)])
def test_grouped_conv_stays_grouped_on_every_platform(cin, cout, groups, stride, hw):
    """A grouped conv is one grouped convolution on TPU too, channels-last there (NHWC/HWIO, as a JAX model
    writes it: libtpu compiles that form faster; tpu_backend/lowering/channels_last.py). As a dense conv over a
    block-diagonal kernel libtpu compiled RegNetY-400MF 7.6x faster but XLA's cost model gave the program 4.2x the
    flops and 3.3x the step time (bench/tpu_compile.py)."""
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(cin, cout, 3, stride, 1, groups=groups, bias=True).eval()
    x = torch.randn(1, cin, hw, hw, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = conv(x)
    both = tpu_backend.export_program(converter.prepare(conv, (x,)))
    text = both.signatures["serving_default"].exported.mlir_module()
    assert f"feature_group_count = {groups}" in text and "feature_group_count = 1 " not in text
    assert rel_err(both(x), want) <= 1e-5  # the CPU branch
    tpu_only = tpu_backend.export_program(converter.prepare(conv, (x,)), platforms=("tpu",))
    assert "[b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f]" in tpu_only.signatures["serving_default"].exported.mlir_module()
    from tpu_export.tpu_backend.platform_specialize import for_platform

    sig = both.signatures["serving_default"]
    (nhwc,) = for_platform(sig.exported, "tpu").call([both.weights[w].numpy() for w in sig.weight_names], x.numpy())
    assert rel_err(torch.from_numpy(np.asarray(nhwc)), want) <= 1e-5  # the TPU's program, run here


@pytest.mark.parametrize("platforms", [("tpu", "cpu"), ("cpu",)])
@pytest.mark.parametrize("shape", [(3, 48), (2, 5, 48), (48,)])
def test_linear_contracts_the_weight_as_stored(shape, platforms):
    """nn.Linear is one dot_general over the weight as stored, on every platform, which XLA:CPU runs on the
    argument in place: torch's [out, in] in a TPU export, [in, out] off the TPU (tpu_backend.weight_layout), where
    the one transpose back to torch's layout folds into the dot. A transposed copy made on every call was what a
    weight.T then a dot cost (AlexNet's 4096x9216 classifier at batch 1: 1328 ms -> 31 ms; torch eager 73 ms)."""
    import jax

    torch.manual_seed(0)
    lin = torch.nn.Linear(48, 40).eval()
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
    b = tpu_backend.export_program(converter.prepare(lin, (x,)), platforms=platforms)
    sig = b.signatures["serving_default"]
    if "tpu" in platforms:
        assert tuple(b.weights["weight"].shape) == (40, 48)
        assert "stablehlo.transpose" not in sig.exported.mlir_module()
    else:
        assert tuple(b.weights["weight.io"].shape) == (48, 40)
    assert "stablehlo.dot_general" in sig.exported.mlir_module()
    ws = [jax.ShapeDtypeStruct(tuple(b.weights[w].shape), np.float32) for w in sig.weight_names]
    cpu = sig.exported if platforms == ("cpu",) else for_platform(sig.exported, "cpu")
    hlo = jax.jit(cpu.call).lower(ws, jax.ShapeDtypeStruct(tuple(x.shape), np.float32)).compile().as_text()
    assert not re.search(r"f32\[(?:40,48|48,40)\]\{[\d,]*\} (?!parameter|bitcast)\w+\(", hlo), hlo
    with torch.no_grad():
        want = lin(x)
    assert rel_err(b(x), want) <= 1e-6
