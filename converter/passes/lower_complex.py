"""Complex arithmetic inside a graph becomes real arithmetic on (real, imaginary) pairs in a trailing axis of 2.

Neither backend lowers complex ops (torch.polar, view_as_complex, complex products), and a model may still
compute with them between real inputs and outputs: Llama 4's RoPE is ``torch.polar`` of its angles, a
``view_as_complex`` of q and k times it, and ``view_as_real`` back. Each complex value becomes the real tensor
``torch.view_as_real`` would give (``view_as_complex`` / ``view_as_real`` are then that tensor itself), so the
products are the same float operations (re = ac - bd, im = ad + bc); a matrix product of complex values is
real matrix products of the parts (FNet's DFT matrices, complex weights stored as their pairs, in an einsum).

Discrete Fourier transforms over dims of static size (``_fft_r2c``, ``_fft_c2c`` forward and inverse,
``_fft_c2r``: torch.fft's fft / ifft / fftn / rfft / irfft, FNet's ``fftn(x, dim=(1, 2)).real``) become one pair
of real matmuls per transformed dim with constant cos / sin matrices (the normalization folded in): with
x = a + ib and θ = 2πjk/n, X_k = Σ_j a_j cos θ + s b_j sin θ + i (b_j cos θ - s a_j sin θ), s = +1 forward,
-1 inverse. A real input (``_fft_r2c``, or a real tensor cast to complex) skips its zero imaginary half, and a
``.real`` / ``.imag`` of the result reads only the matmul that computes it.

Only a closed region is rewritten: every op reading or writing a complex value is in ``_RULES`` in a form it
rewrites (``_FORMS``), and no input or output is complex. A signature with anything else complex is left
as it was, and the backend's op check names what it cannot lower (an FFT over a dim of dynamic size, an FFT whose
complex result is read by an op without a rule, such as ``abs``).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from .._torch_compat import tree_leaves
from ..program import Program
from ._util import add_weight, fake_mode_of, node_maker

__all__ = ["lower_complex"]

aten = torch.ops.aten


def lower_complex(prog: Program) -> None:
    for sig in prog.signatures.values():
        nodes = [n for n in sig.graph.nodes if _touches_complex(n)]
        if nodes and all(_rewritable(n) for n in nodes):
            _Rewrite(prog, sig).run(nodes)


def _rewritable(n) -> bool:
    if n.op == "placeholder":  # a complex weight (FNet's DFT matrices) is stored as its pair; an input is not
        return "weight_name" in n.meta
    return n.op == "call_function" and n.target in _RULES and _FORMS.get(n.target, _any)(*n.args, **n.kwargs)


def _complex(v) -> bool:
    return any(isinstance(t, torch.Tensor) and t.dtype.is_complex for t in tree_leaves(v))


def _touches_complex(n) -> bool:
    return _complex(n.meta.get("val")) or any(_complex(a.meta.get("val")) for a in n.all_input_nodes)


class _Rewrite:
    def __init__(self, prog, sig):
        self.prog, self.sig = prog, sig
        self.graph, self.mode, self.real = sig.graph, fake_mode_of(sig), {}  # complex node -> its real pair node
        self.from_real = {}  # complex node cast from a real tensor -> that tensor (its imaginary part is 0)
        self.weights = {}  # (name, dtype) -> the weight placeholder of a DFT matrix
        self.joins = {}  # pair nodes built as cat([re, im], -1) of [..., 1] parts (a dict: in graph order)

    def run(self, nodes) -> None:
        for n in nodes:
            if n.op == "placeholder":
                w = self.prog.weights[n.meta["weight_name"]]
                self.real[n] = add_weight(self.prog, self.sig, n.meta["weight_name"] + ".pair",
                                          torch.view_as_real(w).clone())
                continue
            with self.graph.inserting_before(n):
                self.at = n
                out = _RULES[n.target](self, n, *n.args, **n.kwargs)
            if _complex(n.meta.get("val")):
                self.real[n] = out
            else:  # view_as_real: its readers read the pair
                n.replace_all_uses_with(out)
        self._read_parts_directly()
        for n in reversed(nodes):
            if not n.users:
                self.graph.erase_node(n)

    def _read_parts_directly(self) -> None:
        """``select(cat([re, im], -1), -1, i)`` (a ``.real`` / ``.imag``) reads that part itself, so the part
        nobody else reads is dead code (an FFT's last matmul for the half not asked for)."""
        for join in self.joins:
            for u in list(join.users):
                if u.op != "call_function" or u.target is not aten.select.int or len(u.args) != 3:
                    continue
                _, d, i = u.args
                rank = join.meta["val"].dim()
                if d % rank != rank - 1 or i not in (0, 1, -1, -2):
                    continue
                part = join.args[0][i % 2]
                if part.target is aten.unsqueeze.default and part.args[1] in (-1, rank - 1):
                    u.replace_all_uses_with(part.args[0])
                else:
                    with self.graph.inserting_before(u):
                        self.at = u
                        u.replace_all_uses_with(self.call(aten.select.int, part, -1, 0))
                self.graph.erase_node(u)

    def call(self, target, *args, **kwargs):
        return node_maker(self.graph, self.mode, self.at)(target, *args, **kwargs)  # the node being rewritten's line

    def pair(self, c):
        return self.real[c]

    def parts(self, c):
        """The real and imaginary parts of complex node ``c``, each [..., 1] (they broadcast like the pair)."""
        r = self.pair(c)
        return self.call(aten.slice.Tensor, r, -1, 0, 1), self.call(aten.slice.Tensor, r, -1, 1, 2)

    def join(self, re, im):
        node = self.call(aten.cat.default, [re, im], -1)
        self.joins[node] = None
        return node

    def weight(self, name, array, like):
        """A constant matrix as a weight of the program, in ``like``'s dtype (one per name and dtype: every layer
        of a model transforming the same sizes reads the same matrix)."""
        key = (name, like.meta["val"].dtype)
        if key not in self.weights:
            self.weights[key] = add_weight(self.prog, self.sig, name, torch.from_numpy(array).to(key[1]))
        return self.weights[key]

    def real_imag(self, c):
        """(re, im) of complex node ``c`` with its shape, im None where it is known to be 0 (or ``c`` is real)."""
        if not _is_complex_node(c):
            return c, None
        if c in self.from_real:
            return self.from_real[c], None
        r = self.pair(c)
        return self.call(aten.select.int, r, -1, 0), self.call(aten.select.int, r, -1, 1)


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
    def rule(rw, n, c, **kwargs):  # clone's memory_format: the pair's layout follows the complex tensor's
        return rw.call(target, rw.pair(c), **kwargs)
    return rule


def _matmul(target):
    """(A + iB)(C + iD) = (AC - BD) + i(AD + BC), each product over real tensors (a known zero part skipped)."""
    def rule(rw, n, a, b):
        (ar, ai), (br, bi) = rw.real_imag(a), rw.real_imag(b)

        def total(terms, signs):
            out = None
            for (x, y), sign in zip(terms, signs):
                if x is None or y is None:
                    continue
                prod = rw.call(target, x, y)
                out = prod if out is None else rw.call(aten.add.Tensor if sign > 0 else aten.sub.Tensor, out, prod)
            return out
        re = total([(ar, br), (ai, bi)], [1, -1])  # ar, br: always there
        im = total([(ar, bi), (ai, br)], [1, 1])
        re_u = rw.call(aten.unsqueeze.default, re, -1)
        if im is None:
            rw.from_real[n] = re
        im_u = rw.call(aten.full_like.default, re_u, 0.0) if im is None else rw.call(aten.unsqueeze.default, im, -1)
        return rw.join(re_u, im_u)
    return rule


def _to_copy(rw, n, c, dtype=None, **kwargs):
    if _is_complex_node(c):
        return rw.call(aten.clone.default, rw.pair(c))
    # a real tensor cast to complex: its pair is (x, 0)
    x = c if c.meta["val"].dtype == dtype.to_real() else rw.call(aten._to_copy.default, c, dtype.to_real())
    rw.from_real[n] = x
    re = rw.call(aten.unsqueeze.default, x, -1)
    return rw.join(re, rw.call(aten.full_like.default, re, 0.0))


def _scale(n: int, normalization: int) -> float:
    """torch's fft_norm_mode: 0 none, 1 1/sqrt(n), 2 1/n (the sizes of all transformed dims multiply)."""
    return (1.0, 1.0 / math.sqrt(n), 1.0 / n)[normalization]


def _dft_step(rw, re, im, d: int, n_out: int, normalization: int, sign: int):
    """(re, im) of the DFT of re + i·im over dim ``d`` (of size n), keeping the first ``n_out`` frequencies:
    re' = a C + s b S, im' = b C - s a S with C, S [n, n_out] the cos / sin of 2πjk/n (``sign`` s: +1 forward)."""
    rank = re.meta["val"].dim()
    n = re.meta["val"].shape[d]
    last = rank - 1
    if d != last:
        re, im = _swap(rw, re, d), None if im is None else _swap(rw, im, d)
    theta = np.mod(np.outer(np.arange(n), np.arange(n_out)), n) * (2 * np.pi / n)  # exact angles for large jk
    cos, sin = np.cos(theta) * _scale(n, normalization), np.sin(theta) * _scale(n, normalization)
    if im is None:
        x, w_re, w_im = re, cos, -sign * sin
    else:
        x = rw.call(aten.cat.default, [re, im], -1)
        w_re, w_im = np.concatenate([cos, sign * sin]), np.concatenate([-sign * sin, cos])
    out = []
    for name, w in (("re", w_re), ("im", w_im)):  # stored [n_out, n]: x @ W.t() becomes a linear where kept
        # named by direction, normalization, part and shape ([n] or [2n] rows: a real or a complex input)
        key = f"dft_{'fwd' if sign > 0 else 'inv'}{normalization}_{name}_{w.shape[0]}x{w.shape[1]}"
        wt = rw.weight(key, np.ascontiguousarray(w.T), x)
        y = rw.call(aten.matmul.default, x, rw.call(aten.permute.default, wt, [1, 0]))
        out.append(y if d == last else _swap(rw, y, d))
    return out


def _swap(rw, x, d: int):
    """``x`` with dim ``d`` and the last swapped (a permute: core ATen has no transpose)."""
    perm = list(range(x.meta["val"].dim()))
    perm[d], perm[-1] = perm[-1], perm[d]
    return rw.call(aten.permute.default, x, perm)


def _fft_dims(c, dim) -> list[int]:
    return [d % c.meta["val"].dim() for d in dim]


def _fft(rw, re, im, dims, normalization, sign, onesided_last=False):
    for i, d in enumerate(dims):
        n = re.meta["val"].shape[d]
        re, im = _dft_step(rw, re, im, d, n // 2 + 1 if onesided_last and i == len(dims) - 1 else n,
                           normalization, sign)
    return rw.join(rw.call(aten.unsqueeze.default, re, -1), rw.call(aten.unsqueeze.default, im, -1))


def _fft_r2c(rw, n, x, dim, normalization, onesided):
    # the onesided dim last: the dims commute, and its half-spectrum is then the only one cut
    return _fft(rw, x, None, _fft_dims(x, dim), normalization, 1, onesided)


def _fft_c2c(rw, n, c, dim, normalization, forward):
    re, im = rw.real_imag(c)
    return _fft(rw, re, im, _fft_dims(c, dim), normalization, 1 if forward else -1)


def _fft_c2r(rw, n, c, dim, normalization, last_dim_size):
    """The inverse transform of a Hermitian signal given by its first half: complex-to-complex over every dim but
    the last, then out_t = Σ_k w_k (Re X_k cos θ - Im X_k sin θ) over the last (w_k 2 for the frequencies whose
    conjugate the half leaves out, else 1; frequencies past n/2 are not read, as torch)."""
    dims = _fft_dims(c, dim)
    re, im = rw.real_imag(c)
    for d in dims[:-1]:
        re, im = _dft_step(rw, re, im, d, re.meta["val"].shape[d], normalization, -1)
    d, n = dims[-1], last_dim_size
    rank = re.meta["val"].dim()
    if d != rank - 1:
        re, im = _swap(rw, re, d), None if im is None else _swap(rw, im, d)
    m = re.meta["val"].shape[-1]
    k = np.arange(m)
    w = np.where((k == 0) | (2 * k == n), 1.0, 2.0) * (k <= n // 2)
    theta = np.mod(np.outer(k, np.arange(n)), n) * (2 * np.pi / n)
    w = w[:, None] * _scale(n, normalization)
    cos, sin = w * np.cos(theta), w * np.sin(theta)
    x, mat = (re, cos) if im is None else (rw.call(aten.cat.default, [re, im], -1), np.concatenate([cos, -sin]))
    wt = rw.weight(f"dft_c2r{normalization}_{mat.shape[0]}x{mat.shape[1]}", np.ascontiguousarray(mat.T), x)
    y = rw.call(aten.matmul.default, x, rw.call(aten.permute.default, wt, [1, 0]))
    return y if d == rank - 1 else _swap(rw, y, d)


def _cat(rw, n, tensors, dim=0):
    return rw.call(aten.cat.default, [rw.pair(t) for t in tensors], _dim(tensors[0], dim))


def _any(*args, **kwargs) -> bool:
    return True


def _mul_form(a, b) -> bool:  # a complex node times a complex node, a real tensor or a real number
    return (_is_complex_node(a) or _is_complex_node(b)) and not isinstance(a, complex) and not isinstance(b, complex)


def _add_sub_form(a, b, alpha=1) -> bool:
    return _is_complex_node(a) and _is_complex_node(b) and not isinstance(alpha, complex)


def _to_copy_form(c, dtype=None, **kwargs) -> bool:  # a copy, not a cast; or a real tensor cast to complex
    if _is_complex_node(c):
        return dtype is None or dtype == c.meta["val"].dtype
    return dtype is not None and dtype.is_complex and c.meta["val"].dtype.is_floating_point


def _static_dims(c, dims) -> bool:
    shape = c.meta["val"].shape
    return all(isinstance(shape[d], int) for d in dims)


def _fft_form(c, dim, normalization, *args) -> bool:
    return normalization in (0, 1, 2) and len(dim) > 0 and _static_dims(c, dim)


def _fft_c2r_form(c, dim, normalization, last_dim_size) -> bool:
    return _fft_form(c, dim, normalization) and isinstance(last_dim_size, int) and last_dim_size > 0


def _cat_form(tensors, dim=0) -> bool:
    return all(_is_complex_node(t) for t in tensors)


# the forms of the listed ops that the rules rewrite (any other: the signature is left as it was)
_FORMS = {aten.mul.Tensor: _mul_form, aten.add.Tensor: _add_sub_form, aten.sub.Tensor: _add_sub_form,
          aten._to_copy.default: _to_copy_form, aten.cat.default: _cat_form, aten._fft_r2c.default: _fft_form,
          aten._fft_c2c.default: _fft_form, aten._fft_c2r.default: _fft_c2r_form}

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
    aten.mm.default: _matmul(aten.mm.default),
    aten.bmm.default: _matmul(aten.bmm.default),
    aten.matmul.default: _matmul(aten.matmul.default),
    aten._fft_r2c.default: _fft_r2c,
    aten._fft_c2c.default: _fft_c2c,
    aten._fft_c2r.default: _fft_c2r,
}
