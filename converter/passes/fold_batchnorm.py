"""Fold eval-mode BatchNorm into the convolution or linear layer that feeds it."""

from __future__ import annotations

import operator

import torch

from ..program import Program
from ._util import add_weight, weight_of

aten = torch.ops.aten
_BN = aten._native_batch_norm_legit_no_training.default


def fold_batchnorm(prog: Program) -> None:
    for sig in prog.signatures.values():
        for bn in [n for n in sig.graph.nodes if n.op == "call_function" and n.target == _BN]:
            _fold_one(prog, sig, bn)


def _fold_one(prog, sig, bn) -> bool:
    x, gamma, beta, mean, var = bn.args[:5]
    eps = bn.args[6] if len(bn.args) > 6 else bn.kwargs.get("eps", 1e-5)
    producer = x
    # aten.sym_size.int readers (dynamic dims: a later op reads this value's sizes) do not count: the folded
    # producer has the same sizes
    if not isinstance(producer, torch.fx.Node) or sum(u.target is not aten.sym_size.int for u in producer.users) != 1:
        return False
    stats = [weight_of(prog, a) if a is not None else None for a in (gamma, beta, mean, var)]
    if (stats[2] is None or stats[3] is None or (gamma is not None and stats[0] is None)
            or (beta is not None and stats[1] is None)):
        return False
    if any(u.target is not operator.getitem for u in bn.users) or any(u.args[1] != 0 for u in bn.users if u.users):
        return False
    g, b, m, v = stats
    scale = (g if g is not None else 1.0) / torch.sqrt(v.double() + eps)
    shift_base = b if b is not None else 0.0

    if producer.target == aten.convolution.default:
        w_node, b_node = producer.args[1], producer.args[2]
        transposed, groups = producer.args[6], producer.args[8]
        w = weight_of(prog, w_node)
        if w is None or (b_node is not None and weight_of(prog, b_node) is None):
            return False
        if transposed and groups != 1:
            return False
        shape = [1] * w.dim()
        shape[1 if transposed else 0] = -1
        new_w = (w.double() * scale.reshape(shape)).to(w.dtype)
        bias_idx = 2
    elif producer.target == aten.linear.default and producer.meta["val"].dim() == 2:
        w_node = producer.args[1]
        b_node = producer.args[2] if len(producer.args) > 2 else None
        w = weight_of(prog, w_node)
        if w is None or (b_node is not None and weight_of(prog, b_node) is None):
            return False
        new_w = (w.double() * scale[:, None]).to(w.dtype)
        bias_idx = 2
    else:
        return False
    old_b = weight_of(prog, b_node) if b_node is not None else torch.zeros(scale.shape, dtype=w.dtype)
    new_b = ((old_b.double() - m.double()) * scale + shift_base).to(w.dtype)
    base = w_node.meta["weight_name"].rsplit(".", 1)[0]
    nw = add_weight(prog, sig, base + ".weight_bnfold", new_w)
    nb = add_weight(prog, sig, base + ".bias_bnfold", new_b)
    args = list(producer.args)
    while len(args) <= bias_idx:
        args.append(None)
    args[1], args[bias_idx] = nw, nb
    producer.args = tuple(args)
    for u in list(bn.users):
        u.replace_all_uses_with(producer)
        sig.graph.erase_node(u)
    sig.graph.erase_node(bn)
    return True
