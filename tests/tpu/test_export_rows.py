"""Rows for what the real-size sweep (bench/tpu_sweep.py) found failing to export, each on a tiny model through
the TPU path (torch.export -> our export -> PJRT CPU) against torch eager."""

from __future__ import annotations

import pytest
import torch

from tests.numerics import rel_err
from tpu_export import converter, tpu_backend


class WeightNormConv(torch.nn.Module):
    """Wav2Vec2's positional conv: a grouped Conv1d under parametrizations.weight_norm."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        conv = torch.nn.Conv1d(16, 16, 5, padding=2, groups=4)
        self.conv = torch.nn.utils.parametrizations.weight_norm(conv, name="weight", dim=2)

    def forward(self, x):
        return x + torch.nn.functional.gelu(self.conv(x))


def test_a_parametrized_module_left_in_training_mode_exports():
    """A wrapper left in training mode (as nn.Module() starts) around a weight_norm conv: capture's eval copy
    used to copy.copy the parametrized module, which torch refuses ("Serialization of parametrized modules is
    only supported through state_dict()"); the user's module keeps its training flag."""
    m = WeightNormConv()
    assert m.training
    x = torch.randn(1, 16, 12, generator=torch.Generator().manual_seed(1))
    with pytest.warns(UserWarning, match="training mode"):
        prog = converter.prepare(m, (x,))
    b = tpu_backend.export_program(prog)
    assert m.training and m.conv.training
    with torch.no_grad():
        want = m.eval()(x)
    assert rel_err(b(x), want) <= 1e-5
