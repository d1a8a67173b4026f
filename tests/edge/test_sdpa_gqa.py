"""Grouped-query attention on the edge: the query heads of one KV head are folded into its rows, and the scores
stay folded through the mask and the softmax when the mask reads the same for every head of a group (tiled once
per signature when it has several rows). Checked against torch eager in the LiteRT interpreter, with the op
counts that show the fold (no RESHAPE of the scores or probabilities)."""

from __future__ import annotations

import collections

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tests.edge._util import rel_err


class _Attn(torch.nn.Module):
    """Two layers reading one mask, as a decoder's layers do."""

    def __init__(self, is_causal=False):
        super().__init__()
        self.is_causal = is_causal

    def forward(self, q, k, v, mask=None):
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=self.is_causal, enable_gqa=True)
        return F.scaled_dot_product_attention(o, k, v, attn_mask=mask, is_causal=self.is_causal, enable_gqa=True)


def _ops(model) -> collections.Counter:
    from ai_edge_litert import schema_py_generated as s

    names = {v: k for k, v in s.BuiltinOperator.__dict__.items() if not k.startswith("_")}
    m = s.Model.GetRootAsModel(model.tflite_model(), 0)
    sg = m.Subgraphs(0)
    codes = [m.OperatorCodes(sg.Operators(i).OpcodeIndex()) for i in range(sg.OperatorsLength())]
    return collections.Counter(names[max(c.BuiltinCode(), c.DeprecatedBuiltinCode())] for c in codes)


def _additive(rows, cols, shape, seed):
    keep = torch.rand(shape, generator=torch.Generator().manual_seed(seed)) > 0.3
    keep[..., 0] = True  # no fully masked row
    return torch.where(keep, 0.0, torch.finfo(torch.float32).min)


# (query length, mask, causal) -> RESHAPEs expected: q fold and o unfold per layer when the scores stay folded,
# two more per layer (scores unfold, probabilities fold) when a per-head mask needs the plain layout
CASES = {
    "decode_row_mask": (1, lambda: _additive(1, 16, (1, 1, 1, 16), 0), False, 4),
    "prefill_mask_tiled": (5, lambda: _additive(5, 16, (1, 1, 5, 16), 1), False, 4),
    "mask_2d": (5, lambda: _additive(5, 16, (5, 16), 2), False, 4),
    "bool_mask": (5, lambda: torch.rand(5, 16, generator=torch.Generator().manual_seed(3)) > 0.2, False, 4),
    "causal": (16, lambda: None, True, 4),
    "per_head_mask": (5, lambda: _additive(5, 16, (1, 6, 5, 16), 4), False, 8),
}


@pytest.mark.parametrize("case", list(CASES))
def test_grouped_query_attention_matches_torch(case):
    from tpu_export import litert_torch

    n, make_mask, causal, reshapes = CASES[case]
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, h, t, 8, generator=g) for h, t in ((6, n), (2, 16), (2, 16)))
    mask = make_mask()
    if mask is not None and mask.dtype == torch.bool:
        mask[:, 0] = True
    args = (q, k, v) if mask is None else (q, k, v, mask)
    mod = _Attn(is_causal=causal).eval()
    model = litert_torch.convert(mod, args)
    with torch.no_grad():
        want = mod(*args)
    got = model(*args)
    assert rel_err(np.asarray(got), want.numpy()) <= 1e-5
    ops = _ops(model)
    assert ops["RESHAPE"] == reshapes, ops
    assert ops["BATCH_MATMUL"] == 4 and ops["SOFTMAX"] == 2 and ops["SELECT_V2"] <= 1, ops
    # a mask with several rows is tiled for the folded rows once, for both layers
    assert ops["CONCATENATION"] == (1 if case in ("prefill_mask_tiled", "mask_2d", "bool_mask") else 0), ops
