"""Weights stored in the layout their op reads on the TPU, instead of torch's: convolution kernels HWIO, linear
weights [in, out].

Convolution kernels. A kernel handed to the TPU compile as OIHW and transposed inside the program costs libtpu
about a third more compile time than the same network taking HWIO kernels (ResNet-50, float32 at HIGHEST, one
v5e chip: 63 s against 49 s; docs/tpu.md, "Compile time"). Stored HWIO, the lowered function turns the kernel back
into torch's layout for the lowerings with one transpose, which XLA folds into the convolution's own (the TPU
form's NHWC/HWIO convolution then reads the argument as it is; XLA:CPU's convolution reads HWIO too).

Linear weights. torch keeps an ``nn.Linear`` weight [out, in]; a JAX model keeps its kernel [in, out], the
operand layout of ``x @ w``. Stored [in, out], the lowered function transposes it back to torch's [out, in] for
any lowering that reads it, and each linear reading it contracts the transpose's transpose, which XLA cancels: the
dot reads the argument in place, as a JAX model's does. XLA:CPU runs a many-row matmul (a 32-row decode step of a
110 M LM) about a sixth faster off [in, out] rows than off [out, in] ones; one row costs the same. libtpu, though,
compiles the [in, out] form more slowly (float32 at HIGHEST, v6e, compile only: ViT-B/16 35.5 s against 31.0 s,
BERT-base 23.7 s against 19.7 s, alternating runs), so linear weights are stored [in, out] only in an export
without the TPU platform (the cpu-xla and cuda targets); a TPU export keeps torch's [out, in].

A weight is stored this way when every use of it, in every exported signature, is that operand of that op: the
kernel of a 2-d, non-transposed convolution (stored as ``<weight>.hwio``), or the weight of ``aten.linear``
(stored as ``<weight>.io``). A weight read any other way as well (a tied embedding table, also gathered by
``aten.embedding``) keeps torch's layout and name, as do the weights ``skip`` names (int8-quantized ones, stored as
their own parts). The manifest's signatures list the stored name in place of the torch name; a partition rule for
the torch name applies, its spec permuted along. The stored array is a permuted view of the program's weight,
made contiguous only as the artifact is written, so planning copies nothing.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import torch

__all__ = ["HWIO_SUFFIX", "IO_SUFFIX", "StoredLayout", "plan_layouts", "layout_rewrite"]

aten = torch.ops.aten

HWIO_SUFFIX = ".hwio"
IO_SUFFIX = ".io"


def _kernel_only(w) -> bool:
    """``w`` (a weight node) is read only as the kernel of 2-d, non-transposed convolutions."""
    from tpu_export.converter.registry import arguments

    for u in w.users:
        if u.target is not aten.convolution.default:
            return False
        a = arguments(u)
        if a["weight"] is not w or a["input"] is w or a["bias"] is w or a["transposed"]:
            return False
    return bool(w.users)


def _linear_weight_only(w) -> bool:
    """``w`` (a weight node) is read only as the weight of ``aten.linear`` (never also as its input or bias)."""
    from tpu_export.converter.registry import arguments

    for u in w.users:
        if u.target is not aten.linear.default:
            return False
        a = arguments(u)
        if a["weight"] is not w or a["input"] is w or a["bias"] is w:
            return False
    return bool(w.users)


@dataclasses.dataclass(frozen=True)
class _Layout:
    suffix: str
    dim: int
    perm: tuple  # stored dim i is the weight's dim perm[i]
    fits: Callable  # fits(weight node) -> every use reads the weight in this layout's op and operand
    not_on: tuple = ()  # platforms whose compile this layout slows: an export for any of them keeps torch's


_LAYOUTS = (
    _Layout(HWIO_SUFFIX, 4, (2, 3, 1, 0), _kernel_only),
    _Layout(IO_SUFFIX, 2, (1, 0), _linear_weight_only, not_on=("tpu",)),
)


@dataclasses.dataclass(frozen=True)
class StoredLayout:
    """How one program weight is stored: ``name`` (torch name + suffix), ``perm`` (stored dim i is the weight's
    dim perm[i]) and ``value`` (the weight permuted: a view of the program's tensor)."""

    name: str
    perm: tuple
    value: torch.Tensor


def plan_layouts(prog, signature_names, skip=(), platforms=("tpu", "cpu")) -> dict:
    """weight name -> StoredLayout, for the weights to store in another layout than torch's, looking at every
    listed signature (a weight some signature reads otherwise keeps torch's layout in all of them).

    Args:
        prog: the converter Program.
        signature_names: the signatures being exported.
        skip: weight names to leave as they are (e.g. the ones quantized to int8).
        platforms: the export's platforms (a layout that slows one of them is not used).

    Returns:
        {weight name: StoredLayout}; empty when no weight qualifies.
    """
    chosen, refused = {}, set(skip)
    usable = [lo for lo in _LAYOUTS if not set(lo.not_on) & set(platforms)]
    for name in signature_names:
        for w in prog.signature(name).weight_nodes():
            wname = w.meta["weight_name"]
            t = prog.weights[wname]
            layout = next((lo for lo in usable if t.dim() == lo.dim), None) if t.is_floating_point() else None
            if layout is not None and layout.fits(w):
                chosen[wname] = layout
            else:
                refused.add(wname)
    return {w: StoredLayout(w + lo.suffix, lo.perm, prog.weights[w].detach().permute(*lo.perm))
            for w, lo in sorted(chosen.items()) if w not in refused}


def _unpermute(perm):
    import jax.numpy as jnp

    back = tuple(perm.index(i) for i in range(len(perm)))
    return lambda stored: jnp.transpose(stored, back)


def _linear_in_out(ctx, x, weight, bias=None):
    """aten.linear over a weight stored [in, out]. ``weight`` is the stored array transposed back to torch's
    [out, in]; contracting dim 0 of its transpose, the two transposes cancel and the dot reads the stored array as
    a JAX model's ``x @ kernel`` does. (The dot over dim 1 of the transposed-back weight, ops_nn.linear's form for
    a weight stored [out, in], made XLA:CPU copy the weight on every call for a one-row ``x``.)"""
    import jax

    from .lowering.helpers import cast, cast_all

    x, weight = cast_all(ctx.out_dtype, x, weight)
    y = jax.lax.dot_general(x, weight.T, (((x.ndim - 1,), (0,)), ((), ())), precision=ctx.precision())
    return y if bias is None else y + cast(bias, ctx.out_dtype)


def layout_rewrite(prog, signature_name, plan: dict):
    """The GraphRewrite of one signature storing ``plan``'s weights (plan_layouts) in their layouts.

    Raises:
        ValueError: the program already has a weight of a stored name (``conv.weight.hwio``, ``fc.weight.io``).
    """
    from tpu_export.converter.registry import bind_args

    from .lowering.interpreter import GraphRewrite, PackedWeight

    rewrite = GraphRewrite()
    for w in prog.signature(signature_name).weight_nodes():
        wname = w.meta["weight_name"]
        if wname not in plan:
            continue
        s = plan[wname]
        if s.name in prog.weights:
            raise ValueError(f"cannot store {wname!r} as {s.name!r}: the program already has a weight named "
                             f"{s.name!r}; rename that parameter")
        rewrite.packed_weights[wname] = PackedWeight([(s.name, s.value)], _unpermute(s.perm), like_weight=True,
                                                     perms={s.name: s.perm})
        if s.name.endswith(IO_SUFFIX):
            for u in w.users:  # plan_layouts chose it: every user is an aten.linear reading it as its weight
                rewrite.lowerings[u] = (_linear_in_out, bind_args(u))
    return rewrite
