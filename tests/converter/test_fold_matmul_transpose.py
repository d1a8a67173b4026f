"""x @ W.t() (+ b) over a weight becomes linear(x, W, b): the graph, and the numbers on PJRT CPU and LiteRT."""

import warnings

import numpy as np
import pytest
import torch

from tests.numerics import rel_err
from tpu_export import edge, tpu_backend
from tpu_export.converter import prepare

aten = torch.ops.aten


class Hand(torch.nn.Module):
    """A linear layer written by hand, in each way torch.export captures differently."""

    def __init__(self, form, n_out=6, n_in=8):
        super().__init__()
        torch.manual_seed(0)
        self.W = torch.nn.Parameter(torch.randn(n_out, n_in) / n_in**0.5)
        self.b = torch.nn.Parameter(torch.randn(n_out))
        self.form = form

    def forward(self, x):
        W, b = self.W, self.b
        return {
            "t_bias": lambda: x @ W.t() + b,
            "T_bias_first": lambda: b + x @ W.T,
            "matmul_transpose": lambda: torch.matmul(x, W.transpose(0, 1)),
            "mm_permute": lambda: torch.mm(x, W.permute(1, 0)),
            "addmm": lambda: torch.addmm(b, x, W.t()),
            "bmm_expand": lambda: torch.bmm(x, W.t().expand(x.shape[0], -1, -1)) + b,
        }[self.form]()


FOLDED = [  # form, x shape, whether the bias ends up inside the linear
    ("t_bias", (3, 8), True),
    ("t_bias", (2, 5, 8), True),
    ("t_bias", (8,), True),
    ("T_bias_first", (2, 5, 8), True),
    ("matmul_transpose", (2, 5, 8), False),
    ("mm_permute", (3, 8), False),
    ("addmm", (3, 8), True),
    ("bmm_expand", (2, 5, 8), True),
]


def _ops(prog):
    return [n for n in prog.signature(None).graph.nodes if n.op == "call_function"]


def _prepare(module, x):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return prepare(module.eval(), (x,))


@pytest.mark.parametrize("form, shape, with_bias", FOLDED)
def test_hand_written_linear_becomes_linear_over_the_stored_weight(form, shape, with_bias):
    m, x = Hand(form), torch.randn(*shape)
    prog = _prepare(m, x)
    ops = _ops(prog)
    assert [n.target for n in ops] == [aten.linear.default], ops
    lin = ops[0]
    # the weight as stored, not a folded transposed copy of it
    assert list(prog.weights) == (["W", "b"] if with_bias else ["W"])
    assert lin.args[1].meta["weight_name"] == "W" and (len(lin.args) == 3) == with_bias
    want = m(x)
    assert tuple(lin.meta["val"].shape) == tuple(want.shape) and lin.meta["val"].dtype == want.dtype


class TransposedActivation(torch.nn.Module):
    def forward(self, x, y):
        return x @ y.t()


class SharedTranspose(torch.nn.Module):
    """W.t() read twice: by the matmul and by the output."""

    def __init__(self):
        super().__init__()
        self.W = torch.nn.Parameter(torch.randn(6, 8))

    def forward(self, x):
        wt = self.W.t()
        return x @ wt, wt * 2


class BatchedWeight(torch.nn.Module):
    """A 3-D weight's last-two-dims transpose is not a linear."""

    def __init__(self):
        super().__init__()
        self.W = torch.nn.Parameter(torch.randn(2, 6, 8))

    def forward(self, x):
        return x @ self.W.transpose(1, 2)


@pytest.mark.parametrize("module, args", [
    (TransposedActivation(), (torch.randn(3, 8), torch.randn(6, 8))),
    (SharedTranspose(), (torch.randn(3, 8),)),
    (BatchedWeight(), (torch.randn(2, 3, 8),)),
])
def test_left_alone(module, args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prog = prepare(module.eval(), args)
    assert aten.linear.default not in {n.target for n in _ops(prog)}


def test_bias_read_twice_stays_an_add_of_the_product():
    class TwoReaders(Hand):
        def forward(self, x):
            y = x @ self.W.t()
            return y + self.b, y

    m, x = TwoReaders("t_bias"), torch.randn(3, 8)
    ops = _ops(_prepare(m, x))
    assert [n.target for n in ops] == [aten.linear.default, aten.add.Tensor]
    assert len(ops[0].args) == 2


@pytest.mark.parametrize("form, shape", [("t_bias", (3, 8)), ("t_bias", (2, 5, 8)), ("bmm_expand", (2, 5, 8)),
                                         ("mm_permute", (3, 8))])
def test_numbers_on_pjrt_cpu_and_litert_with_one_fully_connected(form, shape):
    m, x = Hand(form, n_out=24, n_in=32), torch.randn(*shape[:-1], 32)
    prog = _prepare(m, x)
    want = m(x).detach()
    got_xla = tpu_backend.export_program(prog, platforms=("cpu",))(x)
    got_xla = got_xla[0] if isinstance(got_xla, (list, tuple)) else got_xla
    assert rel_err(np.asarray(got_xla), want) <= 1e-5
    data = edge.convert_program(prog)
    assert edge.op_histogram(data) == {"FULLY_CONNECTED": 1}  # no TRANSPOSE, no BATCH_MATMUL, bias fused
    got_lite = list(edge.run_tflite(data, {"x": x.numpy()}).values())
    assert len(got_lite) == 1 and rel_err(got_lite[0], want) <= 1e-5


def test_dynamic_batch_is_folded_without_a_guard():
    m, x = Hand("t_bias"), torch.randn(2, 5, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prog = prepare(m.eval(), (x,), dynamic_shapes={"x": {0: torch.export.Dim("batch", min=1, max=16)}})
    lin = [n for n in _ops(prog) if n.target is aten.linear.default]
    assert len(lin) == 1 and len(lin[0].args) == 3
    x3 = torch.randn(3, 5, 8)  # another batch than the sample's, through one exported program on PJRT CPU
    got = tpu_backend.export_program(prog, platforms=("cpu",))(x3)
    got = got[0] if isinstance(got, (list, tuple)) else got
    assert rel_err(np.asarray(got), m(x3).detach()) <= 1e-5


def test_no_linear_where_the_caller_asked_for_linear_decomposed():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prog = prepare(Hand("t_bias").eval(), (torch.randn(3, 8),), keep=frozenset())
    assert aten.linear.default not in {n.target for n in _ops(prog)}
