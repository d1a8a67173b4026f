"""Complex arithmetic inside a graph becomes real arithmetic on (real, imaginary) pairs in a trailing axis of 2.

Neither backend lowers complex ops (torch.polar, view_as_complex, complex products), and a model may still
compute with them between real inputs and outputs: Llama 4's RoPE is ``torch.polar`` of its angles, a
``view_as_complex`` of q and k times it, and ``view_as_real`` back. Each complex value becomes the real tensor
``torch.view_as_real`` would give (``view_as_complex`` / ``view_as_real`` are then that tensor itself), so the
products are the same float operations (re = ac - bd, im = ad + bc).

Only a closed region is rewritten: every op reading or writing a complex value is in ``_RULES`` in a form it
rewrites (``_FORMS``), and no input, weight or output is complex. A signature with anything else complex is left
as it was, and the backend's op check names what it cannot lower.
"""

from __future__ import annotations

import torch

from .._torch_compat import tree_leaves
from ..program import Program
from ._util import fake_mode_of

__all__ = ["lower_complex"]

aten = torch.ops.aten
_META = ("stack_trace", "nn_module_stack", "source_fn_stack")


def lower_complex(prog: Program) -> None:
    for sig in prog.signatures.values():
        nodes = [n for n in sig.graph.nodes if _touches_complex(n)]
        if nodes and all(_rewritable(n) for n in nodes):
            _Rewrite(sig).run(nodes)


def _rewritable(n) -> bool:
    return n.op == "call_function" and n.target in _RULES and _FORMS.get(n.target, _any)(*n.args, **n.kwargs)


def _complex(v) -> bool:
    return any(isinstance(t, torch.Tensor) and t.dtype.is_complex for t in tree_leaves(v))


def _touches_complex(n) -> bool:
    return _complex(n.meta.get("val")) or any(_complex(a.meta.get("val")) for a in n.all_input_nodes)


class _Rewrite:
    def __init__(self, sig):
        self.graph, self.mode, self.real = sig.graph, fake_mode_of(sig), {}  # complex node -> its real pair node

    def run(self, nodes) -> None:
        for n in nodes:
            with self.graph.inserting_before(n):
                self.at = n
                out = _RULES[n.target](self, n, *n.args, **n.kwargs)
            if _complex(n.meta.get("val")):
                self.real[n] = out
            else:  # view_as_real: its readers read the pair
                n.replace_all_uses_with(out)
        for n in reversed(nodes):
            if not n.users:
                self.graph.erase_node(n)

    def call(self, target, *args):
        node = self.graph.call_function(target, args)
        vals = torch.fx.node.map_arg(args, lambda a: a.meta["val"])
        with self.mode:
            node.meta["val"] = target(*vals)
        for k in _META:
            if k in self.at.meta:
                node.meta[k] = self.at.meta[k]
        return node

    def pair(self, c):
        return self.real[c]

    def parts(self, c):
        """The real and imaginary parts of complex node ``c``, each [..., 1] (they broadcast like the pair)."""
        r = self.pair(c)
        return self.call(aten.slice.Tensor, r, -1, 0, 1), self.call(aten.slice.Tensor, r, -1, 1, 2)

    def join(self, re, im):
        return self.call(aten.cat.default, [re, im], -1)


def _rank(n) -> int:
    return n.meta["val"].dim()


def _dim(n, d: int, extra: int = 0) -> int:
    """Dim ``d`` of complex ``n`` (of an op adding ``extra`` dims) as a non-negative dim, which is the same
    dim of the pair (its trailing axis comes after every complex dim)."""
    return d + _rank(n) + extra if d < 0 else d


def _is_complex_node(x) -> bool:
    return isinstance(x, torch.fx.Node) and _complex(x.meta.get("val"))


def _polar(rw, n, magnitude, angle):
    mag = rw.call(aten.unsqueeze.default, magnitude, -1)
    ang = rw.call(aten.unsqueeze.default, angle, -1)
    return rw.join(rw.call(aten.mul.Tensor, mag, rw.call(aten.cos.default, ang)),
                   rw.call(aten.mul.Tensor, mag, rw.call(aten.sin.default, ang)))


def _view_as_complex(rw, n, x):
    return x


def _view_as_real(rw, n, c):
    return rw.pair(c)


