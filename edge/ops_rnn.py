"""Recurrent layers kept whole (nn.LSTM, nn.RNN), unrolled over the sequence into builtins XNNPACK runs.

Per layer and direction: one FULLY_CONNECTED projects every step's input (x W_ih^T + b_ih + b_hh), then each
step is a SLICE of that, FULLY_CONNECTED of h by W_hh, ADD and the cell. The LSTM's gate rows are reordered at
conversion time from torch's (i, f, g, o) to (i, f, o, g), so one LOGISTIC and one TANH cover the four gates.

Why not LiteRT's fused UNIDIRECTIONAL_SEQUENCE_LSTM (same gate order as torch): timed on nn.LSTM(256, 256, 2),
100 steps, batch 1, median ms in ai_edge_litert 2.3.0 at 1 / 2 threads: this form 22.7 / 13.8, fused 14.3 / 14.5,
torch's own decomposition 22.9 / 14.1; with dynamic_int8 this form 6.7 / 5.3, the fused one 13.4 (ai-edge-quantizer
does not quantize it: the file stays 4.2 MB, against 1.4 MB). Faster only in float on one thread, and besides: its
h/c states must be variable tensors, which carry the last call's final state into the next call (a second call of
one interpreter was 0.56 off torch) unless an op overwrites them first; it has no c_n output; XNNPACK does not take
it, so it runs on one thread.
"""

from __future__ import annotations

import operator

import numpy as np
import torch

from ..converter import layout as L
from .registry import lowering
from .values import Val

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
        b_ih, b_hh = (g[2], g[3]) if has_biases else (None, None)
        out.append((g[0], g[1], b_ih, b_hh, g[base] if n > base else None))
    return out


def _check(op, x, hx, params, dropout, train, num_layers) -> None:
    if train and dropout > 0 and num_layers > 1:
        raise NotImplementedError(f"{op} with dropout={dropout} in training mode (dropout between layers is random); "
                                  "call module.eval() before converting (eval mode has no dropout)")
    if not x.static or any(not h.static for h in hx):
        raise NotImplementedError(f"{op} over a dynamic dim (input {x.shape}): the edge form is unrolled for "
                                  "one size; export it with static shapes")
    if not all(p.is_const for p in params):
        raise NotImplementedError(f"{op} with weights computed at run time: the edge form needs them constant "
                                  "(module parameters)")


class _Emit:
    """Plain-layout, static-shape builtins on tensor indices: the unrolled steps write thousands of them."""

    def __init__(self, lw, dtype):
        self.lw, self.dt = lw, np.dtype(dtype)

    def op(self, op, ins, shape, opts=None):
        (t,), _ = self.lw.emit(op, ins, [tuple(shape)], [self.dt], opts, suffix=op.lower())
        return t

    def const(self, a):
        return self.lw.const_tensor(np.ascontiguousarray(a, self.dt))

    def fc(self, t, w, b, rows):
        """[rows, K] x w[N, K]^T (+ b) as FULLY_CONNECTED."""
        opts = self.lw.options("FullyConnected", keepNumDims=False, fusedActivationFunction=0)
        return self.op("FULLY_CONNECTED", [t, self.const(w), None if b is None else self.const(b)],
                       (rows, w.shape[0]), opts)

    def slice(self, t, begin, size):
        return self.op("SLICE", [t, self.lw.const_tensor(np.array(begin, np.int32)),
                                 self.lw.const_tensor(np.array(size, np.int32))], size)

    def binary(self, op, a, b, shape, act=0):
        kind = {"ADD": "Add", "MUL": "Mul"}[op]
        return self.op(op, [a, b], shape, self.lw.options(kind, fusedActivationFunction=act))

    def concat(self, ts, axis, shape):
        if len(ts) == 1:
            return ts[0]
        return self.op("CONCATENATION", ts, shape, self.lw.options("Concatenation", axis=axis))

    def reshape(self, t, shape):
        return self.lw.reshape_tensor(t, tuple(shape), self.dt)


def _lstm_cell(e: _Emit, B, H, w_hr):
    """gates [B, 4H] in (i, f, o, g) order, c [B, H] or None (zeros) -> (h, c)."""
    def cell(gates, c):
        sig = e.op("LOGISTIC", [e.slice(gates, [0, 0], [B, 3 * H])], (B, 3 * H))
        g = e.op("TANH", [e.slice(gates, [0, 3 * H], [B, H])], (B, H))
        i, f, o = (e.slice(sig, [0, k * H], [B, H]) for k in range(3))
        ig = e.binary("MUL", i, g, (B, H))
        c = ig if c is None else e.binary("ADD", e.binary("MUL", f, c, (B, H)), ig, (B, H))
        h = e.binary("MUL", o, e.op("TANH", [c], (B, H)), (B, H))
        if w_hr is not None:
            h = e.fc(h, w_hr, None, B)
        return h, c
    return cell


def _ifog(a):
    """torch's gate blocks (i, f, g, o) along axis 0 as (i, f, o, g)."""
    i, f, g, o = np.split(a, 4)
    return np.concatenate([i, f, o, g])


