"""64 -> 32-bit dtype policy: int64/float64 become int32/float32 unless enable_x64.

LiteRT kernels and TPUs run 32-bit integers and floats; carrying int64 indices through a model
costs memory and, on TPU, emulated arithmetic. Values that would change meaning (an int64
weight or literal outside the int32 range) are errors, never silent wraps.
"""

from __future__ import annotations

import warnings

import torch

from .._torch_compat import tree_leaves
from ..dtypes import NARROW
from ..errors import DtypePolicyError, source_line
from ..interpret import NarrowingInterpreter, narrowed
from ..program import Program, refresh_signature_specs
from ..registry import op_name
from ._util import fake_mode_of

_I32 = (-(2**31), 2**31 - 1)
# the warning's advice; callers without enable_x64 (convert_lm) replace it
KEEP_64_ADVICE = "Pass enable_x64=True to keep 64-bit."


def _narrow_dtype(d):
    return NARROW.get(d, d)


# ops whose int arguments past the tensor are positions, not values: `x[:, 1:]` slices to end=2**63-1 ("to the
# end"), which says nothing about the int64 data
_POSITION_ARGS = {torch.ops.aten.slice.Tensor: 1, torch.ops.aten.slice_scatter.default: 2}


def _value_args(n):
    """The node's arguments that may become int64 data (a slice's start / end are positions)."""
    keep = _POSITION_ARGS.get(n.target)
    return (n.args, n.kwargs) if keep is None else n.args[:keep]


def apply_dtype_policy(prog: Program) -> None:
    if prog.enable_x64:
        return
    for name, w in list(prog.weights.items()):
        if w.dtype in NARROW:
            if w.dtype == torch.int64 and w.numel() and (w.min() < _I32[0] or w.max() > _I32[1]):
                raise DtypePolicyError(
                    f"weight {name!r} holds int64 values outside the int32 range "
                    f"([{int(w.min())}, {int(w.max())}]). Fix: convert with enable_x64=True."
                )
            prog.weights[name] = w.to(NARROW[w.dtype])
    for sig in prog.signatures.values():
        changed_in = [s.name for s in sig.inputs if s.dtype in NARROW]
        changed_out = [s.name for s in sig.outputs if s.dtype in NARROW]
        retyped = set()  # nodes the policy changes directly
        for n in sig.graph.nodes:
            if n.op != "call_function":
                continue
            val = n.meta.get("val")
            leaves = [v for v in tree_leaves(val) if isinstance(v, torch.Tensor)]
            out_is_64 = any(v.dtype in NARROW for v in leaves)  # tuples too: topk/sort/max.dim indices
            if "dtype" in n.kwargs and n.kwargs["dtype"] in NARROW:
                n.kwargs = {**n.kwargs, "dtype": _narrow_dtype(n.kwargs["dtype"])}
                retyped.add(n)
            if out_is_64:
                retyped.add(n)
                if any(v.dtype == torch.int64 for v in leaves):
                    for a in tree_leaves(_value_args(n)):
                        if isinstance(a, int) and not isinstance(a, bool) and not (_I32[0] <= a <= _I32[1]):
                            raise DtypePolicyError(
                                f"{op_name(n.target)} uses the int64 constant {a}, which does not fit int32, "
                                f"at {source_line(n)}. Fix: convert with enable_x64=True, or use a smaller constant."
                            )
        if not (retyped or changed_in or changed_out):
            continue
        mode = fake_mode_of(sig)
        new_vals = []
        for n in sig.graph.nodes:
            if n.op != "placeholder":
                continue
            v = n.meta["val"]
            if v.dtype in NARROW:
                with mode:
                    v = torch.empty_strided(v.shape, v.stride(), dtype=NARROW[v.dtype], device=v.device)
                n.meta["val"] = v
                retyped.add(n)
            new_vals.append(v)
        _propagate(sig, mode, new_vals, retyped)
        refresh_signature_specs(sig)
        if changed_in or changed_out:
            what = []
            if changed_in:
                what.append(f"inputs {changed_in}")
            if changed_out:
                what.append(f"outputs {changed_out}")
            warnings.warn(
                f"signature {sig.name!r}: 64-bit {' and '.join(what)} become 32-bit (int64->int32, "
                f"float64->float32), as LiteRT and TPUs run them. {KEEP_64_ADVICE}",
                stacklevel=2,
            )


def _propagate(sig, mode, placeholder_vals, retyped) -> None:
    """Recompute the fake value of every node the policy changes (int64 results read as int32):
    ``retyped`` (narrowed inputs, 64-bit results, narrowed dtype arguments) and everything reading
    a value that changed. The rest keep theirs (re-running a large graph costs ~0.2 s), and so do
    the readers of a node whose recomputed value looks as before (an int32 index into a float table
    gives the same float result: swin's relative-position bias would otherwise re-run ~300 nodes)."""
    interp = NarrowingInterpreter(sig.graph_module)
    vals = iter(placeholder_vals)
    changed = set()
    with mode:
        for n in sig.graph.nodes:
            if n.op == "placeholder":
                interp.env[n] = next(vals)
                if n in retyped:
                    changed.add(n)
            elif n.op == "call_function":
                if n in retyped or any(a in changed for a in n.all_input_nodes):
                    old = n.meta.get("val")
                    n.meta["val"] = narrowed(old) if _narrowing_keeps_shape(n, old) else interp.run_node(n)
                    if not _looks_the_same(old, n.meta["val"]):
                        changed.add(n)
                interp.env[n] = n.meta["val"]


def _narrowing_keeps_shape(n, old) -> bool:
    """Whether ``n``'s value under the policy is its old value with 64-bit dtypes narrowed. It is for every op
    but a bit-cast (view.dtype changes the last dim with the item size): the policy narrows every 64-bit value
    alike, so type promotion over narrowed inputs gives the narrowed result. Re-running the op instead would
    also re-evaluate its shape checks, and a check on a dynamic dim (max_pool2d_with_indices' does) can
    specialize the dim to the sample's size."""
    leaves = tree_leaves(old)
    return (n.target is not torch.ops.aten.view.dtype and bool(leaves)
            and all(isinstance(v, torch.Tensor) for v in leaves))


def _looks_the_same(old, new) -> bool:
    """Same dtypes, static shapes and strides, leaf by leaf (symbolic shapes count as different:
    comparing them would add guards)."""
    a, b = tree_leaves(old), tree_leaves(new)
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)):
            return False
        if x.dtype != y.dtype or not all(isinstance(d, int) for d in (*x.shape, *x.stride(), *y.shape, *y.stride())):
            return False
        if x.shape != y.shape or x.stride() != y.stride():
            return False
    return True
