"""The algebraic clean-ups (converter.passes.simplify): the ops each removes, what it leaves alone, and the numbers
against torch eager on the LiteRT interpreter and PJRT CPU."""

import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tests.numerics import rel_err
from tpu_export import edge, tpu_backend
from tpu_export.converter import prepare

aten = torch.ops.aten


class WindowAttention(torch.nn.Module):
    """Swin-V2's cosine attention over windows: a pad to a multiple of the window the input already has, and
    ``F.normalize`` (a clamp expanded to the input's shape before the division)."""

    def __init__(self, window=4):
        super().__init__()
        torch.manual_seed(0)
        self.q = torch.nn.Linear(16, 16)
        self.window = window

    def forward(self, x):  # (B, H, W, C)
        _, h, w, _ = x.shape
        x = F.pad(x, (0, 0, 0, (self.window - w % self.window) % self.window, 0,
                      (self.window - h % self.window) % self.window))
        x = x[:, :, :, :].reshape(x.shape).permute(0, 1, 2, 3)
        return F.normalize(self.q(x), dim=-1) @ F.normalize(x, dim=-1).transpose(-2, -1)


class ZeroGammaResidual(torch.nn.Module):
    """A residual block whose last norm is a frozen batch norm with weight 0 (zero-initialised residuals, DETR's
    FrozenBatchNorm2d): the branch adds its bias only."""

    def __init__(self, gamma=0.0):
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(8, 8, 3, padding=1)
        self.register_buffer("weight", torch.full((8,), gamma))
        self.register_buffer("bias", torch.randn(8))
        self.register_buffer("mean", torch.randn(8))
        self.register_buffer("var", torch.rand(8) + 0.5)

    def forward(self, x):
        scale = self.weight * (self.var + 1e-5).rsqrt()
        shift = self.bias - self.mean * scale
        return torch.relu(x + self.conv(x) * scale.reshape(1, -1, 1, 1) + shift.reshape(1, -1, 1, 1))


class TimesOne(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("one", torch.ones(4))

    def forward(self, x):
        return torch.tanh(x * self.one * 1.0 + 0)


def _prepare(model, x):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return prepare(model.eval(), (x,))


def _targets(prog) -> list:
    return [n.target for n in prog.signature(None).graph.nodes if n.op == "call_function"]


def _check_numbers(prog, model, x, histogram):
    want = model(x).detach()
    data = edge.convert_program(prog)
    assert edge.op_histogram(data) == histogram
    got = list(edge.run_tflite(data, {"x": x.numpy()}).values())
    assert len(got) == 1 and rel_err(got[0], want) <= 1e-5
    xla = tpu_backend.export_program(prog, platforms=("cpu",))(x)
    xla = xla[0] if isinstance(xla, (list, tuple)) else xla
    assert rel_err(np.asarray(xla), want) <= 1e-5


def test_noop_pad_slice_view_permute_and_the_normalize_broadcasts_are_gone():
    model, x = WindowAttention(), torch.randn(2, 8, 8, 16)
    targets = _targets(_prepare(model, x))
    for gone in (aten.constant_pad_nd.default, aten.slice.Tensor, aten.view.default, aten.expand.default):
        assert gone not in targets, gone
    assert aten.permute.default in targets  # the key transpose is real
    # what the edge runs: no PAD, no BROADCAST_TO before the divisions, no RESHAPE or TRANSPOSE of x
    _check_numbers(_prepare(model, x), model, x, {"FULLY_CONNECTED": 1, "SQUARE": 2, "SUM": 2, "SQRT": 2,
                                                  "MAXIMUM": 2, "DIV": 2, "BATCH_MATMUL": 1})


def test_a_pad_that_pads_stays():
    model, x = WindowAttention(window=3), torch.randn(2, 8, 8, 16)
    assert aten.constant_pad_nd.default in _targets(_prepare(model, x))
    assert model(x).shape == (2, 9, 9, 9)


def test_a_residual_branch_times_zero_is_removed_with_its_conv():
    model, x = ZeroGammaResidual(), torch.randn(1, 8, 10, 10)
    prog = _prepare(model, x)
    assert _targets(prog) == [aten.add.Tensor, aten.relu.default]  # x + shift, relu: the conv is dead
    _check_numbers(prog, model, x, {"ADD": 1})


def test_a_residual_branch_times_a_nonzero_scale_keeps_its_conv():
    model, x = ZeroGammaResidual(gamma=0.5), torch.randn(1, 8, 10, 10)
    assert aten.convolution.default in _targets(_prepare(model, x))


def test_times_one_and_plus_zero_are_gone():
    model, x = TimesOne(), torch.randn(3, 4)
    assert _targets(_prepare(model, x)) == [aten.tanh.default]


def test_an_input_returned_through_a_noop_keeps_the_op():
    class Same(torch.nn.Module):
        def forward(self, x):
            return x.reshape(x.shape), x * 2

    prog = _prepare(Same(), torch.randn(2, 3))
    assert aten.view.default in _targets(prog) or aten.reshape.default in _targets(prog)


@pytest.mark.parametrize("shape", [(2, 8, 8, 16)])
def test_dynamic_dims_are_never_compared(shape):
    model, x = WindowAttention(), torch.randn(*shape)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prog = prepare(model.eval(), (x,), dynamic_shapes={"x": {0: torch.export.Dim("batch", min=1, max=8)}})
    # the batch dim is symbolic: the broadcasts and views over it stay, and the program still runs another batch
    x3 = torch.randn(3, *shape[1:])
    got = tpu_backend.export_program(prog, platforms=("cpu",))(x3)
    got = got[0] if isinstance(got, (list, tuple)) else got
    assert rel_err(np.asarray(got), model(x3).detach()) <= 1e-5
