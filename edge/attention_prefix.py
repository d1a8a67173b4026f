"""A decode step's attention over the filled prefix of the KV cache only, chosen at run time among static lengths.

XNNPACK packs a BATCH_MATMUL's non-constant operand on every invoke, so a decode step over a 1024-slot cache packs
all 1024 slots of K and V in every layer whatever the position: a third of an int8 decode step (bench/kv_layout.py,
perf in the README). A SLICE of run-time size would read only the filled slots, but XNNPACK takes no run-time
shapes (TFLite's own kernels over such a prefix took 27.8 ms at 1024 against 2.5 ms). So the cache is cut into a
few static prefix lengths ``b_1 < ... < b_n = S`` and an IF picks the shortest one holding the token's position:

    main:        IF(pos < b_1, then=prefix(b_1), else=choose(2))
    choose(i):   IF(pos < b_i, then=prefix(b_i), else=choose(i + 1))      (the last else: prefix(S))
    prefix(b):   SLICE the first b slots of K, V and the mask, then the attention as before (static shapes, so
                 XNNPACK delegates it: LiteRT applies delegates to every subgraph)

Every subgraph takes (pos, q, k, v, mask) and returns the attention output; the same subgraphs serve every layer
with the same shapes. The slots past the position are masked (the cache protocol, converter/llm.py), so leaving
them out changes nothing: the softmax's masked terms are exp(-inf) = 0. The TPU backend reads only the visible
blocks in its decode kernel (tpu_backend/pallas/decode_attention.py); this is the same idea within LiteRT's ops.

A sliding-window layer's decode reads the ``W`` slots of its window, gathered from the cache (converter/llm.py's
``KVCacheLM._window``: start ``clamp(pos - W + 1, 0, S - W)``). Before position ``W`` that start is 0, so the window
is the cache's first ``W`` slots and its mask reads slot by slot: the same chain over prefixes of at most ``W``
slots serves it without the gather (a copy of ``W`` slots of K and of V per layer and step, by TFLite's builtin
GATHER between two XNNPACK partitions), and only the chain's last else gathers the window:

    window(W):   GATHER the window's slots of K and V, then the attention over them with the whole mask
"""

from __future__ import annotations

import numpy as np

from ..converter import layout as L
from .builder import options, schema
from .values import Val

__all__ = ["prefix_lengths", "prefix_attention"]

# the shortest prefix; a cache under two of these keeps one attention over every slot
_MIN_PREFIX = 256
_MAX_PREFIXES = 8