def _mul(rw, n, a, b):
    if not _is_complex_node(a):
        a, b = b, a
    if _is_complex_node(b):  # (a + bi)(c + di) = (ac - bd) + (ad + bc)i
        (ar, ai), (br, bi) = rw.parts(a), rw.parts(b)
        return rw.join(rw.call(aten.sub.Tensor, rw.call(aten.mul.Tensor, ar, br), rw.call(aten.mul.Tensor, ai, bi)),
                       rw.call(aten.add.Tensor, rw.call(aten.mul.Tensor, ar, bi), rw.call(aten.mul.Tensor, ai, br)))
    if isinstance(b, torch.fx.Node):  # a real tensor scales both parts
        return rw.call(aten.mul.Tensor, rw.pair(a), rw.call(aten.unsqueeze.default, b, -1))
    return rw.call(aten.mul.Tensor, rw.pair(a), b)


def _add_sub(target):
    def rule(rw, n, a, b, alpha=1):
        other = rw.pair(b) if alpha == 1 else rw.call(aten.mul.Tensor, rw.pair(b), alpha)
        return rw.call(target, rw.pair(a), other)
    return rule


def _unsqueeze(rw, n, c, d):
    return rw.call(aten.unsqueeze.default, rw.pair(c), _dim(c, d, 1))


def _view(target):
    def rule(rw, n, c, shape):
        return rw.call(target, rw.pair(c), [*shape, 2])
    return rule


def _slice(rw, n, c, dim=0, start=None, end=None, step=1):
    return rw.call(aten.slice.Tensor, rw.pair(c), _dim(c, dim), start, end, step)


def _select(rw, n, c, dim, index):
    return rw.call(aten.select.int, rw.pair(c), _dim(c, dim), index)


def _permute(rw, n, c, dims):
    return rw.call(aten.permute.default, rw.pair(c), [_dim(c, d) for d in dims] + [_rank(c)])


def _transpose(rw, n, c, d0, d1):
    return rw.call(aten.transpose.int, rw.pair(c), _dim(c, d0), _dim(c, d1))


def _squeeze_dims(rw, n, c, dims):
    return rw.call(aten.squeeze.dims, rw.pair(c), [_dim(c, d) for d in dims])


def _same(target):
    def rule(rw, n, c):
        return rw.call(target, rw.pair(c))
    return rule


def _to_copy(rw, n, c, dtype=None, **kwargs):
    return rw.call(aten.clone.default, rw.pair(c))


def _cat(rw, n, tensors, dim=0):
    return rw.call(aten.cat.default, [rw.pair(t) for t in tensors], _dim(tensors[0], dim))


def _any(*args, **kwargs) -> bool:
    return True


def _mul_form(a, b) -> bool:  # a complex node times a complex node, a real tensor or a real number
    return (_is_complex_node(a) or _is_complex_node(b)) and not isinstance(a, complex) and not isinstance(b, complex)


def _add_sub_form(a, b, alpha=1) -> bool:
    return _is_complex_node(a) and _is_complex_node(b) and not isinstance(alpha, complex)


def _to_copy_form(c, dtype=None, **kwargs) -> bool:  # a copy, not a cast
    return dtype is None or dtype == c.meta["val"].dtype


def _cat_form(tensors, dim=0) -> bool:
    return all(_is_complex_node(t) for t in tensors)


# the forms of the listed ops that the rules rewrite (any other: the signature is left as it was)
_FORMS = {aten.mul.Tensor: _mul_form, aten.add.Tensor: _add_sub_form, aten.sub.Tensor: _add_sub_form,
          aten._to_copy.default: _to_copy_form, aten.cat.default: _cat_form}

_RULES = {
    aten.polar.default: _polar,
    aten.view_as_complex.default: _view_as_complex,
    aten.view_as_real.default: _view_as_real,
    aten.mul.Tensor: _mul,
    aten.add.Tensor: _add_sub(aten.add.Tensor),
    aten.sub.Tensor: _add_sub(aten.sub.Tensor),
    aten.unsqueeze.default: _unsqueeze,
    aten.view.default: _view(aten.view.default),
    aten._unsafe_view.default: _view(aten.view.default),
    aten.reshape.default: _view(aten.reshape.default),
    aten.expand.default: _view(aten.expand.default),
    aten.slice.Tensor: _slice,
    aten.select.int: _select,
    aten.permute.default: _permute,
    aten.transpose.int: _transpose,
    aten.squeeze.dims: _squeeze_dims,
    aten.clone.default: _same(aten.clone.default),
    aten.alias.default: _same(aten.alias.default),
    aten._to_copy.default: _to_copy,
    aten.cat.default: _cat,
}
