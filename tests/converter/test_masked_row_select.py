"""BART-style pooling at the last (or first) <eos>, h[mask].view(B, -1, H)[:, i, :]: rewritten to a gather of that
position on both outputs, against torch eager; a mask selection of another form stays refused by name."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tpu_export
from tpu_export import tpu_backend
from tpu_export.converter import prepare
from tpu_export.converter.errors import UnsupportedOpsError

EOS = 2


class Pool(torch.nn.Module):
    def __init__(self, at: int):
        super().__init__()
        self.at = at
        self.emb = torch.nn.Embedding(16, 8)

    def forward(self, ids):
        h = self.emb(ids)
        mask = ids.eq(EOS)
        return h[mask, :].view(h.size(0), -1, h.size(-1))[:, self.at, :]


def _ids():
    ids = torch.tensor([[5, 2, 7, 9, 2, 4], [2, 3, 3, 8, 6, 2]])  # two <eos> per row, at different places
    assert torch.equal(ids.eq(EOS).sum(1), torch.tensor([2, 2]))
    return ids


def _run_both(model, ids, tmp_path):
    written = tpu_export.convert(model, (ids,), targets=["cpu", "cpu-xla"], out_dir=str(tmp_path))
    feed = ids.numpy().astype(np.int32)
    tpu = np.asarray(tpu_backend.load(written["cpu-xla"])(feed))
    from ai_edge_litert.interpreter import Interpreter

    run = Interpreter(model_path=written["cpu"]).get_signature_runner()
    (name,) = run.get_input_details()
    (edge,) = run(**{name: feed}).values()
    return edge, tpu


@pytest.mark.parametrize("at", [-1, 0])
def test_pooling_at_one_masked_position_matches_eager(at, tmp_path):
    torch.manual_seed(0)
    model = Pool(at).eval()
    ids = _ids()
    want = model(ids).detach().numpy()
    ops = {str(n.target) for n in prepare(model, (ids,)).signature().graph.nodes}
    assert "aten.index.Tensor" in ops and not any("sym_size" in o for o in ops)
    for got in _run_both(model, ids, tmp_path):
        np.testing.assert_array_equal(got, want)


def test_another_mask_selection_stays_refused(tmp_path):
    class Keep(torch.nn.Module):
        def forward(self, x):
            return x[x > 0].sum(0, keepdim=True)

    x = torch.randn(4, 3)
    with pytest.raises(UnsupportedOpsError, match=r"aten\.(index|nonzero)"):
        tpu_export.convert(Keep(), (x,), targets=["cpu"], out_dir=str(tmp_path))