def prefix_lengths(cache_len: int) -> list[int]:
    """The static prefix lengths for a cache of ``cache_len`` slots (the last is the whole cache): n equal steps,
    each at least 256 slots, at most 8 of them; [] when the cache is too short to be worth an IF."""
    n = min(_MAX_PREFIXES, cache_len // _MIN_PREFIX)
    if n < 2:
        return []
    step = -(-cache_len // n)
    return sorted({min(cache_len, step * i) for i in range(1, n + 1)})


def _plain(v: Val) -> bool:
    return not v.is_const and v.tensor is not None and tuple(v.perm) == L.identity(v.rank) and v.static


def prefix_attention(lw, qs: Val, k: Val, v: Val, mask: Val, pos_first: Val, window: Val | None = None
                     ) -> Val | None:
    """The decode attention ``softmax(qs @ k^T + mask) @ v`` (qs already scaled, grouped heads folded into rows)
    through the IF chain above, or None when the operands are not the plain static tensors it handles (the caller
    then emits the attention over every slot). ``pos_first``: int32 [1], the token's cache slot. ``window``: a
    sliding layer's int32 [W] window slots (W < the cache's slots; ``mask`` is then over those W slots): the chain
    over prefixes of at most W slots, and the window gathered in its last else (see above)."""
    s_len = k.shape[-2] if k.rank >= 2 else None
    span = s_len if window is None else window.shape[0]  # the slots the mask covers
    lengths = prefix_lengths(span) if isinstance(s_len, int) and isinstance(span, int) else []
    operands = (qs, k, v, mask) + (() if window is None else (window,))
    if not lengths or not all(_plain(x) for x in operands) or not _plain(pos_first):
        return None
    if k.rank != 4 or v.shape[:-1] != k.shape[:-1] or mask.shape[-1] != span or qs.shape[-1] != k.shape[-1]:
        return None
    if qs.dtype != np.float32 or k.dtype != np.float32 or v.dtype != np.float32 or mask.dtype != np.float32:
        return None
    if window is not None and (window.rank != 1 or window.dtype != np.int32 or span >= s_len):
        return None
    out_shape = tuple(qs.shape[:-1]) + (v.shape[-1],)
    key = ("prefix_attention", qs.shape, k.shape, v.shape, mask.shape, span if window is not None else None)
    chooser = lw.model.memo.get(key)  # the same subgraphs for every layer and signature with these shapes
    if chooser is None:
        chooser = _Chain(lw.model, qs.shape, k.shape, v.shape, mask.shape, out_shape, lengths,
                         window=window is not None).first
        lw.model.memo[key] = chooser
    cond = lw.op("LESS", [lw.tensor(pos_first), lw.tensor(lw.const(np.array([lengths[0]], np.int32)))], (1,),
                 np.bool_, suffix="prefix_cond")
    ins = [lw.tensor(cond)] + [lw.tensor(x) for x in (pos_first,) + operands]
    then, other = chooser
    return lw.op("IF", ins, out_shape, np.float32, suffix="prefix_attention",
                 opts=lw.options("If", thenSubgraphIndex=then, elseSubgraphIndex=other))


class _Chain:
    """The subgraphs of one shape signature: ``first`` = (then, else) subgraph indices of the main graph's IF."""

    def __init__(self, model, q_shape, k_shape, v_shape, m_shape, out_shape, lengths, window: bool = False):
        self.model = model
        self.names = ["pos", "q", "k", "v", "mask"]
        self.shapes = [(1,), q_shape, k_shape, v_shape, m_shape]
        self.dtypes = [np.int32, np.float32, np.float32, np.float32, np.float32]
        if window:  # every subgraph also takes the window's slots, read by the last else
            self.names.append("window")
            self.shapes.append((m_shape[-1],))
            self.dtypes.append(np.int32)
        self.out_shape = out_shape
        prefixes = [self._prefix(b, k_shape[-2]) for b in lengths]
        # the last prefix is the whole cache, or with a window, the window's slots while they are the first ones
        other, last = (self._window(), len(lengths) - 1) if window else (prefixes[-1], len(lengths) - 2)
        for i in range(last, 0, -1):  # choose(i) for i = last .. 1, innermost first
            other = self._choose(lengths[i], prefixes[i], other)
        self.first = (prefixes[0], other)

    def _subgraph(self, name):
        sg = self.model.subgraph(name)
        sg.inputs = [sg.tensor(n, s, d) for n, s, d in zip(self.names, self.shapes, self.dtypes)]
        return sg, len(self.model.subgraphs) - 1

    @staticmethod
    def _op(sg, name, inputs, outputs, opts=None):
        return sg.op(getattr(schema().BuiltinOperator, name), inputs, outputs, opts)

    def _prefix(self, b: int, s_len: int) -> int:
        sg, index = self._subgraph(f"decode_attention_prefix_{b}")
        _, q, k, v, m = sg.inputs[:5]
        if b < s_len:
            cut = []
            # K and V cut along their slot axis (-2), the mask along its last (unless it is b long: a window's)
            for t, shape, axis in ((k, self.shapes[2], -2), (v, self.shapes[3], -2), (m, self.shapes[4], -1)):
                if shape[axis] == b:
                    cut.append(t)
                    continue
                axis %= len(shape)
                size = [-1] * len(shape)
                size[axis] = b
                out = sg.tensor(f"prefix_{b}", tuple(b if i == axis else d for i, d in enumerate(shape)), np.float32)
                begin = sg.const(np.zeros(len(shape), np.int32), "begin")
                self._op(sg, "SLICE", [t, begin, sg.const(np.array(size, np.int32), "size")], [out],
                         options("Slice"))
                cut.append(out)
            k, v, m = cut
        self._attention(sg, q, k, v, m, b)
        return index

    def _window(self) -> int:
        """The window's attention: its slots of K and V gathered (axis 2), then the attention with the whole mask."""
        sg, index = self._subgraph("decode_attention_window")
        _, q, k, v, m, slots = sg.inputs
        w = self.shapes[5][0]
        cut = []
        for t, shape in ((k, self.shapes[2]), (v, self.shapes[3])):
            out = sg.tensor("window", tuple(shape[:2]) + (w,) + tuple(shape[3:]), np.float32)
            self._op(sg, "GATHER", [t, slots], [out], options("Gather", axis=2))
            cut.append(out)
        self._attention(sg, q, *cut, m, w)
        return index

    def _attention(self, sg, q, k, v, m, b: int) -> None:
        s_shape = tuple(self.shapes[1][:-1]) + (b,)
        scores = sg.tensor("scores", s_shape, np.float32)
        self._op(sg, "BATCH_MATMUL", [q, k], [scores], options("BatchMatMul", adjX=False, adjY=True))
        masked = sg.tensor("masked", s_shape, np.float32)
        self._op(sg, "ADD", [scores, m], [masked], options("Add", fusedActivationFunction=0))
        probs = sg.tensor("probs", s_shape, np.float32)
        self._op(sg, "SOFTMAX", [masked], [probs], options("Softmax", beta=1.0))
        out = sg.tensor("attention", self.out_shape, np.float32)
        self._op(sg, "BATCH_MATMUL", [probs, v], [out], options("BatchMatMul", adjX=False, adjY=False))
        sg.outputs = [out]

    def _choose(self, b: int, then: int, other: int) -> int:
        sg, index = self._subgraph(f"decode_attention_choose_{b}")
        cond = sg.tensor("cond", (1,), np.bool_)
        self._op(sg, "LESS", [sg.inputs[0], sg.const(np.array([b], np.int32), "length")], [cond])
        out = sg.tensor("attention", self.out_shape, np.float32)
        self._op(sg, "IF", [cond] + list(sg.inputs), [out],
                 options("If", thenSubgraphIndex=then, elseSubgraphIndex=other))
        sg.outputs = [out]
        return index

