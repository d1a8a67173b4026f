"""converter.passes.fold_constant_items: a number read back from a tensor computed from constants alone (Reformer's
axial position encodings cut to ``position_ids.max().item()`` of its own arange) is folded, and the model runs on
both backends with static shapes, matching torch eager; an item of a tensor an input reaches stays, and the
backends refuse it naming ``aten._local_scalar_dense.default``."""

from __future__ import annotations

import pytest
import torch

from tests.converter.pass_backends import call_targets, run_on
from tpu_export import converter, tpu_backend
from tpu_export.converter.errors import UnsupportedOpsError
from tpu_export.converter.numerics import rel_err
from tpu_export.edge import convert_program

aten = torch.ops.aten


class AxialPositions(torch.nn.Module):
    """Reformer's eval-mode axial encodings: the table [rows, cols, D] cut to the rows the positions need."""

    def __init__(self):
        super().__init__()
        self.table = torch.nn.Parameter(torch.randn(8, 4, 6, generator=torch.Generator().manual_seed(0)))

    def forward(self, x):  # x [B, S, D]
        positions = torch.arange(x.shape[1]).unsqueeze(0).expand(x.shape[0], -1)
        rows = (positions.max().item() + 4) // 4
        torch._check(rows <= 8)
        table = self.table[:rows].reshape(-1, 6)
        return x + torch.stack([table.index_select(0, positions[b]) for b in range(x.shape[0])])


class InputItem(torch.nn.Module):
    def forward(self, x, n):
        k = n.max().item()
        torch._check(k >= 0)
        torch._check(k < x.shape[1])
        return x[:, :k + 1].sum(1)


@pytest.mark.parametrize("backend", ["litert", "tpu"])
def test_item_of_constants_is_folded(backend):
    module = AxialPositions().eval()
    x = torch.randn(2, 10, 6, generator=torch.Generator().manual_seed(1))
    prog = converter.prepare(module, (x,))
    assert aten._local_scalar_dense.default not in call_targets(prog)
    run = run_on(prog, backend)
    with torch.no_grad():
        assert rel_err(run(x), module(x)) <= 1e-6


def test_item_of_an_input_is_refused_naming_it():
    args = (torch.randn(2, 5), torch.tensor([1, 3], dtype=torch.int32))
    prog = converter.prepare(InputItem().eval(), args)
    assert aten._local_scalar_dense.default in call_targets(prog)
    with pytest.raises(UnsupportedOpsError, match=r"aten\._local_scalar_dense\.default"):
        convert_program(prog)
    with pytest.raises(UnsupportedOpsError, match=r"aten\._local_scalar_dense\.default"):
        tpu_backend.export_program(prog, platforms=("cpu",))
