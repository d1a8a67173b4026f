"""A zoo of small, seeded, random-weight versions of well-known architectures.

Every entry is written from scratch in plain torch (no torchvision, no downloads)
and reproduces the op mix of the original model: the same layer types, the same
tensor manipulations (chunk/concat/shuffle, window partition, roll, relative
position gathers, RoPE, ...) and the same activation functions, only with tiny
widths, depths and inputs so that torch.export of each model takes well under 3 s
and its weights stay far under 1 MB.

API::

    ZOO: dict[str, ZooEntry]
    build(name) -> (module.eval(), sample_args)
    batch_like(args, n, seed=0) -> args with batch n (for dynamic-batch checks)

Weights are seeded (``torch.manual_seed`` inside each builder), and so are the
sample inputs (a ``torch.Generator``).  Normalisation layers get non-trivial
affine parameters, and BatchNorm layers get non-trivial running statistics
(calibrated on a seeded batch, then perturbed by random factors) so that BN
folding in a converter is really exercised.  Sample inputs have batch 1; the
dynamic-batch check traces with ``batch_like(args, 2)`` because a batch-1 sample
would be specialised by torch.export.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["ZooEntry", "ZOO", "WIDE", "build", "build_wide", "batch_like", "param_bytes", "NamedX", "WhisperFrames"]


@dataclass
class ZooEntry:
    name: str
    kind: str  # "cnn" or "transformer"
    build: Callable[[], tuple[nn.Module, tuple]]  # -> (module.eval(), sample_args)
    dynamic_batch: bool  # True if the model exports with dim 0 dynamic


# --------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _image(h: int = 64, w: int | None = None, seed: int = 1, batch: int = 1) -> tuple:
    return (torch.randn(batch, 3, h, w or h, generator=_gen(seed)),)


def batch_like(args: tuple, n: int, seed: int = 0) -> tuple:
    """Return ``args`` with batch size ``n`` (dim 0 of every tensor).

    Rows are drawn cyclically from the given batch; float tensors get a small
    seeded perturbation so that the rows differ, integer/bool tensors (token ids,
    attention masks) are copied unchanged.
    """
    g = _gen(1000 + seed)
    out = []
    for a in args:
        if not isinstance(a, torch.Tensor):
            out.append(a)
            continue
        idx = torch.arange(n) % a.shape[0]
        b = a[idx].clone()
        if b.is_floating_point():
            b = b + 0.1 * torch.randn(b.shape, generator=g, dtype=b.dtype)
        out.append(b)
    return tuple(out)


def param_bytes(m: nn.Module) -> int:
    seen, total = set(), 0
    for t in list(m.parameters()) + list(m.buffers()):
        if id(t) in seen:
            continue
        seen.add(id(t))
        total += t.numel() * t.element_size()
    return total


class NamedX(nn.Module):
    """``m`` called with its one input as the keyword ``x`` (the name dynamic_shapes and the sample kwargs use)."""

    def __init__(self, m: nn.Module):
        super().__init__()
        self.m = m

    def forward(self, x):
        return self.m(x)


class WhisperFrames(nn.Module):
    """transformers' WhisperEncoder (passed in) over the frames given: its forward refuses any length but
    2 * max_source_positions frames (it adds every position embedding), so this runs its convs and layers with the
    positions sliced to the frames' count, as shorter-than-30 s Whisper inference does."""

    def __init__(self, enc):
        super().__init__()
        self.enc = enc

    def forward(self, input_features):
        e = self.enc
        x = F.gelu(e.conv2(F.gelu(e.conv1(input_features)))).permute(0, 2, 1)
        x = x + e.embed_positions.weight[: x.shape[1]]
        for layer in e.layers:
            x = layer(x, None)
        return e.layer_norm(x)


class RMSNorm(nn.Module):
    """LLaMA / T5 RMSNorm written out: x * rsqrt(mean(x^2) + eps) * w (no mean, no bias)."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        variance = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
        x = x * torch.rsqrt(variance + self.eps)
        return self.weight * x


def _finalize(model: nn.Module, sample_args: tuple, seed: int, max_param_bytes: int = 1_000_000,
              condition: Callable[[nn.Module], None] | None = None) -> nn.Module:
    """Give norm layers non-trivial parameters / statistics and put the model in eval.

    ``max_param_bytes``: the zoo's size cap; the full-width variants (quantization tests, where
    weights must dominate the file) raise it. ``condition``: called on the model after the norm
    parameters are drawn and before BatchNorm statistics are calibrated (see _calm_mobilenet_v2).
    """
    g = _gen(10_000 + seed)

    def rand(shape, scale=1.0):
        return torch.randn(shape, generator=g) * scale

    def unif(shape, lo, hi):
        return lo + (hi - lo) * torch.rand(shape, generator=g)

    bns = []
    with torch.no_grad():
        for mod in model.modules():
            if isinstance(mod, nn.modules.batchnorm._BatchNorm):
                bns.append(mod)
                if mod.affine:
                    mod.weight.copy_(unif(mod.weight.shape, 0.5, 1.5))
                    mod.bias.copy_(rand(mod.bias.shape, 0.1))
            elif isinstance(mod, (nn.LayerNorm, nn.GroupNorm)):
                if getattr(mod, "weight", None) is not None:
                    mod.weight.copy_(1.0 + rand(mod.weight.shape, 0.2))
                if getattr(mod, "bias", None) is not None:
                    mod.bias.copy_(rand(mod.bias.shape, 0.1))
            elif isinstance(mod, RMSNorm):
                mod.weight.copy_(1.0 + rand(mod.weight.shape, 0.2))
        if condition is not None:
            condition(model)

        if bns:
            # Calibrate running stats (cumulative average over one seeded batch) so that
            # activations stay O(1) through the network, then perturb them randomly:
            # running_mean != 0 and running_var != 1 everywhere.
            momenta = [bn.momentum for bn in bns]
            for bn in bns:
                bn.reset_running_stats()
                bn.momentum = None
            model.train()
            torch.manual_seed(seed)
            model(*batch_like(sample_args, 4, seed=seed))
            for bn, mom in zip(bns, momenta):
                bn.momentum = mom
                var = bn.running_var
                bn.running_mean.add_(0.2 * var.sqrt() * rand(var.shape))
                bn.running_var.mul_(unif(var.shape, 0.6, 1.6))
                assert bool((bn.running_var > 0).all())
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    assert param_bytes(model) < max_param_bytes, (type(model).__name__, param_bytes(model))
    return model


def _cap(wide: bool) -> int:
    """The parameter-size cap for _finalize: the zoo's 1 MB, or 64 MB for a widened variant."""
    return 64_000_000 if wide else 1_000_000


