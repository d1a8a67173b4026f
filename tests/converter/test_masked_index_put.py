"""converter.passes.where_masked_writes: a write of one value through a boolean mask, ``x[mask] = v`` (T5Gemma 2's
special-token embedding, ``emb[ids == eoi_id] = eoi_embedding``), runs on both backends as ``where(mask, v, x)``,
matching transformers' own module; a masked write of one row per selected position (a count known only at run
time) is left as it was, and the backends refuse it naming ``aten.index_put.default``."""

from __future__ import annotations

import pytest
import torch

from tests.converter.pass_backends import call_targets, run_on
from tpu_export import converter, tpu_backend
from tpu_export.converter.errors import UnsupportedOpsError
from tpu_export.converter.numerics import rel_err
from tpu_export.edge import convert_program

aten = torch.ops.aten
EOI = 7


def _embedding():
    from transformers.models.t5gemma2.modeling_t5gemma2 import T5Gemma2TextScaledWordEmbedding

    torch.manual_seed(0)
    emb = T5Gemma2TextScaledWordEmbedding(32, 16, padding_idx=0, embed_scale=4.0, eoi_token_index=EOI).eval()
    with torch.no_grad():
        emb.eoi_embedding.copy_(torch.randn(16))
    return emb


class MaskedRows(torch.nn.Module):
    """Accumulates into the masked positions of the last two dims (one value per batch row, broadcast)."""

    def forward(self, x, mask, v):
        return aten.index_put(x, [None, mask], v, True)


class RowPerPosition(torch.nn.Module):
    def forward(self, x, mask, rows):
        return x.index_put((mask,), rows)  # one row per True position: as many as the mask holds


@pytest.mark.parametrize("backend", ["litert", "tpu"])
def test_special_token_embedding_write_runs_as_where(backend):
    emb = _embedding()
    ids = torch.tensor([[3, EOI, 9, EOI, 1, 30], [EOI, 2, 2, 5, 31, 0]])
    prog = converter.prepare(emb, (ids.to(torch.int32),))
    assert aten.index_put.default not in call_targets(prog) and aten.where.self in call_targets(prog)
    with torch.no_grad():
        want = emb(ids)
    assert torch.equal(want[0, 1], emb.eoi_embedding.detach())  # the reference did overwrite the row
    for check in (ids, torch.tensor([[4, 4, 9, 8, 1, 30], [6, 2, 2, 5, 31, 0]])):  # a batch without the token too
        with torch.no_grad():
            want = emb(check)
        got = run_on(prog, backend)(check.to(torch.int32))
        assert rel_err(got, want) <= 1e-6


@pytest.mark.parametrize("backend", ["litert", "tpu"])
def test_accumulating_masked_write_after_a_full_slice(backend):
    g = torch.Generator().manual_seed(0)
    args = (torch.randn(2, 3, 4, generator=g), torch.rand(3, 4, generator=g) < 0.5, torch.randn(2, 1, generator=g))
    module = MaskedRows().eval()
    prog = converter.prepare(module, args)
    assert aten.index_put.default not in call_targets(prog)
    assert rel_err(run_on(prog, backend)(*args), module(*args)) <= 1e-6


def test_masked_write_of_a_row_per_position_is_refused_naming_it():
    mask = torch.tensor([True, False, True, False])
    prog = converter.prepare(RowPerPosition().eval(), (torch.randn(4, 3), mask, torch.randn(2, 3)))
    assert aten.index_put.default in call_targets(prog)
    with pytest.raises(UnsupportedOpsError, match=r"aten\.index_put\.default"):
        convert_program(prog)
    with pytest.raises(UnsupportedOpsError, match=r"aten\.index_put\.default"):
        tpu_backend.export_program(prog, platforms=("cpu",))
