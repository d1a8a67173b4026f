"""nn.LSTM / nn.RNN as modules on both backends, against torch eager: the forms the op-table rows (tests/op_rows.py,
``lstm*`` / ``rnn_*``) do not reach — the module's own call (on CPU torch would decompose it to mkldnn_rnn_layer),
repeated calls of one interpreter, dynamic_int8 on the edge, a dynamic batch, and the refusals."""

from __future__ import annotations

import warnings

import jax
import numpy as np
import pytest
import torch
import torch.utils._pytree as pytree
from jax import export as jax_export
from torch import nn

from tests.numerics import rel_err
from tpu_export import converter, litert_torch
from tpu_export.converter.errors import ConversionError
from tpu_export.edge import op_histogram
from tpu_export.tpu_backend.lowering import lower_signature


class _Call(nn.Module):
    def __init__(self, rnn):
        super().__init__()
        self.rnn = rnn

    def forward(self, x, *state):
        out, h = self.rnn(x, *state) if state else self.rnn(x)
        return (out, *h) if isinstance(h, tuple) else (out, h)


def _lstm(seed=0, **kw):
    torch.manual_seed(seed)
    return _Call(nn.LSTM(**{"input_size": 16, "hidden_size": 32, **kw})).eval()


def _want(module, args):
    with torch.no_grad():
        return [t.numpy() for t in pytree.tree_leaves(module(*args))]


def _edge(module, args, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return litert_torch.convert(module, args, **kw)


def _tpu_run(module, args):
    prog = converter.prepare(module, args)
    lowered = lower_signature(prog, platforms=("cpu",))
    return lowered.fn(lowered.weight_arrays(prog), *[a.numpy() for a in pytree.tree_leaves(args)])


def _errs(got, want) -> list[float]:
    return [rel_err(np.asarray(g), w) for g, w in zip(pytree.tree_leaves(got), want)]


@pytest.mark.parametrize("kw", [dict(num_layers=2, bidirectional=True), dict(num_layers=2, batch_first=True)],
                         ids=["2layer_bidirectional", "2layer_batch_first"])
def test_lstm_module_on_both_backends(kw):
    """The module as users call it (torch's CPU decomposition would give mkldnn_rnn_layer, lowered by neither)."""
    module = _lstm(**kw)
    x = torch.randn((3, 20, 16) if kw.get("batch_first") else (20, 3, 16))
    want = _want(module, (x,))
    model = _edge(module, (x,))
    assert "UNIDIRECTIONAL_SEQUENCE_LSTM" not in op_histogram(model.tflite_model())
    assert max(_errs(model(x), want)) <= 1e-5
    assert max(_errs(_tpu_run(module, (x,)), want)) <= 1e-5


def test_repeated_calls_start_from_the_given_state():
    """One interpreter, three calls with other inputs and states: nothing carried between calls."""
    module = _lstm(num_layers=2)
    args = (torch.randn(6, 2, 16), (torch.randn(2, 2, 32), torch.randn(2, 2, 32)))
    model = _edge(module, args)
    for seed in range(3):
        g = torch.Generator().manual_seed(seed)
        run = (torch.randn(6, 2, 16, generator=g), (torch.randn(2, 2, 32, generator=g),
                                                     torch.randn(2, 2, 32, generator=g)))
        assert max(_errs(model(*run), _want(module, run))) <= 1e-5


def test_dynamic_int8_lstm_on_the_edge():
    """int8 weights (dynamic range) in every FULLY_CONNECTED: measured 5.6e-3 (output), 1.2e-2 (h_n), 6.3e-3 (c_n)
    here; 9.8e-3 on the output at hidden 256, 100 steps."""
    module = _lstm(num_layers=2, bidirectional=True, proj_size=8)
    x = torch.randn(12, 2, 16)
    want = _want(module, (x,))
    model = _edge(module, (x,), quant_config="dynamic_int8")
    errs = _errs(model(x), want)
    assert max(errs) <= 3e-2, errs  # int8 weights: ~1/254 of each row's range, through 12 steps
    assert max(errs) > 1e-5, errs  # quantized, not the float file


def test_rnn_relu_module_on_both_backends():
    torch.manual_seed(0)
    module = _Call(nn.RNN(16, 32, 2, nonlinearity="relu", bidirectional=True, batch_first=True)).eval()
    x, h0 = torch.randn(2, 9, 16), torch.randn(4, 2, 32)
    want = _want(module, (x, h0))
    assert max(_errs(_edge(module, (x, h0))(x, h0), want)) <= 1e-5
    assert max(_errs(_tpu_run(module, (x, h0)), want)) <= 1e-5


def test_dynamic_batch_runs_on_tpu_and_is_refused_by_name_on_the_edge():
    module = _lstm(num_layers=2, bidirectional=True)
    x = torch.randn(7, 2, 16)
    dyn = ({1: torch.export.Dim("batch", min=1, max=16)},)
    prog = converter.prepare(module, (x,), dynamic_shapes=dyn)
    lowered = lower_signature(prog)
    w_avals, in_avals = lowered.abstract_args()
    exported = jax_export.export(jax.jit(lowered.fn), platforms=["cpu"])(w_avals, *in_avals)
    for n in (1, 5):
        xn = torch.randn(7, n, 16)
        got = exported.call(lowered.weight_arrays(prog), xn.numpy())
        assert max(_errs(got, _want(module, (xn,)))) <= 1e-5
    with pytest.raises(ConversionError, match=r"aten.lstm.input[\s\S]*dynamic dim[\s\S]*static shapes"):
        _edge(module, (x,), dynamic_shapes=dyn)


def test_dynamic_sequence_length_is_refused_by_torch_export():
    """torch.export itself specializes an RNN's sequence dim (its kernel loops over the steps): the capture's
    refusal, before any backend sees the op."""
    module = _lstm()
    with pytest.raises(ConversionError, match=r"forced to a fixed value[\s\S]*Constraints violated \(seq\)"):
        converter.prepare(module, (torch.randn(7, 2, 16),), dynamic_shapes=({0: torch.export.Dim("seq", max=64)},))


class _TrainingLSTM(nn.Module):
    """aten.lstm called with train=True and dropout (a module left in training mode is converted in eval mode)."""

    def __init__(self, lstm):
        super().__init__()
        self.lstm = lstm

    def forward(self, x):
        m = self.lstm
        return torch.lstm(x, [x.new_zeros(2, x.shape[1], 32)] * 2, m._flat_weights, True, 2, 0.5, True, False,
                          False)[0]


@pytest.mark.parametrize("backend", ["edge", "tpu"])
def test_dropout_in_training_mode_is_refused_by_name(backend):
    module = _TrainingLSTM(_lstm(num_layers=2).rnn).eval()
    x = torch.randn(5, 2, 16)
    with pytest.raises(ConversionError, match=r"aten.lstm.*dropout=0.5 in training mode.*module.eval\(\)"):
        if backend == "edge":
            _edge(module, (x,))
        else:
            _tpu_run(module, (x,))


def test_a_module_left_in_training_mode_converts_without_dropout():
    module = _lstm(num_layers=2, dropout=0.5)
    x = torch.randn(5, 2, 16)
    model = _edge(module.train(), (x,))
    assert max(_errs(model(x), _want(module.eval(), (x,)))) <= 1e-5
