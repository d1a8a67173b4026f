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

import math
import os
import sys

import torch
import torch.nn.functional as F
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
    "swinv2_cr_tiny": 28_330_000,  # timm's swinv2_cr_tiny_224: "28.3M" (timm lists it rounded)
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


class _CosineWindowAttention(nn.Module):
    """Swin-V2's window attention as timm's swinv2_cr writes it: cosine similarity of F.normalize'd queries and
    keys times a learned, clamped logit scale, plus a position bias an MLP computes from log-spaced relative
    coordinates."""

    def __init__(self, dim, heads, ws):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.logit_scale = nn.Parameter(torch.log(10 * torch.ones(heads)))
        self.meta_mlp = nn.Sequential(nn.Linear(2, 384), nn.ReLU(), nn.Linear(384, heads))
        coords = torch.stack(torch.meshgrid(torch.arange(ws), torch.arange(ws), indexing="ij")).flatten(1)
        rel = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0).reshape(-1, 2).float()
        self.register_buffer("rel_log", torch.sign(rel) * torch.log1p(rel.abs()), persistent=False)
        self.n = ws * ws

    def forward(self, x, mask=None):
        b, n, c = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, -1).permute(2, 0, 3, 1, 4).unbind(0)
        attn = F.normalize(q, dim=-1) @ F.normalize(k, dim=-1).transpose(-2, -1)
        scale = torch.clamp(self.logit_scale.reshape(1, self.heads, 1, 1), max=math.log(1.0 / 0.01)).exp()
        bias = self.meta_mlp(self.rel_log).transpose(1, 0).reshape(self.heads, self.n, self.n)
        attn = attn * scale + bias.unsqueeze(0)
        if mask is not None:
            attn = attn.view(-1, mask.shape[0], self.heads, n, n) + mask.unsqueeze(1).unsqueeze(0)
            attn = attn.view(-1, self.heads, n, n)
        x = (attn.softmax(dim=-1) @ v).transpose(1, 2).reshape(b, n, -1)
        return self.proj(x)


class _SwinV2CrBlock(nn.Module):
    """Res-post-norm block: x + norm(attn(x)), x + norm(mlp(x)); windows over the input padded to a multiple of
    the window (a pad by zero at 224x224 with 7x7 windows)."""

    def __init__(self, dim, res, heads, ws, shift):
        super().__init__()
        self.res, self.ws, self.shift = res, ws, shift if res > ws else 0
        self.ws = min(ws, res)
        self.attn = _CosineWindowAttention(dim, heads, self.ws)
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        mask = None
        if self.shift:
            img = torch.zeros(1, res, res, 1)
            cuts = (slice(0, -self.ws), slice(-self.ws, -self.shift), slice(-self.shift, None))
            for i, (h, w) in enumerate((h, w) for h in cuts for w in cuts):
                img[:, h, w, :] = i
            mw = zoo.window_partition(img, self.ws).view(-1, self.ws * self.ws)
            mask = (mw.unsqueeze(1) - mw.unsqueeze(2)).ne(0).float() * -100.0
        self.register_buffer("attn_mask", mask, persistent=False)

    def _attend(self, x):
        b, h, w, c = x.shape
        ws, s = self.ws, self.shift
        x = F.pad(x, (0, 0, 0, (ws - w % ws) % ws, 0, (ws - h % ws) % ws))
        hp, wp = x.shape[1], x.shape[2]
        if s:
            x = torch.roll(x, shifts=(-s, -s), dims=(1, 2))
        win = self.attn(zoo.window_partition(x, ws).view(-1, ws * ws, c), self.attn_mask)
        x = zoo.window_reverse(win.view(-1, ws, ws, c), ws, hp, wp)
        if s:
            x = torch.roll(x, shifts=(s, s), dims=(1, 2))
        return x[:, :h, :w, :]

    def forward(self, x):
        b, h, w, c = x.shape
        x = x + self.norm1(self._attend(x))
        return x + self.norm2(self.mlp(x))


class SwinV2CrTiny(nn.Module):
    """timm's swinv2_cr_tiny_224 at its published size: 96 wide, depths (2, 2, 6, 2), heads (3, 6, 12, 24), 7x7
    windows, 224x224."""

    def __init__(self, num_classes=1000, dim=96, depths=(2, 2, 6, 2), heads=(3, 6, 12, 24), ws=7, image=224):
        super().__init__()
        self.patch_embed = nn.Conv2d(3, dim, 4, 4)
        self.patch_norm = nn.LayerNorm(dim)
        res, stages = image // 4, []
        for i, (d, h) in enumerate(zip(depths, heads)):
            blocks = []
            if i:
                blocks.append(_PatchMerging(dim))
                dim, res = dim * 2, res // 2
            blocks += [_SwinV2CrBlock(dim, res, h, ws, 0 if j % 2 == 0 else ws // 2) for j in range(d)]
            stages.append(nn.Sequential(*blocks))
        self.stages = nn.Sequential(*stages)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, x):
        x = self.patch_norm(self.patch_embed(x).permute(0, 2, 3, 1))  # B, H, W, C
        return self.head(self.stages(x).mean(dim=(1, 2)))


class _PatchMerging(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.norm = nn.LayerNorm(4 * dim)
        self.reduction = nn.Linear(4 * dim, 2 * dim, bias=False)

    def forward(self, x):
        b, h, w, c = x.shape
        x = x.reshape(b, h // 2, 2, w // 2, 2, c).permute(0, 1, 3, 4, 2, 5).flatten(3)
        return self.reduction(self.norm(x))


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
    "swinv2_cr_tiny": SwinV2CrTiny,
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
        near = p == want or (want % 10_000 == 0 and abs(p - want) < 10_000)  # timm's rounded count
        print(f"{n:16s} {p:>12,d} published {want:>12,d} {'ok' if near else 'DIFF'}")
