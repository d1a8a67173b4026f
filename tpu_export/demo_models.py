"""Built-in models for `tpu-export demo` and the CLI's default: small, seeded, no downloads."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["small_cnn", "small_transformer", "DEMO_MODELS"]


class SmallCNN(nn.Module):
    """Conv-BN-ReLU stem, a depthwise-separable block with a residual, global pool, classifier."""

    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU())
        self.dw = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1, groups=16, bias=False), nn.BatchNorm2d(16), nn.ReLU6())
        self.pw = nn.Sequential(nn.Conv2d(16, 16, 1, bias=False), nn.BatchNorm2d(16))
        self.head = nn.Linear(16, num_classes)

    def forward(self, image):
        x = self.stem(image)
        x = x + self.pw(self.dw(x))
        x = F.adaptive_avg_pool2d(F.relu(x), 1).flatten(1)
        return self.head(x)


class TransformerBlock(nn.Module):
    """Pre-LN block: multi-head self-attention (SDPA) and a GELU MLP, with token embeddings."""

    def __init__(self, vocab: int = 128, dim: int = 64, heads: int = 4, seq: int = 16):
        super().__init__()
        self.heads = heads
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.randn(seq, dim) * 0.02)
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.fc2 = nn.Linear(4 * dim, dim)

    def forward(self, input_ids):
        b, s = input_ids.shape
        x = self.embed(input_ids) + self.pos[:s]
        q, k, v = self.qkv(self.ln1(x)).chunk(3, dim=-1)
        split = lambda t: t.view(b, s, self.heads, -1).transpose(1, 2)  # noqa: E731
        a = F.scaled_dot_product_attention(split(q), split(k), split(v), is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, -1))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


def _randomize_bn(module: nn.Module, g: torch.Generator) -> None:
    for m in module.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.1)
            m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)


def small_cnn(seed: int = 0):
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    m = SmallCNN()
    with torch.no_grad():
        _randomize_bn(m, g)
    return m.eval(), (torch.randn(1, 3, 32, 32, generator=g),)


def small_transformer(seed: int = 0):
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    m = TransformerBlock()
    return m.eval(), (torch.randint(0, 128, (1, 16), generator=g),)


DEMO_MODELS = {"cnn": small_cnn, "transformer": small_transformer}
