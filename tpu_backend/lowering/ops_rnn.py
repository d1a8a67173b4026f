"""Recurrent layers kept whole (nn.LSTM, nn.RNN): one ``lax.scan`` over time per layer and direction.

The input projection x W_ih^T + b_ih + b_hh of every step is one matmul before the scan; the scan
carries (h, c) and does only the recurrent product. Kept whole because torch's decomposition unrolls
the sequence (one copy of the cell per step: nn.LSTM(256, 256, 2) over 100 steps took 7.4 s to compile on
XLA:CPU unrolled against 0.34 s as scans, for 5.8 vs 7.2 ms a call) and, on CPU with mkldnn, emits
``mkldnn_rnn_layer``, which no backend lowers.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch

from .helpers import cast
from .registry import lowering

__all__ = []

aten = torch.ops.aten


def _groups(params, has_biases: bool, num_layers: int, dirs: int):
    """params as one (w_ih, w_hh, b_ih, b_hh, w_hr) per (layer, direction), torch's order; None where absent
    (torch's aten.lstm puts the projection weight w_hr last in each group when proj_size > 0)."""
    n = len(params) // (num_layers * dirs)
    base = 4 if has_biases else 2
    out = []
    for k in range(num_layers * dirs):
        g = list(params[k * n:(k + 1) * n])
        w_ih, w_hh = g[0], g[1]
        b_ih, b_hh = (g[2], g[3]) if has_biases else (None, None)
        out.append((w_ih, w_hh, b_ih, b_hh, g[base] if n > base else None))
    return out


def _refuse_training_dropout(op: str, dropout, train, num_layers) -> None:
    if train and dropout > 0 and num_layers > 1:
        raise NotImplementedError(f"{op} with dropout={dropout} in training mode (dropout between layers is random); "
                                  "call module.eval() before converting (eval mode has no dropout)")


def _run(ctx, x, h0s, params, has_biases, num_layers, bidirectional, batch_first, cell):
    """The layers over x ([T, B, I], or [B, T, I] with batch_first); h0s: one [L*D, B, *] array per state.
    ``cell(gates, state, w_hr) -> (h, state)``. Returns (output, one [L*D, B, *] final array per state)."""
    dt = ctx.out_dtype
    prec = ctx.precision()
    dirs = 2 if bidirectional else 1
    y = cast(x, dt)
    if batch_first:
        y = jnp.swapaxes(y, 0, 1)
    finals = [[] for _ in h0s]
    groups = _groups(params, has_biases, num_layers, dirs)
    for layer in range(num_layers):
        outs = []
        for d in range(dirs):
            k = layer * dirs + d
            w_ih, w_hh, b_ih, b_hh, w_hr = (None if p is None else cast(p, dt) for p in groups[k])
            xw = jax.lax.dot_general(y, w_ih, (((2,), (1,)), ((), ())), precision=prec)
            if b_ih is not None:
                xw = xw + (b_ih + b_hh)

            def step(carry, xt, w_hh=w_hh, w_hr=w_hr):
                h, state = carry
                gates = xt + jax.lax.dot_general(h, w_hh, (((1,), (1,)), ((), ())), precision=prec)
                h, state = cell(gates, state, w_hr)
                return (h, state), h

            init = tuple(cast(h0[k], dt) for h0 in h0s)
            (h, state), ys = jax.lax.scan(step, (init[0], init[1:]), xw, reverse=d == 1)
            outs.append(ys)
            for lst, v in zip(finals, (h, *state)):
                lst.append(v)
        y = outs[0] if dirs == 1 else jnp.concatenate(outs, axis=-1)
    if batch_first:
        y = jnp.swapaxes(y, 0, 1)
    return y, tuple(jnp.stack(lst) for lst in finals)


def _lstm_cell(prec):
    def cell(gates, state, w_hr):
        (c,) = state
        i, f, g, o = jnp.split(gates, 4, axis=-1)  # torch's gate order
        c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
        h = jax.nn.sigmoid(o) * jnp.tanh(c)
        if w_hr is not None:
            h = jax.lax.dot_general(h, w_hr, (((1,), (1,)), ((), ())), precision=prec)
        return h, (c,)
    return cell


# aten::lstm.input(Tensor input, Tensor[] hx, Tensor[] params, bool has_biases, int num_layers, float dropout,
#                  bool train, bool bidirectional, bool batch_first) -> (Tensor, Tensor, Tensor)
@lowering(aten.lstm.input)
def lstm(ctx, x, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first):
    _refuse_training_dropout("aten.lstm", dropout, train, num_layers)
    y, (h, c) = _run(ctx, x, list(hx), params, has_biases, num_layers, bidirectional, batch_first,
                     _lstm_cell(ctx.precision()))
    return y, h, c


def _rnn(ctx, x, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first, act, op):
    _refuse_training_dropout(op, dropout, train, num_layers)

    def cell(gates, state, w_hr):
        return act(gates), state

    y, (h,) = _run(ctx, x, [hx], params, has_biases, num_layers, bidirectional, batch_first, cell)
    return y, h


# aten::rnn_tanh.input(Tensor input, Tensor hx, Tensor[] params, bool has_biases, int num_layers, float dropout,
#                      bool train, bool bidirectional, bool batch_first) -> (Tensor, Tensor)
@lowering(aten.rnn_tanh.input)
def rnn_tanh(ctx, x, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first):
    return _rnn(ctx, x, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first, jnp.tanh,
                "aten.rnn_tanh")


# aten::rnn_relu.input(Tensor input, Tensor hx, Tensor[] params, bool has_biases, int num_layers, float dropout,
#                      bool train, bool bidirectional, bool batch_first) -> (Tensor, Tensor)
@lowering(aten.rnn_relu.input)
def rnn_relu(ctx, x, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first):
    return _rnn(ctx, x, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first,
                jax.nn.relu, "aten.rnn_relu")