def _make_divisible(v: float, divisor: int = 8, min_value: int | None = None) -> int:
    if min_value is None:
        min_value = divisor
    new_v = max(min_value, int(v + divisor / 2) // divisor * divisor)
    if new_v < 0.9 * v:
        new_v += divisor
    return new_v


class ConvBNAct(nn.Sequential):
    """torchvision's Conv2dNormActivation: conv (no bias) -> BN -> optional activation."""

    def __init__(self, cin, cout, k=3, stride=1, groups=1, act=nn.ReLU, dilation=1):
        pad = (k - 1) // 2 * dilation
        layers = [
            nn.Conv2d(cin, cout, k, stride, pad, dilation=dilation, groups=groups, bias=False),
            nn.BatchNorm2d(cout),
        ]
        if act is not None:
            layers.append(act(inplace=True))
        super().__init__(*layers)


class SqueezeExcitation(nn.Module):
    """torchvision.ops.SqueezeExcitation: avgpool -> 1x1 conv -> act -> 1x1 conv -> gate."""

    def __init__(self, cin, csq, activation=nn.ReLU, scale_activation=nn.Sigmoid):
        super().__init__()
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc1 = nn.Conv2d(cin, csq, 1)
        self.fc2 = nn.Conv2d(csq, cin, 1)
        self.activation = activation()
        self.scale_activation = scale_activation()

    def forward(self, x):
        scale = self.avgpool(x)
        scale = self.fc1(scale)
        scale = self.activation(scale)
        scale = self.fc2(scale)
        scale = self.scale_activation(scale)
        return scale * x


# --------------------------------------------------------------------------------------
# ResNet-18
# --------------------------------------------------------------------------------------


class BasicBlock(nn.Module):
    def __init__(self, inplanes, planes, stride=1, downsample=None, dilation=1):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, dilation, dilation=dilation, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, dilation, dilation=dilation, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


def _res_layer(inplanes, planes, blocks, stride=1, dilation=1):
    downsample = None
    if stride != 1 or inplanes != planes:
        downsample = nn.Sequential(
            nn.Conv2d(inplanes, planes, 1, stride, bias=False), nn.BatchNorm2d(planes)
        )
    layers = [BasicBlock(inplanes, planes, stride, downsample, dilation)]
    layers += [BasicBlock(planes, planes, dilation=dilation) for _ in range(1, blocks)]
    return nn.Sequential(*layers)


class ResNet(nn.Module):
    def __init__(self, widths=(8, 16, 32, 64), blocks=(2, 2, 2, 2), num_classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, widths[0], 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(widths[0])
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        self.layer1 = _res_layer(widths[0], widths[0], blocks[0])
        self.layer2 = _res_layer(widths[0], widths[1], blocks[1], 2)
        self.layer3 = _res_layer(widths[1], widths[2], blocks[2], 2)
        self.layer4 = _res_layer(widths[2], widths[3], blocks[3], 2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(widths[3], num_classes)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        x = self.avgpool(x)
        x = torch.flatten(x, 1)
        return self.fc(x)


def build_resnet18(widths=(8, 16, 32, 64), image: int = 64):
    """``widths``: the four stages' channels (torchvision: 64, 128, 256, 512)."""
    torch.manual_seed(0)
    args = _image(image)
    model = ResNet(tuple(widths))
    return _finalize(model, args, 0, _cap(tuple(widths) != (8, 16, 32, 64))), args


# --------------------------------------------------------------------------------------
# MobileNetV2
# --------------------------------------------------------------------------------------


class InvertedResidualV2(nn.Module):
    def __init__(self, inp, oup, stride, expand_ratio):
        super().__init__()
        hidden = int(round(inp * expand_ratio))
        self.use_res_connect = stride == 1 and inp == oup
        layers = []
        if expand_ratio != 1:
            layers.append(ConvBNAct(inp, hidden, 1, act=nn.ReLU6))
        layers += [
            ConvBNAct(hidden, hidden, 3, stride, groups=hidden, act=nn.ReLU6),
            nn.Conv2d(hidden, oup, 1, 1, 0, bias=False),
            nn.BatchNorm2d(oup),
        ]
        self.conv = nn.Sequential(*layers)

    def forward(self, x):
        if self.use_res_connect:
            return x + self.conv(x)
        return self.conv(x)


class MobileNetV2(nn.Module):
    # t, c, n, s
    SETTING = [[1, 8, 1, 1], [6, 8, 2, 2], [6, 16, 3, 2], [4, 24, 2, 2], [4, 32, 1, 1]]
    # torchvision's (the paper's) table, used with width_mult
    FULL_SETTING = [[1, 16, 1, 1], [6, 24, 2, 2], [6, 32, 3, 2], [6, 64, 4, 2], [6, 96, 3, 1], [6, 160, 3, 2],
                    [6, 320, 1, 1]]

    def __init__(self, num_classes=10, last_channel=64, width_mult=None):
        """``width_mult`` None: the zoo's tiny table; a float: torchvision's MobileNetV2 at that width
        (1.0: 32 -> 320 channels, 1280 before the classifier; channels rounded to multiples of 8)."""
        super().__init__()
        cin, setting = 16, self.SETTING
        if width_mult is not None:
            cin = _make_divisible(32 * width_mult)
            last_channel = _make_divisible(1280 * max(1.0, width_mult))
            setting = [[t, _make_divisible(c * width_mult), n, s] for t, c, n, s in self.FULL_SETTING]
        features = [ConvBNAct(3, cin, 3, 2, act=nn.ReLU6)]
        for t, c, n, s in setting:
            for i in range(n):
                features.append(InvertedResidualV2(cin, c, s if i == 0 else 1, t))
                cin = c
        features.append(ConvBNAct(cin, last_channel, 1, act=nn.ReLU6))
        self.features = nn.Sequential(*features)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(last_channel, num_classes))

    def forward(self, x):
        x = self.features(x)
        x = F.adaptive_avg_pool2d(x, (1, 1))
        x = torch.flatten(x, 1)
        return self.classifier(x)


def _calm_mobilenet_v2(model: nn.Module, residual_gain: float = 0.15, act_shift: float = 2.5) -> None:
    """Make a random full-depth MobileNetV2 as insensitive to small perturbations as a trained one.

    With BatchNorm re-centring every layer, a random ReLU6 network is chaotic: at width 1.0 (1000
    classes, 64x64) a 1e-3 input perturbation comes out as a 3.8% change of the logits, float16
    weights alone move them by 2.5% and int8 weights flip 30% of the top-1 (torch, before any
    conversion), which says nothing about a converter. Two changes to the seeded init, applied
    before the BatchNorm statistics are calibrated, make it behave: each residual branch's last
    BN scale times ``residual_gain`` (the zero-init-residual idea: blocks start near identity) and
    the activations' BN shifted by ``act_shift`` so ReLU6 passes most units. Then: 0.03%, 0.17%
    and 0.5% (the float model still predicts 5 different classes over 200 random inputs).
    """
    for m in model.modules():
        if isinstance(m, InvertedResidualV2) and m.use_res_connect:
            m.conv[-1].weight.mul_(residual_gain)
        if isinstance(m, ConvBNAct) and len(m) == 3:
            m[1].bias.add_(act_shift)


def build_mobilenet_v2(width_mult: float | None = None, image: int = 64, num_classes: int = 10, **calm):
    """``width_mult``: see MobileNetV2 (1.0 with 10 classes: 2.2M parameters); with it the init is
    conditioned by _calm_mobilenet_v2 (``calm``: its keyword arguments)."""
    torch.manual_seed(0)
    args = _image(image)
    model = MobileNetV2(num_classes, width_mult=width_mult)
    condition = None if width_mult is None else (lambda m: _calm_mobilenet_v2(m, **calm))
    return _finalize(model, args, 1, _cap(width_mult is not None), condition), args


# --------------------------------------------------------------------------------------
# MobileNetV3 (+ LR-ASPP)
# --------------------------------------------------------------------------------------


class InvertedResidualV3(nn.Module):
    def __init__(self, cin, k, exp, cout, use_se, act, stride, dilation=1):
        super().__init__()
        self.use_res_connect = stride == 1 and cin == cout
        act_layer = nn.Hardswish if act == "HS" else nn.ReLU
        layers = []
        if exp != cin:
            layers.append(ConvBNAct(cin, exp, 1, act=act_layer))
        stride = 1 if dilation > 1 else stride
        layers.append(ConvBNAct(exp, exp, k, stride, groups=exp, act=act_layer, dilation=dilation))
        if use_se:
            layers.append(SqueezeExcitation(exp, _make_divisible(exp // 4, 8), scale_activation=nn.Hardsigmoid))
        layers.append(ConvBNAct(exp, cout, 1, act=None))
        self.block = nn.Sequential(*layers)
        self.stride = stride

    def forward(self, x):
        result = self.block(x)
        if self.use_res_connect:
            result += x
        return result


# in, kernel, expanded, out, SE, activation, stride, dilation
_V3_CFG = [
    (16, 3, 16, 16, True, "RE", 2, 1),
    (16, 3, 32, 24, False, "RE", 2, 1),
    (24, 3, 48, 24, False, "RE", 1, 1),
    (24, 5, 64, 32, True, "HS", 2, 1),
    (32, 5, 64, 32, True, "HS", 1, 1),
    (32, 5, 64, 48, True, "HS", 1, 1),
]


def _v3_features(dilated=False, last_channel=64):
    layers = [ConvBNAct(3, 16, 3, 2, act=nn.Hardswish)]
    for i, (cin, k, exp, cout, se, act, s, d) in enumerate(_V3_CFG):
        if dilated and i >= 4:  # like torchvision's dilated=True: last stage keeps stride 16
            d = 2
        layers.append(InvertedResidualV3(cin, k, exp, cout, se, act, s, d))
    layers.append(ConvBNAct(_V3_CFG[-1][3], last_channel, 1, act=nn.Hardswish))
    return nn.Sequential(*layers)


class MobileNetV3(nn.Module):
    def __init__(self, num_classes=10, last_channel=64, hidden=96):
        super().__init__()
        self.features = _v3_features(last_channel=last_channel)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(
            nn.Linear(last_channel, hidden),
            nn.Hardswish(inplace=True),
            nn.Dropout(0.2, inplace=True),
            nn.Linear(hidden, num_classes),
        )

    def forward(self, x):
        x = self.avgpool(self.features(x))
        return self.classifier(torch.flatten(x, 1))


def build_mobilenet_v3():
    torch.manual_seed(0)
    args = _image(64)
    return _finalize(MobileNetV3(), args, 2), args


class LRASPP(nn.Module):
    """torchvision lraspp_mobilenet_v3_large head on a tiny dilated MobileNetV3 backbone."""

    def __init__(self, num_classes=5, inter_channels=32):
        super().__init__()
        self.backbone = _v3_features(dilated=True)
        self.low_idx = 3  # last block at output stride 8
        low_ch, high_ch = _V3_CFG[self.low_idx - 1][3], 64
        self.cbr = nn.Sequential(
            nn.Conv2d(high_ch, inter_channels, 1, bias=False),
            nn.BatchNorm2d(inter_channels),
            nn.ReLU(inplace=True),
        )
        self.scale = nn.Sequential(
            nn.AdaptiveAvgPool2d(1),
            nn.Conv2d(high_ch, inter_channels, 1, bias=False),
            nn.Sigmoid(),
        )
        self.low_classifier = nn.Conv2d(low_ch, num_classes, 1)
        self.high_classifier = nn.Conv2d(inter_channels, num_classes, 1)

    def forward(self, input):
        x = input
        low = None
        for i, layer in enumerate(self.backbone):
            x = layer(x)
            if i == self.low_idx:
                low = x
        high = x
        x = self.cbr(high)
        s = self.scale(high)
        x = x * s
        x = F.interpolate(x, size=low.shape[-2:], mode="bilinear", align_corners=False)
        out = self.low_classifier(low) + self.high_classifier(x)
        return F.interpolate(out, size=input.shape[-2:], mode="bilinear", align_corners=False)


def build_lraspp():
    torch.manual_seed(0)
    args = _image(64)
    return _finalize(LRASPP(), args, 3), args


# --------------------------------------------------------------------------------------
# EfficientNet (B0-like)
# --------------------------------------------------------------------------------------


class MBConv(nn.Module):
    def __init__(self, expand_ratio, k, stride, cin, cout):
        super().__init__()
        self.use_res_connect = stride == 1 and cin == cout
        exp = _make_divisible(cin * expand_ratio, 8)
        layers = []
        if exp != cin:
            layers.append(ConvBNAct(cin, exp, 1, act=nn.SiLU))
        layers.append(ConvBNAct(exp, exp, k, stride, groups=exp, act=nn.SiLU))
        layers.append(SqueezeExcitation(exp, max(1, cin // 4), activation=nn.SiLU))
        layers.append(ConvBNAct(exp, cout, 1, act=None))
        self.block = nn.Sequential(*layers)

    def forward(self, x):
        result = self.block(x)
        if self.use_res_connect:
            result = result + x  # stochastic depth is the identity in eval
        return result


class EfficientNet(nn.Module):
    # expand_ratio, kernel, stride, in, out, layers
    SETTING = [(1, 3, 1, 16, 8, 1), (4, 3, 2, 8, 16, 2), (4, 5, 2, 16, 16, 2), (3, 3, 2, 16, 24, 1),
               (2, 5, 1, 24, 32, 1)]

    def __init__(self, num_classes=10, last_channel=64):
        super().__init__()
        layers = [ConvBNAct(3, 16, 3, 2, act=nn.SiLU)]
        for e, k, s, cin, cout, n in self.SETTING:
            for i in range(n):
                layers.append(MBConv(e, k, s if i == 0 else 1, cin if i == 0 else cout, cout))
        layers.append(ConvBNAct(self.SETTING[-1][4], last_channel, 1, act=nn.SiLU))
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(nn.Dropout(0.2, inplace=True), nn.Linear(last_channel, num_classes))

    def forward(self, x):
        x = self.avgpool(self.features(x))
        return self.classifier(torch.flatten(x, 1))


def build_efficientnet():
    torch.manual_seed(0)
    args = _image(64)
    return _finalize(EfficientNet(), args, 4), args


# --------------------------------------------------------------------------------------
# ShuffleNetV2
# --------------------------------------------------------------------------------------


def channel_shuffle(x, groups: int):
    batchsize, num_channels, height, width = x.size()
    channels_per_group = num_channels // groups
    x = x.view(batchsize, groups, channels_per_group, height, width)
    x = torch.transpose(x, 1, 2).contiguous()
    return x.view(batchsize, num_channels, height, width)


class ShuffleUnit(nn.Module):
    def __init__(self, inp, oup, stride):
        super().__init__()
        self.stride = stride
        bf = oup // 2
        if stride > 1:
            self.branch1 = nn.Sequential(
                nn.Conv2d(inp, inp, 3, stride, 1, groups=inp, bias=False),
                nn.BatchNorm2d(inp),
                nn.Conv2d(inp, bf, 1, bias=False),
                nn.BatchNorm2d(bf),
                nn.ReLU(inplace=True),
            )
        else:
            self.branch1 = nn.Sequential()
        self.branch2 = nn.Sequential(
            nn.Conv2d(inp if stride > 1 else bf, bf, 1, bias=False),
            nn.BatchNorm2d(bf),
            nn.ReLU(inplace=True),
            nn.Conv2d(bf, bf, 3, stride, 1, groups=bf, bias=False),
            nn.BatchNorm2d(bf),
            nn.Conv2d(bf, bf, 1, bias=False),
            nn.BatchNorm2d(bf),
            nn.ReLU(inplace=True),
        )

    def forward(self, x):
        if self.stride == 1:
            x1, x2 = x.chunk(2, dim=1)
            out = torch.cat((x1, self.branch2(x2)), dim=1)
        else:
            out = torch.cat((self.branch1(x), self.branch2(x)), dim=1)
        return channel_shuffle(out, 2)


class ShuffleNetV2(nn.Module):
    def __init__(self, repeats=(2, 3, 2), channels=(16, 32, 48, 64, 64), num_classes=10):
        super().__init__()
        self.conv1 = nn.Sequential(
            nn.Conv2d(3, channels[0], 3, 2, 1, bias=False), nn.BatchNorm2d(channels[0]), nn.ReLU(inplace=True)
        )
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        cin = channels[0]
        stages = []
        for n, cout in zip(repeats, channels[1:4]):
            units = [ShuffleUnit(cin, cout, 2)] + [ShuffleUnit(cout, cout, 1) for _ in range(n - 1)]
            stages.append(nn.Sequential(*units))
            cin = cout
        self.stage2, self.stage3, self.stage4 = stages
        self.conv5 = nn.Sequential(
            nn.Conv2d(cin, channels[4], 1, bias=False), nn.BatchNorm2d(channels[4]), nn.ReLU(inplace=True)
        )
        self.fc = nn.Linear(channels[4], num_classes)

    def forward(self, x):
        x = self.maxpool(self.conv1(x))
        x = self.stage4(self.stage3(self.stage2(x)))
        x = self.conv5(x)
        x = x.mean([2, 3])
        return self.fc(x)


def build_shufflenet_v2():
    torch.manual_seed(0)
    args = _image(64)
    return _finalize(ShuffleNetV2(), args, 5), args


# --------------------------------------------------------------------------------------
# SqueezeNet 1.1
# --------------------------------------------------------------------------------------


class Fire(nn.Module):
    def __init__(self, inplanes, squeeze, e1, e3):
        super().__init__()
        self.squeeze = nn.Conv2d(inplanes, squeeze, 1)
        self.squeeze_activation = nn.ReLU(inplace=True)
        self.expand1x1 = nn.Conv2d(squeeze, e1, 1)
        self.expand1x1_activation = nn.ReLU(inplace=True)
        self.expand3x3 = nn.Conv2d(squeeze, e3, 3, padding=1)
        self.expand3x3_activation = nn.ReLU(inplace=True)

    def forward(self, x):
        x = self.squeeze_activation(self.squeeze(x))
        return torch.cat(
            [self.expand1x1_activation(self.expand1x1(x)), self.expand3x3_activation(self.expand3x3(x))], 1
        )


class SqueezeNet(nn.Module):
    def __init__(self, num_classes=10):
        super().__init__()
        # Deviation from squeezenet1_1: the stem conv has padding=1.  With it, every
        # ceil_mode max-pool sees an even input (32, 16, 8), where ceil_mode really
        # changes the output size (at 224x224 the original never needs the ceil).
        self.features = nn.Sequential(
            nn.Conv2d(3, 32, 3, 2, 1),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(3, 2, ceil_mode=True),
            Fire(32, 8, 16, 16),
            Fire(32, 8, 16, 16),
            nn.MaxPool2d(3, 2, ceil_mode=True),
            Fire(32, 12, 24, 24),
            Fire(48, 12, 24, 24),
            nn.MaxPool2d(3, 2, ceil_mode=True),
            Fire(48, 16, 32, 32),
            Fire(64, 16, 32, 32),
        )
        self.classifier = nn.Sequential(
            nn.Dropout(0.5), nn.Conv2d(64, num_classes, 1), nn.ReLU(inplace=True), nn.AdaptiveAvgPool2d((1, 1))
        )

    def forward(self, x):
        x = self.classifier(self.features(x))
        return torch.flatten(x, 1)


def build_squeezenet():
    torch.manual_seed(0)
    args = _image(64)
    return _finalize(SqueezeNet(), args, 6), args


# --------------------------------------------------------------------------------------
# RegNetY
# --------------------------------------------------------------------------------------


class ResBottleneckBlockY(nn.Module):
    def __init__(self, w_in, w_out, stride, group_width=8, bottleneck_multiplier=1.0, se_ratio=0.25):
        super().__init__()
        self.proj = None
        if w_in != w_out or stride != 1:
            self.proj = ConvBNAct(w_in, w_out, 1, stride, act=None)
        w_b = int(round(w_out * bottleneck_multiplier))
        g = w_b // group_width
        self.f = nn.Sequential(
            ConvBNAct(w_in, w_b, 1, act=nn.ReLU),
            ConvBNAct(w_b, w_b, 3, stride, groups=g, act=nn.ReLU),
            SqueezeExcitation(w_b, int(round(se_ratio * w_in)), activation=nn.ReLU),
            ConvBNAct(w_b, w_out, 1, act=None),
        )
        self.activation = nn.ReLU(inplace=True)

    def forward(self, x):
        if self.proj is not None:
            x = self.proj(x) + self.f(x)
        else:
            x = x + self.f(x)
        return self.activation(x)


class RegNetY(nn.Module):
    def __init__(self, widths=(16, 32, 64), depths=(1, 2, 2), group_width=8, num_classes=10):
        super().__init__()
        self.stem = ConvBNAct(3, 16, 3, 2, act=nn.ReLU)
        blocks, cin = [], 16
        for w, d in zip(widths, depths):
            stage = [ResBottleneckBlockY(cin if i == 0 else w, w, 2 if i == 0 else 1, group_width) for i in range(d)]
            blocks.append(nn.Sequential(*stage))
            cin = w
        self.trunk_output = nn.Sequential(*blocks)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x):
        x = self.avgpool(self.trunk_output(self.stem(x)))
        return self.fc(x.flatten(start_dim=1))


def build_regnet():
    torch.manual_seed(0)
    args = _image(64)
    return _finalize(RegNetY(), args, 7), args


# --------------------------------------------------------------------------------------
# ConvNeXt
# --------------------------------------------------------------------------------------


class Permute(nn.Module):
    def __init__(self, dims):
        super().__init__()
        self.dims = list(dims)

    def forward(self, x):
        return torch.permute(x, self.dims)


class LayerNorm2d(nn.LayerNorm):
    def forward(self, x):
        x = x.permute(0, 2, 3, 1)
        x = F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        return x.permute(0, 3, 1, 2)


class CNBlock(nn.Module):
    def __init__(self, dim, layer_scale=1e-6):
        super().__init__()
        self.block = nn.Sequential(
            nn.Conv2d(dim, dim, 7, padding=3, groups=dim, bias=True),
            Permute([0, 2, 3, 1]),
            nn.LayerNorm(dim, eps=1e-6),
            nn.Linear(dim, 4 * dim, bias=True),
            nn.GELU(),
            nn.Linear(4 * dim, dim, bias=True),
            Permute([0, 3, 1, 2]),
        )
        self.layer_scale = nn.Parameter(torch.ones(dim, 1, 1) * layer_scale)

    def forward(self, x):
        result = self.layer_scale * self.block(x)
        result += x  # stochastic depth is the identity in eval
        return result


class ConvNeXt(nn.Module):
    def __init__(self, dims=(16, 32, 64), depths=(1, 2, 1), num_classes=10):
        super().__init__()
        layers = [nn.Sequential(nn.Conv2d(3, dims[0], 4, 4), LayerNorm2d(dims[0], eps=1e-6))]
        for i, (d, n) in enumerate(zip(dims, depths)):
            layers.append(nn.Sequential(*[CNBlock(d) for _ in range(n)]))
            if i + 1 < len(dims):
                layers.append(nn.Sequential(LayerNorm2d(d, eps=1e-6), nn.Conv2d(d, dims[i + 1], 2, 2)))
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(LayerNorm2d(dims[-1], eps=1e-6), nn.Flatten(1),
                                        nn.Linear(dims[-1], num_classes))

    def forward(self, x):
        return self.classifier(self.avgpool(self.features(x)))


def build_convnext():
    torch.manual_seed(0)
    model = ConvNeXt()
    g = _gen(100)
    with torch.no_grad():  # real layer scales are learned; 1e-6 would hide the blocks
        for m in model.modules():
            if isinstance(m, CNBlock):
                m.layer_scale.copy_(0.1 + 0.9 * torch.rand(m.layer_scale.shape, generator=g))
    args = _image(64)
    return _finalize(model, args, 8), args


# --------------------------------------------------------------------------------------
# DenseNet
# --------------------------------------------------------------------------------------


class _DenseLayer(nn.Module):
    def __init__(self, cin, growth, bn_size):
        super().__init__()
        self.norm1 = nn.BatchNorm2d(cin)
        self.relu1 = nn.ReLU(inplace=True)
        self.conv1 = nn.Conv2d(cin, bn_size * growth, 1, bias=False)
        self.norm2 = nn.BatchNorm2d(bn_size * growth)
        self.relu2 = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(bn_size * growth, growth, 3, padding=1, bias=False)

    def forward(self, inputs: list[torch.Tensor]):
        concated = torch.cat(inputs, 1)
        bottleneck = self.conv1(self.relu1(self.norm1(concated)))
        return self.conv2(self.relu2(self.norm2(bottleneck)))


class _DenseBlock(nn.ModuleDict):
    def __init__(self, n, cin, growth, bn_size):
        super().__init__()
        for i in range(n):
            self[f"denselayer{i + 1}"] = _DenseLayer(cin + i * growth, growth, bn_size)

    def forward(self, init_features):
        features = [init_features]
        for layer in self.values():
            features.append(layer(features))
        return torch.cat(features, 1)


class _Transition(nn.Sequential):
    def __init__(self, cin, cout):
        super().__init__()
        self.norm = nn.BatchNorm2d(cin)
        self.relu = nn.ReLU(inplace=True)
        self.conv = nn.Conv2d(cin, cout, 1, bias=False)
        self.pool = nn.AvgPool2d(2, 2)


class DenseNet(nn.Module):
    def __init__(self, growth=8, blocks=(2, 3, 2), init_features=16, bn_size=4, num_classes=10):
        super().__init__()
        self.features = nn.Sequential()
        self.features.add_module("conv0", nn.Conv2d(3, init_features, 7, 2, 3, bias=False))
        self.features.add_module("norm0", nn.BatchNorm2d(init_features))
        self.features.add_module("relu0", nn.ReLU(inplace=True))
        self.features.add_module("pool0", nn.MaxPool2d(3, 2, 1))
        c = init_features
        for i, n in enumerate(blocks):
            self.features.add_module(f"denseblock{i + 1}", _DenseBlock(n, c, growth, bn_size))
            c += n * growth
            if i != len(blocks) - 1:
                self.features.add_module(f"transition{i + 1}", _Transition(c, c // 2))
                c //= 2
        self.features.add_module("norm5", nn.BatchNorm2d(c))
        self.classifier = nn.Linear(c, num_classes)

    def forward(self, x):
        out = F.relu(self.features(x), inplace=True)
        out = F.adaptive_avg_pool2d(out, (1, 1))
        return self.classifier(torch.flatten(out, 1))


def build_densenet():
    torch.manual_seed(0)
    args = _image(64)
    return _finalize(DenseNet(), args, 9), args


# --------------------------------------------------------------------------------------
# DeepLabV3 (ASPP) on a small dilated ResNet backbone
# --------------------------------------------------------------------------------------


class ASPPPooling(nn.Sequential):
    def __init__(self, cin, cout):
        super().__init__(nn.AdaptiveAvgPool2d(1), nn.Conv2d(cin, cout, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU())

    def forward(self, x):
        size = x.shape[-2:]
        for mod in self:
            x = mod(x)
        return F.interpolate(x, size=size, mode="bilinear", align_corners=False)


class ASPP(nn.Module):
    def __init__(self, cin, rates, cout=32):
        super().__init__()
        mods = [nn.Sequential(nn.Conv2d(cin, cout, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU())]
        for r in rates:
            mods.append(
                nn.Sequential(nn.Conv2d(cin, cout, 3, padding=r, dilation=r, bias=False), nn.BatchNorm2d(cout),
                              nn.ReLU())
            )
        mods.append(ASPPPooling(cin, cout))
        self.convs = nn.ModuleList(mods)
        self.project = nn.Sequential(
            nn.Conv2d(len(mods) * cout, cout, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(), nn.Dropout(0.5)
        )

    def forward(self, x):
        return self.project(torch.cat([conv(x) for conv in self.convs], dim=1))


class DeepLabV3(nn.Module):
    def __init__(self, num_classes=5):
        super().__init__()
        # ResNet backbone with replace_stride_with_dilation=[False, True, True] (output stride 8)
        self.backbone = nn.Sequential(
            nn.Conv2d(3, 16, 7, 2, 3, bias=False),
            nn.BatchNorm2d(16),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(3, 2, 1),
            _res_layer(16, 16, 1),
            _res_layer(16, 32, 1, stride=2),
            _res_layer(32, 48, 1, dilation=2),
            _res_layer(48, 64, 1, dilation=4),
        )
        self.classifier = nn.Sequential(
            ASPP(64, (2, 4, 6)),
            nn.Conv2d(32, 32, 3, padding=1, bias=False),
            nn.BatchNorm2d(32),
            nn.ReLU(),
            nn.Conv2d(32, num_classes, 1),
        )

    def forward(self, x):
        input_shape = x.shape[-2:]
        features = self.backbone(x)
        x = self.classifier(features)
        return F.interpolate(x, size=input_shape, mode="bilinear", align_corners=False)


def build_deeplabv3():
    torch.manual_seed(0)
    args = _image(64)
    return _finalize(DeepLabV3(), args, 10), args


# --------------------------------------------------------------------------------------
# ViT
# --------------------------------------------------------------------------------------


class Attention(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        x = F.scaled_dot_product_attention(q, k, v)
        x = x.transpose(1, 2).reshape(B, N, C)
        return self.proj(x)


class EncoderBlock(nn.Module):
    def __init__(self, dim, heads, mlp_dim):
        super().__init__()
        self.ln_1 = nn.LayerNorm(dim, eps=1e-6)
        self.self_attention = Attention(dim, heads)
        self.dropout = nn.Dropout(0.0)
        self.ln_2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(dim, mlp_dim), nn.GELU(), nn.Dropout(0.0), nn.Linear(mlp_dim, dim),
                                 nn.Dropout(0.0))

    def forward(self, input):
        x = self.dropout(self.self_attention(self.ln_1(input)))
        x = x + input
        return x + self.mlp(self.ln_2(x))


class ViT(nn.Module):
    def __init__(self, image=32, patch=8, dim=64, depth=2, heads=4, mlp_dim=128, num_classes=10):
        super().__init__()
        self.patch, self.dim = patch, dim
        self.conv_proj = nn.Conv2d(3, dim, patch, patch)
        seq = (image // patch) ** 2 + 1
        self.class_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embedding = nn.Parameter(torch.empty(1, seq, dim).normal_(std=0.02))
        self.dropout = nn.Dropout(0.0)
        self.layers = nn.Sequential(*[EncoderBlock(dim, heads, mlp_dim) for _ in range(depth)])
        self.ln = nn.LayerNorm(dim, eps=1e-6)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, x):
        n = x.shape[0]
        x = self.conv_proj(x)  # (n, dim, h, w)
        x = x.reshape(n, self.dim, -1).permute(0, 2, 1)
        cls = self.class_token.expand(n, -1, -1)
        x = torch.cat([cls, x], dim=1)
        x = self.dropout(x + self.pos_embedding)
        x = self.ln(self.layers(x))
        return self.head(x[:, 0])


def build_vit(image: int = 32, patch: int = 8, dim: int = 64, depth: int = 2, heads: int = 4, mlp_dim: int = 128,
              cls_std: float = 0.5, pos_std: float = 0.5):
    """ViT-Ti's width: dim 192, mlp_dim 768 (3 heads, 12 layers, 16x16 patches at 224).
    ``cls_std`` / ``pos_std``: the class token's / position embeddings' scale (torchvision's init:
    0 / 0.02)."""
    torch.manual_seed(0)
    model = ViT(image, patch, dim, depth, heads, mlp_dim)
    with torch.no_grad():
        model.class_token.normal_(std=cls_std)
        model.pos_embedding.normal_(std=pos_std)
    args = _image(image)
    return _finalize(model, args, 11, _cap((dim, depth, mlp_dim) != (64, 2, 128))), args


# --------------------------------------------------------------------------------------
# Swin Transformer (v1)
# --------------------------------------------------------------------------------------


def window_partition(x, ws: int):
    B, H, W, C = x.shape
    x = x.view(B, H // ws, ws, W // ws, ws, C)
    return x.permute(0, 1, 3, 2, 4, 5).contiguous().view(-1, ws, ws, C)


def window_reverse(windows, ws: int, H: int, W: int):
    C = windows.shape[-1]
    x = windows.view(-1, H // ws, W // ws, ws, ws, C)
    return x.permute(0, 1, 3, 2, 4, 5).contiguous().view(-1, H, W, C)


class WindowAttention(nn.Module):
    def __init__(self, dim, ws, heads):
        super().__init__()
        self.ws, self.heads = ws, heads
        self.scale = (dim // heads) ** -0.5
        self.relative_position_bias_table = nn.Parameter(torch.zeros((2 * ws - 1) * (2 * ws - 1), heads))
        coords = torch.stack(torch.meshgrid([torch.arange(ws), torch.arange(ws)], indexing="ij"))
        coords_flatten = torch.flatten(coords, 1)
        rel = (coords_flatten[:, :, None] - coords_flatten[:, None, :]).permute(1, 2, 0).contiguous()
        rel[:, :, 0] += ws - 1
        rel[:, :, 1] += ws - 1
        rel[:, :, 0] *= 2 * ws - 1
        self.register_buffer("relative_position_index", rel.sum(-1))
        self.qkv = nn.Linear(dim, dim * 3)
        self.proj = nn.Linear(dim, dim)
        self.softmax = nn.Softmax(dim=-1)

    def forward(self, x, mask=None):
        B_, N, C = x.shape
        qkv = self.qkv(x).reshape(B_, N, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        q = q * self.scale
        attn = q @ k.transpose(-2, -1)
        bias = self.relative_position_bias_table[self.relative_position_index.view(-1)].view(N, N, -1)
        bias = bias.permute(2, 0, 1).contiguous()
        attn = attn + bias.unsqueeze(0)
        if mask is not None:
            nW = mask.shape[0]
            attn = attn.view(-1, nW, self.heads, N, N) + mask.unsqueeze(1).unsqueeze(0)
            attn = attn.view(-1, self.heads, N, N)
        attn = self.softmax(attn)
        x = (attn @ v).transpose(1, 2).reshape(B_, N, C)
        return self.proj(x)


class SwinBlock(nn.Module):
    def __init__(self, dim, resolution, heads, ws=4, shift=0, mlp_ratio=2.0):
        super().__init__()
        self.H, self.W = resolution
        if min(resolution) <= ws:  # as in the reference: no shifting when one window covers all
            shift, ws = 0, min(resolution)
        self.ws, self.shift = ws, shift
        self.norm1 = nn.LayerNorm(dim)
        self.attn = WindowAttention(dim, ws, heads)
        self.norm2 = nn.LayerNorm(dim)
        hidden = int(dim * mlp_ratio)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Dropout(0.0), nn.Linear(hidden, dim),
                                 nn.Dropout(0.0))
        if shift > 0:
            img_mask = torch.zeros((1, self.H, self.W, 1))
            slices = (slice(0, -ws), slice(-ws, -shift), slice(-shift, None))
            cnt = 0
            for h in slices:
                for w in slices:
                    img_mask[:, h, w, :] = cnt
                    cnt += 1
            mw = window_partition(img_mask, ws).view(-1, ws * ws)
            attn_mask = mw.unsqueeze(1) - mw.unsqueeze(2)
            attn_mask = attn_mask.masked_fill(attn_mask != 0, -100.0).masked_fill(attn_mask == 0, 0.0)
        else:
            attn_mask = None
        self.register_buffer("attn_mask", attn_mask)

    def forward(self, x):
        H, W, ws, s = self.H, self.W, self.ws, self.shift
        B, L, C = x.shape
        shortcut = x
        x = self.norm1(x).view(B, H, W, C)
        if s > 0:
            x = torch.roll(x, shifts=(-s, -s), dims=(1, 2))
        x_windows = window_partition(x, ws).view(-1, ws * ws, C)
        attn_windows = self.attn(x_windows, mask=self.attn_mask).view(-1, ws, ws, C)
        x = window_reverse(attn_windows, ws, H, W)
        if s > 0:
            x = torch.roll(x, shifts=(s, s), dims=(1, 2))
        x = shortcut + x.view(B, H * W, C)
        return x + self.mlp(self.norm2(x))


class PatchMerging(nn.Module):
    def __init__(self, resolution, dim):
        super().__init__()
        self.H, self.W = resolution
        self.reduction = nn.Linear(4 * dim, 2 * dim, bias=False)
        self.norm = nn.LayerNorm(4 * dim)

    def forward(self, x):
        B, L, C = x.shape
        x = x.view(B, self.H, self.W, C)
        x0 = x[:, 0::2, 0::2, :]
        x1 = x[:, 1::2, 0::2, :]
        x2 = x[:, 0::2, 1::2, :]
        x3 = x[:, 1::2, 1::2, :]
        x = torch.cat([x0, x1, x2, x3], -1).view(B, -1, 4 * C)
        return self.reduction(self.norm(x))


class Swin(nn.Module):
    def __init__(self, image=64, patch=4, dim=16, depths=(2, 2, 2), heads=(2, 4, 8), ws=4, num_classes=10):
        super().__init__()
        self.patch_embed = nn.Conv2d(3, dim, patch, patch)
        self.patch_norm = nn.LayerNorm(dim)
        res = image // patch
        layers = []
        for i, (d, h) in enumerate(zip(depths, heads)):
            for j in range(d):
                layers.append(SwinBlock(dim, (res, res), h, ws, 0 if j % 2 == 0 else ws // 2))
            if i + 1 < len(depths):
                layers.append(PatchMerging((res, res), dim))
                dim, res = dim * 2, res // 2
        self.layers = nn.Sequential(*layers)
        self.norm = nn.LayerNorm(dim)
        self.avgpool = nn.AdaptiveAvgPool1d(1)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, x):
        x = self.patch_embed(x).flatten(2).transpose(1, 2)  # B, L, C
        x = self.layers(self.patch_norm(x))
        x = self.norm(x)
        x = self.avgpool(x.transpose(1, 2))
        return self.head(torch.flatten(x, 1))


def build_swin():
    torch.manual_seed(0)
    model = Swin()
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, WindowAttention):
                m.relative_position_bias_table.normal_(std=0.5)
    args = _image(64)
    return _finalize(model, args, 12), args


# --------------------------------------------------------------------------------------
# BERT encoder
# --------------------------------------------------------------------------------------


class BertLayer(nn.Module):
    def __init__(self, hidden, heads, intermediate, eps=1e-12):
        super().__init__()
        self.heads, self.head_dim = heads, hidden // heads
        self.query = nn.Linear(hidden, hidden)
        self.key = nn.Linear(hidden, hidden)
        self.value = nn.Linear(hidden, hidden)
        self.attn_dropout = nn.Dropout(0.1)
        self.attn_out = nn.Linear(hidden, hidden)
        self.attn_out_dropout = nn.Dropout(0.1)
        self.attn_ln = nn.LayerNorm(hidden, eps=eps)
        self.intermediate = nn.Linear(hidden, intermediate)
        self.output = nn.Linear(intermediate, hidden)
        self.out_dropout = nn.Dropout(0.1)
        self.out_ln = nn.LayerNorm(hidden, eps=eps)

    def _heads(self, x):
        return x.view(x.shape[:-1] + (self.heads, self.head_dim)).permute(0, 2, 1, 3)

    def forward(self, hidden_states, ext_mask):
        q = self._heads(self.query(hidden_states))
        k = self._heads(self.key(hidden_states))
        v = self._heads(self.value(hidden_states))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_dim)
        scores = scores + ext_mask
        probs = self.attn_dropout(F.softmax(scores, dim=-1))
        ctx = torch.matmul(probs, v).permute(0, 2, 1, 3).contiguous()
        ctx = ctx.view(ctx.shape[:-2] + (self.heads * self.head_dim,))
        attn = self.attn_ln(self.attn_out_dropout(self.attn_out(ctx)) + hidden_states)
        inter = F.gelu(self.intermediate(attn))  # exact (erf) GELU
        return self.out_ln(self.out_dropout(self.output(inter)) + attn)


class Bert(nn.Module):
    def __init__(self, vocab=160, hidden=64, layers=2, heads=4, intermediate=128, max_pos=32, type_vocab=2):
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab, hidden, padding_idx=0)
        self.position_embeddings = nn.Embedding(max_pos, hidden)
        self.token_type_embeddings = nn.Embedding(type_vocab, hidden)
        self.emb_ln = nn.LayerNorm(hidden, eps=1e-12)
        self.emb_dropout = nn.Dropout(0.1)
        self.register_buffer("position_ids", torch.arange(max_pos).expand((1, -1)), persistent=False)
        self.register_buffer("token_type_ids", torch.zeros((1, max_pos), dtype=torch.long), persistent=False)
        self.layers = nn.ModuleList([BertLayer(hidden, heads, intermediate) for _ in range(layers)])
        self.pooler = nn.Linear(hidden, hidden)

    def forward(self, input_ids, attention_mask):
        B, T = input_ids.shape
        position_ids = self.position_ids[:, :T]
        token_type_ids = self.token_type_ids[:, :T].expand(B, T)
        x = self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids)
        x = x + self.position_embeddings(position_ids)
        x = self.emb_dropout(self.emb_ln(x))
        dtype = x.dtype
        ext = attention_mask[:, None, None, :].to(dtype)
        ext = (1.0 - ext) * torch.finfo(dtype).min
        for layer in self.layers:
            x = layer(x, ext)
        pooled = torch.tanh(self.pooler(x[:, 0]))
        return x, pooled


def build_bert():
    torch.manual_seed(0)
    model = Bert()
    g = _gen(13)
    T = 16
    input_ids = torch.randint(1, 160, (1, T), generator=g)
    attention_mask = torch.ones(1, T, dtype=torch.long)
    attention_mask[:, 12:] = 0  # padded tail
    input_ids[:, 12:] = 0
    args = (input_ids, attention_mask)
    return _finalize(model, args, 13), args


# --------------------------------------------------------------------------------------
# LLaMA-style decoder
# --------------------------------------------------------------------------------------


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def repeat_kv(x, n_rep: int):
    b, kvh, s, d = x.shape
    if n_rep == 1:
        return x
    x = x[:, :, None, :, :].expand(b, kvh, n_rep, s, d)
    return x.reshape(b, kvh * n_rep, s, d)


class LlamaAttention(nn.Module):
    def __init__(self, dim, heads, kv_heads):
        super().__init__()
        self.heads, self.kv_heads, self.hd = heads, kv_heads, dim // heads
        self.q_proj = nn.Linear(dim, heads * self.hd, bias=False)
        self.k_proj = nn.Linear(dim, kv_heads * self.hd, bias=False)
        self.v_proj = nn.Linear(dim, kv_heads * self.hd, bias=False)
        self.o_proj = nn.Linear(heads * self.hd, dim, bias=False)

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.heads, self.hd).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.kv_heads, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.kv_heads, self.hd).transpose(1, 2)
        cos, sin = cos[None, None], sin[None, None]
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        n_rep = self.heads // self.kv_heads
        k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out = out.transpose(1, 2).contiguous().view(B, T, -1)
        return self.o_proj(out)


class LlamaMLP(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaLayer(nn.Module):
    def __init__(self, dim, heads, kv_heads, hidden, eps):
        super().__init__()
        self.input_layernorm = RMSNorm(dim, eps)
        self.self_attn = LlamaAttention(dim, heads, kv_heads)
        self.post_attention_layernorm = RMSNorm(dim, eps)
        self.mlp = LlamaMLP(dim, hidden)

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Llama(nn.Module):
    def __init__(self, vocab=160, dim=64, layers=2, heads=4, kv_heads=2, hidden=128, max_seq=32, eps=1e-6,
                 theta=10000.0):
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList([LlamaLayer(dim, heads, kv_heads, hidden, eps) for _ in range(layers)])
        self.norm = RMSNorm(dim, eps)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        self.lm_head.weight = self.embed_tokens.weight  # tied
        hd = dim // heads
        inv_freq = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
        freqs = torch.outer(torch.arange(max_seq, dtype=torch.float32), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos_cached", emb.cos(), persistent=False)
        self.register_buffer("sin_cached", emb.sin(), persistent=False)

    def forward(self, input_ids):
        T = input_ids.shape[1]
        x = self.embed_tokens(input_ids)
        cos, sin = self.cos_cached[:T], self.sin_cached[:T]
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.lm_head(self.norm(x))


def build_llama():
    torch.manual_seed(0)
    model = Llama()
    with torch.no_grad():
        model.embed_tokens.weight.normal_(std=0.3)
    args = (torch.randint(0, 160, (1, 16), generator=_gen(14)),)
    return _finalize(model, args, 14), args


# --------------------------------------------------------------------------------------
# T5 encoder
# --------------------------------------------------------------------------------------


def _relative_position_bucket(relative_position, bidirectional=True, num_buckets=32, max_distance=128):
    relative_buckets = 0
    if bidirectional:
        num_buckets //= 2
        relative_buckets += (relative_position > 0).to(torch.long) * num_buckets
        relative_position = torch.abs(relative_position)
    else:
        relative_position = -torch.min(relative_position, torch.zeros_like(relative_position))
    max_exact = num_buckets // 2
    is_small = relative_position < max_exact
    relative_position_if_large = max_exact + (
        torch.log(relative_position.float() / max_exact)
        / math.log(max_distance / max_exact)
        * (num_buckets - max_exact)
    ).to(torch.long)
    relative_position_if_large = torch.min(
        relative_position_if_large, torch.full_like(relative_position_if_large, num_buckets - 1)
    )
    relative_buckets += torch.where(is_small, relative_position, relative_position_if_large)
    return relative_buckets


class T5Attention(nn.Module):
    def __init__(self, d_model, d_kv, heads, has_relative_attention_bias, num_buckets=32, max_distance=128):
        super().__init__()
        self.heads, self.d_kv = heads, d_kv
        inner = heads * d_kv
        self.q = nn.Linear(d_model, inner, bias=False)
        self.k = nn.Linear(d_model, inner, bias=False)
        self.v = nn.Linear(d_model, inner, bias=False)
        self.o = nn.Linear(inner, d_model, bias=False)
        self.num_buckets, self.max_distance = num_buckets, max_distance
        self.relative_attention_bias = nn.Embedding(num_buckets, heads) if has_relative_attention_bias else None
        self.dropout = nn.Dropout(0.1)

    def compute_bias(self, q_len, k_len, device):
        context_position = torch.arange(q_len, dtype=torch.long, device=device)[:, None]
        memory_position = torch.arange(k_len, dtype=torch.long, device=device)[None, :]
        relative_position = memory_position - context_position
        buckets = _relative_position_bucket(relative_position, True, self.num_buckets, self.max_distance)
        values = self.relative_attention_bias(buckets)  # (q, k, heads)
        return values.permute([2, 0, 1]).unsqueeze(0)

    def forward(self, x, mask, position_bias=None):
        B, T, _ = x.shape
        q = self.q(x).view(B, -1, self.heads, self.d_kv).transpose(1, 2)
        k = self.k(x).view(B, -1, self.heads, self.d_kv).transpose(1, 2)
        v = self.v(x).view(B, -1, self.heads, self.d_kv).transpose(1, 2)
        scores = torch.matmul(q, k.transpose(3, 2))  # no 1/sqrt(d) scaling in T5
        if position_bias is None:
            position_bias = self.compute_bias(T, T, x.device) + mask
        scores = scores + position_bias
        attn = F.softmax(scores.float(), dim=-1).type_as(scores)
        attn = self.dropout(attn)
        out = torch.matmul(attn, v).transpose(1, 2).contiguous().view(B, -1, self.heads * self.d_kv)
        return self.o(out), position_bias


class T5Block(nn.Module):
    def __init__(self, d_model, d_kv, heads, d_ff, has_bias, eps=1e-6):
        super().__init__()
        self.attn_ln = RMSNorm(d_model, eps)
        self.attn = T5Attention(d_model, d_kv, heads, has_bias)
        self.ff_ln = RMSNorm(d_model, eps)
        # gated-GELU feed forward (T5 v1.1, "gelu_new" = tanh approximation)
        self.wi_0 = nn.Linear(d_model, d_ff, bias=False)
        self.wi_1 = nn.Linear(d_model, d_ff, bias=False)
        self.wo = nn.Linear(d_ff, d_model, bias=False)
        self.dropout = nn.Dropout(0.1)

    def forward(self, x, mask, position_bias=None):
        a, position_bias = self.attn(self.attn_ln(x), mask, position_bias)
        x = x + self.dropout(a)
        h = self.ff_ln(x)
        h = F.gelu(self.wi_0(h), approximate="tanh") * self.wi_1(h)
        x = x + self.dropout(self.wo(self.dropout(h)))
        return x, position_bias


class T5Encoder(nn.Module):
    def __init__(self, vocab=160, d_model=64, d_kv=16, heads=4, d_ff=128, layers=2):
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, d_model)
        self.block = nn.ModuleList([T5Block(d_model, d_kv, heads, d_ff, i == 0) for i in range(layers)])
        self.final_layer_norm = RMSNorm(d_model)
        self.dropout = nn.Dropout(0.1)

    def forward(self, input_ids, attention_mask):
        x = self.dropout(self.embed_tokens(input_ids))
        dtype = x.dtype
        mask = (1.0 - attention_mask[:, None, None, :].to(dtype)) * torch.finfo(dtype).min
        position_bias = None
        for blk in self.block:
            x, position_bias = blk(x, mask, position_bias)
        return self.dropout(self.final_layer_norm(x))


def build_t5():
    torch.manual_seed(0)
    model = T5Encoder()
    g = _gen(15)
    T = 16
    input_ids = torch.randint(2, 160, (1, T), generator=g)
    attention_mask = torch.ones(1, T, dtype=torch.long)
    attention_mask[:, 13:] = 0
    input_ids[:, 13:] = 0
    args = (input_ids, attention_mask)
    return _finalize(model, args, 15), args


# --------------------------------------------------------------------------------------
# registry
# --------------------------------------------------------------------------------------

ZOO: dict[str, ZooEntry] = {
    e.name: e
    for e in [
        ZooEntry("resnet18", "cnn", build_resnet18, True),
        ZooEntry("mobilenet_v2", "cnn", build_mobilenet_v2, True),
        ZooEntry("mobilenet_v3", "cnn", build_mobilenet_v3, True),
        ZooEntry("efficientnet", "cnn", build_efficientnet, True),
        ZooEntry("shufflenet_v2", "cnn", build_shufflenet_v2, True),
        ZooEntry("squeezenet", "cnn", build_squeezenet, True),
        ZooEntry("regnet", "cnn", build_regnet, True),
        ZooEntry("convnext", "cnn", build_convnext, True),
        ZooEntry("densenet", "cnn", build_densenet, True),
        ZooEntry("deeplabv3", "cnn", build_deeplabv3, True),
        ZooEntry("lraspp", "cnn", build_lraspp, True),
        ZooEntry("vit", "transformer", build_vit, True),
        ZooEntry("swin", "transformer", build_swin, True),
        ZooEntry("bert", "transformer", build_bert, True),
        ZooEntry("llama", "transformer", build_llama, True),
        ZooEntry("t5", "transformer", build_t5, True),
    ]
}


def build(name: str) -> tuple[nn.Module, tuple]:
    return ZOO[name].build()


# Realistic widths for quantization (tests/edge/test_quant.py, bench/quant.py): at the zoo's own
# sizes (30-180K parameters) per-channel scales, biases and flatbuffer structure are a large share
# of a quantized file; here the weights dominate, as in the real models. Same architectures and
# seeds; ResNet-18 at the zoo's widths already has 175K weights in 3x3 convs and stays as it is.
WIDE: dict[str, Callable[[], tuple[nn.Module, tuple]]] = {
    "resnet18": build_resnet18,
    # torchvision's MobileNetV2 (width 1.0, 1000 classes: 3.5M parameters) at 64x64
    "mobilenet_v2": lambda: build_mobilenet_v2(width_mult=1.0, image=64, num_classes=1000),
    # ViT-Ti's width and heads (dim 192, 3 heads, mlp 768; 2.7M parameters), 6 layers, 32x32 in 8x8
    # patches; position embeddings at torchvision's init scale (at the zoo's 0.5 a constant per
    # position outweighs the patches and the float model's top-1 margins shrink)
    "vit": lambda: build_vit(dim=192, depth=6, heads=3, mlp_dim=768, pos_std=0.02),
}


def build_wide(name: str) -> tuple[nn.Module, tuple]:
    return WIDE[name]()
