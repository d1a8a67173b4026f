"""Real-size architectures for the benchmarks: torchvision's classification models at their
published widths and depths (random weights, BatchNorm statistics calibrated as the test zoo does),
224x224 RGB, batch 1, float32, and transformers' BERT at its base size.

torchvision itself does not import on this host (its _C links CUDA libraries; see
docs / ARCHITECTURE.md), so the models are the zoo's code-built architectures (tests/zoo.py) with
torchvision's configurations; the few blocks the zoo lacks (ResNet's bottleneck, EfficientNet-B0's
and RegNetY-400MF's stage tables) are here. Parameter counts match torchvision's (checked by
``python bench/real_models.py``).
"""

from __future__ import annotations

import os
import sys

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tests import zoo  # noqa: E402

__all__ = ["REAL", "build_real", "TORCHVISION_PARAMS"]

_BIG = 10**10  # no size cap (the zoo caps its tiny models at 1 MB)

# torchvision's parameter counts (the model builders' docs), for the self-check
TORCHVISION_PARAMS = {
    "resnet18": 11_689_512, "resnet50": 25_557_032, "mobilenet_v2": 3_504_872, "efficientnet_b0": 5_288_548,
    "convnext_tiny": 28_589_128, "densenet121": 7_978_856, "vit_b_16": 86_567_656, "regnet_y_400mf": 4_344_144,
    "swin_t": 28_288_354,
}


def _image(size: int = 224) -> tuple:
    return (torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(1)),)


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inplanes, planes, stride=1, downsample=None):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * 4)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        return self.relu(self.bn3(self.conv3(out)) + identity)


class ResNet50(zoo.ResNet):
    def __init__(self, num_classes=1000):
        super().__init__((64, 128, 256, 512), (2, 2, 2, 2), num_classes)
        cin, layers = 64, []
        for i, (planes, n) in enumerate(zip((64, 128, 256, 512), (3, 4, 6, 3))):
            stride = 1 if i == 0 else 2
            down = nn.Sequential(nn.Conv2d(cin, planes * 4, 1, stride, bias=False), nn.BatchNorm2d(planes * 4))
            blocks = [Bottleneck(cin, planes, stride, down)] + [Bottleneck(planes * 4, planes) for _ in range(n - 1)]
            layers.append(nn.Sequential(*blocks))
            cin = planes * 4
        self.layer1, self.layer2, self.layer3, self.layer4 = layers
        self.fc = nn.Linear(2048, num_classes)


class EfficientNetB0(zoo.EfficientNet):
    # torchvision's efficientnet_b0 table: expand, kernel, stride, in, out, layers
    SETTING = [(1, 3, 1, 32, 16, 1), (6, 3, 2, 16, 24, 2), (6, 5, 2, 24, 40, 2), (6, 3, 2, 40, 80, 3),
               (6, 5, 1, 80, 112, 3), (6, 5, 2, 112, 192, 4), (6, 3, 1, 192, 320, 1)]

    def __init__(self, num_classes=1000):
        super().__init__(num_classes, last_channel=1280)
        self.features[0] = zoo.ConvBNAct(3, 32, 3, 2, act=nn.SiLU)


class RegNetY400MF(zoo.RegNetY):
    def __init__(self, num_classes=1000):
        super().__init__((48, 104, 208, 440), (1, 3, 6, 6), 8, num_classes)
        self.stem = zoo.ConvBNAct(3, 32, 3, 2, act=nn.ReLU)
        first = self.trunk_output[0][0]
        self.trunk_output[0][0] = zoo.ResBottleneckBlockY(32, 48, 2, 8)
        del first


def _swin_t():
    model = zoo.Swin(image=224, patch=4, dim=96, depths=(2, 2, 6, 2), heads=(3, 6, 12, 24), ws=7, num_classes=1000)
    for m in model.modules():  # swin_t's MLP ratio is 4 (the zoo's blocks default to 2)
        if isinstance(m, zoo.SwinBlock):
            d = m.norm1.normalized_shape[0]
            m.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Dropout(0.0), nn.Linear(4 * d, d), nn.Dropout(0.0))
    return model


def _bert_base():
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    model = BertModel(BertConfig(), add_pooling_layer=True).eval()  # bert-base: 768 wide, 12 layers, 110M
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(0, 30522, (1, 128), generator=g)
    return model, (ids, torch.ones(1, 128, dtype=torch.long))


_BUILDERS = {
    "resnet18": lambda: zoo.ResNet((64, 128, 256, 512), (2, 2, 2, 2), 1000),
    "resnet50": ResNet50,
    "mobilenet_v2": lambda: zoo.MobileNetV2(num_classes=1000, width_mult=1.0),
    "efficientnet_b0": EfficientNetB0,
    "convnext_tiny": lambda: zoo.ConvNeXt((96, 192, 384, 768), (3, 3, 9, 3), 1000),
    "densenet121": lambda: zoo.DenseNet(32, (6, 12, 24, 16), 64, 4, 1000),
    "vit_b_16": lambda: zoo.ViT(224, 16, 768, 12, 12, 3072, 1000),
    "regnet_y_400mf": RegNetY400MF,
    "swin_t": _swin_t,
}
REAL = list(_BUILDERS) + ["bert_base"]


def build_real(name: str) -> tuple[nn.Module, tuple]:
    """(model in eval, sample args) at the published size."""
    if name == "bert_base":
        return _bert_base()
    torch.manual_seed(0)
    model = _BUILDERS[name]()
    args = _image()
    return zoo._finalize(model, args, 0, _BIG), args


if __name__ == "__main__":
    for n in _BUILDERS:
        torch.manual_seed(0)
        p = sum(t.numel() for t in _BUILDERS[n]().parameters())
        want = TORCHVISION_PARAMS[n]
        print(f"{n:16s} {p:>12,d} torchvision {want:>12,d} {'ok' if p == want else 'DIFF'}")
