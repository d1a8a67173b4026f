"""The TPU form of a convolutional signature keeps activations channels-last (tpu_backend/lowering/channels_last.py):
its specialized module has NHWC convolutions and no transposes between them, runs on the CPU here as the model
(torch eager, rel err <= 1e-5 in float32), and the other platforms' form is the one exported before."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from torch import nn

from tests.numerics import rel_err
from tpu_export import converter, tpu_backend
from tpu_export.tpu_backend.platform_specialize import for_platform


class ResBlock(nn.Module):
    """ResNet's stem and basic block: conv, BN, ReLU, max pool, a strided shortcut, global average pool, fc."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 7, 2, 3, bias=False), nn.BatchNorm2d(16), nn.ReLU())
        self.pool = nn.MaxPool2d(3, 2, 1)
        self.a = nn.Sequential(nn.Conv2d(16, 32, 3, 2, 1, bias=False), nn.BatchNorm2d(32), nn.ReLU(),
                               nn.Conv2d(32, 32, 3, 1, 1, bias=False), nn.BatchNorm2d(32))
        self.down = nn.Sequential(nn.Conv2d(16, 32, 1, 2, bias=False), nn.BatchNorm2d(32))
        self.fc = nn.Linear(32, 10)

    def forward(self, x):
        x = self.pool(self.stem(x))
        x = torch.relu(self.a(x) + self.down(x))
        return self.fc(torch.flatten(x.mean((2, 3)), 1))


class RegNetY(nn.Module):
    """A RegNetY block: grouped 3x3 conv, squeeze-excite on the pooled vector (kept dims), SiLU and sigmoid."""

    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(16, 48, 1)
        self.b = nn.Conv2d(48, 48, 3, 1, 1, groups=6)
        self.fc1, self.fc2 = nn.Conv2d(48, 12, 1), nn.Conv2d(12, 48, 1)
        self.c = nn.Conv2d(48, 16, 1)

    def forward(self, x):
        y = nn.functional.silu(self.b(torch.relu(self.a(x))))
        s = torch.sigmoid(self.fc2(torch.relu(self.fc1(y.mean((2, 3), keepdim=True)))))
        return torch.relu(x + self.c(y * s)), y.amax(1)


class ConvNeXt(nn.Module):
    """A ConvNeXt block: depthwise 7x7, permute to channels-last, LayerNorm and MLP there, permute back."""

    def __init__(self):
        super().__init__()
        self.dw = nn.Conv2d(32, 32, 7, padding=3, groups=32)
        self.norm = nn.LayerNorm(32)
        self.fc1, self.fc2 = nn.Linear(32, 64), nn.Linear(64, 32)
        self.gamma = nn.Parameter(torch.rand(32))

    def forward(self, x):
        y = self.dw(x).permute(0, 2, 3, 1)
        y = self.fc2(nn.functional.gelu(self.fc1(self.norm(y)))) * self.gamma
        return x + y.permute(0, 3, 1, 2)


class PatchEmbed(nn.Module):
    """ViT's patch embedding: a strided conv, flattened to (N, C, HW) and transposed to tokens."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Conv2d(3, 24, 8, 8)

    def forward(self, x):
        return self.proj(x).flatten(2).transpose(1, 2)


class Reductions(nn.Module):
    """Reductions that leave a lower-rank layout (the batch mean), broadcast back against the channels-last value."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(4, 8, 3, padding=1)

    def forward(self, x):
        y = self.conv(x)
        return y * y.mean(0) + y.amax((2, 3), keepdim=True) - y.sum(2, keepdim=True)


CASES = {
    "reductions": (Reductions, (3, 4, 6, 5)),
    "resnet": (ResBlock, (1, 3, 32, 32)),
    "regnet_y": (RegNetY, (2, 16, 12, 12)),
    "convnext": (ConvNeXt, (1, 32, 10, 10)),
    "patch_embed": (PatchEmbed, (1, 3, 32, 32)),
}
# transposes the TPU form keeps: the input to channels-last, ConvNeXt's none (its own permutes become layouts),
# the outputs of the signature back to torch's layout
TRANSPOSES = {"reductions": None, "resnet": 1, "regnet_y": 2, "convnext": 2, "patch_embed": 1}


def _export(name):
    torch.manual_seed(0)
    cls, shape = CASES[name]
    model = cls().eval()
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):  # non-trivial statistics, so the folded BN is checked
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = model(x)
    return tpu_backend.export_program(converter.prepare(model, (x,))), x, want


def _call(bundle, exported, x):
    sig = bundle.signatures["serving_default"]
    ws = [bundle.weights[w].numpy() for w in sig.weight_names]
    return [torch.from_numpy(np.asarray(o)) for o in exported.call(ws, x.numpy())]


def _count(text, op):
    return len(re.findall(rf"stablehlo\.{op}\b", text))


@pytest.mark.parametrize("name", sorted(CASES))
def test_tpu_form_is_channels_last_and_the_model(name):
    bundle, x, want = _export(name)
    exported = bundle.signatures["serving_default"].exported
    want = list(want) if isinstance(want, tuple) else [want]
    tpu = for_platform(exported, "tpu").mlir_module()
    convs = re.findall(r"stablehlo\.convolution.*dim_numbers = (\[.*?\]x\[.*?\]->\[.*?\])", tpu)
    assert convs and all(d == "[b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f]" for d in convs), convs
    # distinct (shape, permutation) pairs: an input read twice is transposed once by the compiler's CSE
    transposes = set(re.findall(r"stablehlo\.transpose %\w+, (dims = \[[\d, ]+\]) : \(tensor<([\dx]+)x", tpu))
    activations = {t for t in transposes if not bundle_has_weight_shape(bundle, t[1])}
    if TRANSPOSES[name] is not None:
        assert len(activations) == TRANSPOSES[name], transposes
    for platform in ("tpu", "cpu"):  # each platform's program, run here
        got = _call(bundle, for_platform(exported, platform), x)
        for g, w in zip(got, want):
            assert rel_err(g, w) <= 1e-5, (platform, rel_err(g, w))
    # the CPU's form is torch's layout, as before: no NHWC convolution in it
    assert "[b, 0, 1, f]x" not in for_platform(exported, "cpu").mlir_module()


def bundle_has_weight_shape(bundle, dims: str) -> bool:
    """A transpose of a 4-d tensor shaped like one of the kernels, stored HWIO or read as torch's OIHW: the pair
    of transposes a stored kernel goes through, which XLA folds away."""
    shape = tuple(int(d) for d in dims.split("x"))
    stored = [tuple(t.shape) for t in bundle.weights.values()]
    oihw = [(s[3], s[2], s[0], s[1]) for n, s in zip(bundle.weights, stored) if n.endswith(".hwio")]
    return shape in stored or shape in oihw


def test_tpu_only_export_is_the_tpu_form():
    bundle, x, want = _export("resnet")
    prog = converter.prepare(ResBlock().eval(), (x,))
    alone = tpu_backend.export_program(prog, platforms=("tpu",)).signatures["serving_default"].exported
    text = alone.mlir_module()
    assert "stablehlo.case" not in text
    assert _count(text, "convolution") == _count(for_platform(bundle.signatures["serving_default"].exported,
                                                              "tpu").mlir_module(), "convolution")
