"""Convolution kernels stored HWIO, the layout a channels-last TPU convolution reads, instead of torch's OIHW.

A kernel handed to the TPU compile as OIHW and transposed inside the program costs libtpu about a third more
compile time than the same network taking HWIO kernels (ResNet-50, float32 at HIGHEST, one v5e chip: 63 s
against 49 s; docs/tpu.md, "Compile time"). Stored HWIO, the lowered function turns the kernel back into torch's
layout for the lowerings with one transpose, which XLA folds into the convolution's own (the TPU form's
NHWC/HWIO convolution then reads the argument as it is; XLA:CPU's convolution reads HWIO too).

A weight is stored this way when every use of it, in every exported signature, is the kernel of a 2-d
convolution. The stored array is named ``<weight>.hwio``; the manifest's signatures list it in place of the
torch name; a partition rule for the torch name applies, its spec permuted along.
"""

from __future__ import annotations

import torch

__all__ = ["HWIO_SUFFIX", "plan_hwio", "hwio_rewrite"]

aten = torch.ops.aten

HWIO_SUFFIX = ".hwio"
_TO_HWIO = (2, 3, 1, 0)
_FROM_HWIO = (3, 2, 0, 1)


def _kernel_only(w) -> bool:
    """``w`` (a weight node) is read only as the kernel of 2-d, non-transposed convolutions."""
    from tpu_export.converter.registry import arguments

    if not w.users:
        return False
    for u in w.users:
        if u.target is not aten.convolution.default:
            return False
        a = arguments(u)
        if a["weight"] is not w or a["input"] is w or a["bias"] is w or a["transposed"]:
            return False
    return True


def plan_hwio(prog, signature_names) -> dict:
    """weight name -> its kernel as stored (HWIO), for the weights to store so, looking at every listed signature;
    each kernel is transposed once, however many signatures read it."""
    chosen, refused = set(), set()
    for name in signature_names:
        for w in prog.signature(name).weight_nodes():
            wname = w.meta["weight_name"]
            t = prog.weights[wname]
            if t.dim() == 4 and t.is_floating_point() and _kernel_only(w):
                chosen.add(wname)
            else:
                refused.add(wname)
    return {w: prog.weights[w].detach().permute(*_TO_HWIO).contiguous() for w in sorted(chosen - refused)}


def _from_hwio(kernel):
    import jax.numpy as jnp

    return jnp.transpose(kernel, _FROM_HWIO)


def hwio_rewrite(prog, signature_name, kernels: dict):
    """The GraphRewrite of one signature storing plan_hwio's ``kernels`` HWIO."""
    from .lowering.interpreter import GraphRewrite, PackedWeight

    rewrite = GraphRewrite()
    for w in prog.signature(signature_name).weight_nodes():
        wname = w.meta["weight_name"]
        if wname not in kernels:
            continue
        stored = wname + HWIO_SUFFIX
        if stored in prog.weights:
            raise ValueError(f"cannot store {wname!r} HWIO: the program already has a weight named {stored!r}")
        rewrite.packed_weights[wname] = PackedWeight([(stored, kernels[wname])], _from_hwio, like_weight=True,
                                                     perms={stored: _TO_HWIO})
    return rewrite
