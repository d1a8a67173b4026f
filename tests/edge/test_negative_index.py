"""A constant advanced index with negative entries (torch counts them from the end; Falcon's fused-QKV split is
``qkv[..., [-2]]`` and ``[..., [-1]]``) reads the same rows on the edge as in torch: LiteRT's GATHER and
GATHER_ND refuse a negative index, so the lowering counts it from the front."""

from __future__ import annotations

import torch

from tpu_export import litert_torch


class LastRows(torch.nn.Module):
    def forward(self, x):
        return x[:, :, [-2]] + x[:, :, [-1, 0]].sum(2, keepdim=True), x[[-1, 0], [1, -1]]


def test_negative_constant_indices_count_from_the_end():
    x = torch.randn(3, 4, 5, 2, generator=torch.Generator().manual_seed(0))
    model = litert_torch.convert(LastRows().eval(), (x,))
    got = model(x)
    want = LastRows()(x)
    for g, w in zip(got, want):
        torch.testing.assert_close(torch.as_tensor(g), w, rtol=0, atol=1e-6)
