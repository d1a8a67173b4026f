"""The NHWC layout policy, as permutations.

Every value keeps its *logical* (torch) shape plus a layout ``perm``: physical dim ``i`` of
the LiteRT tensor holds logical dim ``perm[i]``. Convolutions, pooling, resize and
depth/space ops ask for channel-last (``(0, 2, 3, 1)`` for NCHW); elementwise ops,
reductions, concat and slices run in whatever layout their input has, with axes remapped;
``permute`` only changes ``perm`` (no op). A TRANSPOSE is written only where an op needs a
layout its input lacks, and none when the move only shifts size-1 dims (then a RESHAPE does).
"""

from __future__ import annotations

__all__ = [
    "identity", "is_identity", "inverse", "channel_last", "transpose_perm", "same_data_order",
    "drop_dims", "plan_reshape", "last_dim_layout", "canonical_transpose",
]


def identity(rank: int) -> tuple:
    return tuple(range(rank))


def is_identity(perm) -> bool:
    return tuple(perm) == identity(len(perm))


def inverse(perm) -> tuple:
    inv = [0] * len(perm)
    for i, p in enumerate(perm):
        inv[p] = i
    return tuple(inv)


def channel_last(rank: int) -> tuple:
    """NCHW-style logical dims laid out as NHWC (N, spatial..., C)."""
    return (0,) + tuple(range(2, rank)) + (1,)


def transpose_perm(src, dst) -> tuple:
    """The TRANSPOSE ``perm`` operand taking a tensor in layout ``src`` to layout ``dst``."""
    pos = {d: i for i, d in enumerate(src)}
    return tuple(pos[d] for d in dst)


def same_data_order(src, dst, shape) -> bool:
    """True when both layouts store the elements in the same order (they differ only in where
    size-1 dims sit), so a RESHAPE moves between them."""
    a = [d for d in src if shape[d] != 1]
    b = [d for d in dst if shape[d] != 1]
    return a == b


def drop_dims(perm, dims) -> tuple:
    """The layout left after removing logical ``dims`` (reduced or squeezed away)."""
    dims = set(dims)
    kept = [d for d in perm if d not in dims]
    rank = sorted(kept)
    return tuple(rank.index(d) for d in kept)


def last_dim_layout(perm, dim: int) -> tuple:
    """``perm`` if logical ``dim`` is already innermost, else ``perm`` with ``dim`` moved last."""
    if perm[-1] == dim:
        return tuple(perm)
    return tuple(p for p in perm if p != dim) + (dim,)


def _factor(old, new):
    """Group the non-1 dims of ``old`` and ``new`` into runs with equal element counts
    ([(old dims, new dims)]), or None when that cannot be done (dynamic dims merged)."""
    o = [i for i, s in enumerate(old) if s != 1]
    n = [i for i, s in enumerate(new) if s != 1]
    groups, i, j = [], 0, 0
    while i < len(o) or j < len(n):
        if i >= len(o) or j >= len(n):
            return None
        og, ng = [o[i]], [n[j]]
        i, j = i + 1, j + 1
        if old[og[0]] is None or new[ng[0]] is None:
            if old[og[0]] is None and new[ng[0]] is None:
                groups.append((og, ng))
                continue
            return None
        po, pn = old[og[0]], new[ng[0]]
        while po != pn:
            if po < pn:
                if i >= len(o) or old[o[i]] is None:
                    return None
                og.append(o[i])
                po *= old[o[i]]
                i += 1
            else:
                if j >= len(n) or new[n[j]] is None:
                    return None
                ng.append(n[j])
                pn *= new[n[j]]
                j += 1
        groups.append((og, ng))
    return groups


def plan_reshape(old_shape, perm, new_shape):
    """How to reshape a value in layout ``perm`` to logical ``new_shape`` without leaving its layout.

    Returns (src_perm, new_perm): bring the input to ``src_perm`` (equal to ``perm`` when no
    TRANSPOSE is needed), RESHAPE its physical tensor, and the result is in layout ``new_perm``.
    """
    rank_old, rank_new = len(old_shape), len(new_shape)
    groups = _factor(old_shape, new_shape)
    if groups is None:
        return identity(rank_old), identity(rank_new)
    group_of = {d: g for g, (od, _) in enumerate(groups) for d in od}
    phys_non1 = [d for d in perm if old_shape[d] != 1]
    # groups sit where their innermost dim sits: that keeps a merge like [T, H, D] <- (H, D)
    # in place when only H was moved out of the way
    last, first = {}, {}
    for pos, d in enumerate(phys_non1):
        last[group_of[d]] = pos
        first.setdefault(group_of[d], pos)
    order = sorted(last, key=last.get)
    src_non1 = [d for g in order for d in groups[g][0]]
    if src_non1 == phys_non1:
        src = tuple(perm)
    else:
        # a TRANSPOSE is needed whatever the order: when ordering groups by their outermost
        # dim instead lands the result in the plain layout, take that (Swin's window
        # partition: otherwise the next reshape, merging the window dims, transposes again)
        by_first = sorted(first, key=first.get)
        if by_first != order and by_first == sorted(by_first, key=lambda g: groups[g][1][0]):
            order = by_first
            src_non1 = [d for g in order for d in groups[g][0]]
        src = tuple(d for d in range(rank_old) if old_shape[d] == 1) + tuple(src_non1)
    out = [nd for g in order for nd in groups[g][1]]
    for k in range(rank_new):
        if new_shape[k] == 1:
            at = out.index(k - 1) + 1 if k > 0 else 0
            out.insert(at, k)
    return src, tuple(out)


def canonical_transpose(shape, tperm):
    """The smallest TRANSPOSE moving the same data: size-1 dims dropped and runs of dims that
    stay adjacent and in order merged. Returns (shape, perm) of the merged problem."""
    keep = [i for i in range(len(shape)) if shape[i] != 1]
    out = [i for i in tperm if shape[i] != 1]
    runs = []  # runs of input dims, in output order
    for i in out:
        if runs and keep.index(i) == keep.index(runs[-1][-1]) + 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    by_input = sorted(runs, key=lambda r: r[0])
    merged = []
    for r in by_input:
        n = 1
        for i in r:
            n = None if n is None or shape[i] is None else n * shape[i]
        merged.append(n)
    return tuple(merged), tuple(by_input.index(r) for r in runs)