def _run(lw, x, states, params, has_biases, num_layers, bidirectional, batch_first, make_cell, gate_rows, reorder):
    """The layers unrolled. ``states``: one constant-or-tensor Val [L*D, B, *] per state (h first); a constant
    all-zero state skips its step-0 products. Returns (output Val, one [L*D, B, *] Val per state used)."""
    e = _Emit(lw, lw.out_dtype)
    dirs = 2 if bidirectional else 1
    B, T = (x.shape[0], x.shape[1]) if batch_first else (x.shape[1], x.shape[0])
    used = {u.args[1] for u in lw.node.users if u.target is operator.getitem}
    # steps are rows of a 2-D [T*B, G] (time-major) or column blocks of [B, T*G] (batch-first): one SLICE each
    xt = lw.tensor(x, L.identity(3))
    cur, width = e.reshape(xt, (B * T, x.shape[2])), x.shape[2]
    finals = [[] for _ in states]
    groups = _groups(params, has_biases, num_layers, dirs)
    for layer in range(num_layers):
        outs = []
        for d in range(dirs):
            k = layer * dirs + d
            w_ih, w_hh, b_ih, b_hh, w_hr = (None if p is None else p.const for p in groups[k])
            bias = None if b_ih is None else b_ih.astype(np.float64) + b_hh.astype(np.float64)
            if reorder:
                w_ih, w_hh, bias = _ifog(w_ih), _ifog(w_hh), None if bias is None else _ifog(bias)
            G = gate_rows(w_hh)
            proj = e.fc(cur, w_ih, bias, B * T)  # [B*T or T*B, G]
            if batch_first:
                proj = e.reshape(proj, (B, T * G))
            vals = []
            for s in states:
                v = s.const[k] if s.is_const else None
                if v is not None and not v.any():
                    vals.append(None)
                elif v is not None:
                    vals.append(e.const(v))
                else:
                    vals.append(e.slice(lw.tensor(s, L.identity(3)), [k, 0, 0], [1, B, s.shape[2]]))
                    vals[-1] = e.reshape(vals[-1], (B, s.shape[2]))
            h, rest = vals[0], vals[1:]
            cell = make_cell(e, B, w_hr)
            steps = [None] * T
            for t in (range(T) if d == 0 else range(T - 1, -1, -1)):
                xs = e.slice(proj, [0, t * G], [B, G]) if batch_first else e.slice(proj, [t * B, 0], [B, G])
                gates = xs if h is None else e.binary("ADD", xs, e.fc(h, w_hh, None, B), (B, G))
                h, *rest = cell(gates, *rest)
                steps[t] = h
            hout = w_hh.shape[1]
            outs.append(steps)
            for lst, v in zip(finals, (h, *rest)):
                lst.append(v)
        # this layer's output, [T*B, D*Hout] time-major or [B, T*D*Hout] batch-first
        if dirs == 1:
            per_step = outs[0]
        else:
            per_step = [e.concat([outs[0][t], outs[1][t]], 1, (B, 2 * hout)) for t in range(T)]
        width = dirs * hout
        cur = (e.concat(per_step, 1, (B, T * width)) if batch_first
               else e.concat(per_step, 0, (T * B, width)))
        if batch_first and layer + 1 < num_layers:
            cur = e.reshape(cur, (B * T, width))
    shape = (B, T, width) if batch_first else (T, B, width)
    out = Val(shape, e.dt, L.identity(3), tensor=e.reshape(cur, shape))
    final_vals = []
    for j, (lst, s) in enumerate(zip(finals, states)):
        if j + 1 not in used:
            final_vals.append(None)  # no reader: not written
            continue
        n = s.shape[2]
        t = e.reshape(e.concat(lst, 0, (len(lst) * B, n)), (len(lst), B, n))
        final_vals.append(Val((len(lst), B, n), e.dt, L.identity(3), tensor=t))
    return out, final_vals


# lstm.input(Tensor input, Tensor[] hx, Tensor[] params, bool has_biases, int num_layers, float dropout, bool train,
#            bool bidirectional, bool batch_first) -> (Tensor, Tensor, Tensor)
@lowering(aten.lstm.input)
def lstm(lw, x, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first):
    _check("aten.lstm", x, hx, params, dropout, train, num_layers)
    H = hx[1].shape[2]

    def make_cell(e, B, w_hr):
        return _lstm_cell(e, B, H, w_hr)

    out, (h, c) = _run(lw, x, list(hx), params, has_biases, num_layers, bidirectional, batch_first, make_cell,
                       lambda w_hh: 4 * H, reorder=True)
    return out, h, c


def _rnn(lw, x, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first, op):
    _check(f"aten.{op}", x, [hx], params, dropout, train, num_layers)

    def make_cell(e, B, w_hr):
        H = hx.shape[2]
        if op == "rnn_relu":
            return lambda gates: (e.op("RELU", [gates], (B, H)),)
        return lambda gates: (e.op("TANH", [gates], (B, H)),)

    out, (h,) = _run(lw, x, [hx], params, has_biases, num_layers, bidirectional, batch_first, make_cell,
                     lambda w_hh: w_hh.shape[0], reorder=False)
    return out, h


# rnn_tanh.input(Tensor input, Tensor hx, Tensor[] params, bool has_biases, int num_layers, float dropout,
#                bool train, bool bidirectional, bool batch_first) -> (Tensor, Tensor)
@lowering(aten.rnn_tanh.input)
def rnn_tanh(lw, x, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first):
    return _rnn(lw, x, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first, "rnn_tanh")


# rnn_relu.input(Tensor input, Tensor hx, Tensor[] params, bool has_biases, int num_layers, float dropout,
#                bool train, bool bidirectional, bool batch_first) -> (Tensor, Tensor)
@lowering(aten.rnn_relu.input)
def rnn_relu(lw, x, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first):
    return _rnn(lw, x, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first, "rnn_relu")
