"""capture -> decompose -> shared passes -> Program. Both backends start from here."""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Collection

import torch

from .capture import _as_tuple, capture, forward_params
from .decompositions import KEEP_WHOLE, decompose
from .gc_pause import gc_paused
from .passes import run_shared_passes
from .program import Program, program_from_exported

__all__ = ["SignatureRequest", "prepare", "prepare_many"]


@dataclasses.dataclass
class SignatureRequest:
    name: str
    module: Any  # nn.Module, ExportedProgram or .pt2 path
    args: tuple = ()
    kwargs: dict | None = None
    dynamic_shapes: Any = None


def prepare_many(requests: list[SignatureRequest], *, strict="auto", enable_x64=False, keep=KEEP_WHOLE) -> Program:
    """Capture each signature once, decompose once (keeping ``keep`` whole), run the shared passes.

    Signatures whose modules share parameters share them in the Program (by storage identity).
    """
    names = [r.name for r in requests]
    if len(set(names)) != len(names):
        raise ValueError(f"signature names must be unique, got {names}")
    with gc_paused():
        return _prepare_many(requests, strict, enable_x64, keep)


def _prepare_many(requests, strict, enable_x64, keep) -> Program:
    exported = {}
    for r in requests:
        ep = capture(r.module, r.args, r.kwargs, dynamic_shapes=r.dynamic_shapes, strict=strict)
        # in place only when capture exported the module here: a caller's ExportedProgram stays untouched
        ep = decompose(ep, keep, in_place=isinstance(r.module, torch.nn.Module))
        info = {
            "args": _as_tuple(r.args),
            "kwargs": r.kwargs or {},
            "dynamic_shapes": r.dynamic_shapes,
            "forward_params": forward_params(r.module),
        }
        exported[r.name] = (ep, info)
    prog = program_from_exported(exported, enable_x64=enable_x64)
    return run_shared_passes(prog, keep=keep)


def prepare(module: torch.nn.Module | torch.export.ExportedProgram | str | os.PathLike[str],
            sample_args: tuple[Any, ...] | None = None, sample_kwargs: dict[str, Any] | None = None, *,
            dynamic_shapes: Any = None, strict: bool | str = "auto", enable_x64: bool = False,
            keep: Collection[Any] = KEEP_WHOLE,
            signature_name: str = "serving_default") -> Program:
    """Capture ``module`` once and return the Program both backends lower.

    The module is exported with ``torch.export``, decomposed to core ATen (the ops in ``keep`` stay whole) and
    cleaned up by the passes both backends share. A module in training mode is converted as an eval-mode copy,
    with a warning. For several signatures sharing weights, use ``prepare_many``.

    Args:
        module: An ``nn.Module`` (called as ``module(*sample_args, **sample_kwargs)``), a
            ``torch.export.ExportedProgram`` (used as it is), or the path of a ``.pt2`` file saved by
            ``torch.export.save`` (read without unpickling).
        sample_args: Example positional inputs: a tuple, or a single tensor.
        sample_kwargs: Example keyword inputs.
        dynamic_shapes: ``torch.export``'s dynamic-shape spec (``torch.export.Dim`` per dynamic dim); the dims'
            names become the dim names of the Program's TensorSpecs.
        strict: ``"auto"`` (non-strict tracing first, then strict), ``True``/``"strict"`` or
            ``False``/``"non_strict"``.
        enable_x64: Keep 64-bit dtypes (int64, float64) 64-bit; by default they compute as 32-bit.
        keep: The ATen op overloads not to decompose (``torch.ops.aten.layer_norm.default``...): each backend
            lowers them whole. The default is ``converter.KEEP_WHOLE``.
        signature_name: The name of the Program's one signature.

    Returns:
        The Program, with one signature.

    Raises:
        ValueError: ``strict`` is not one of the values above.
        tpu_export.converter.ExportFailedError: ``module`` is not a module, ExportedProgram or ``.pt2`` file, or
            ``torch.export`` failed on it (the message explains the cause and the fix).
        tpu_export.converter.UnsupportedOutputError: The module returns something other than tensors.
        tpu_export.converter.ConversionError: The module writes to a buffer or to its input in forward.

    Examples:
        >>> import torch
        >>> from tpu_export import converter
        >>> m = torch.nn.Sequential(torch.nn.Linear(4, 2), torch.nn.ReLU()).eval()
        >>> prog = converter.prepare(m, (torch.ones(1, 4),))
        >>> list(prog.signatures)
        ['serving_default']
        >>> converter.run_program(prog, torch.ones(1, 4)).shape
        torch.Size([1, 2])
    """
    req = SignatureRequest(signature_name, module, sample_args if sample_args is not None else (), sample_kwargs,
                           dynamic_shapes)
    return prepare_many([req], strict=strict, enable_x64=enable_x64, keep=keep)


def run_program(prog: Program, *args, signature_name: str | None = None, **kwargs):
    """Run a Program's graph eagerly in torch (the reference the backends are checked against)."""
    sig = prog.signature(signature_name)
    flat = sig.flatten_inputs(args, kwargs)
    weights = [prog.weights[w] for w in sig.weight_names]
    conv = []
    for spec, x in zip(sig.inputs, flat):
        x = torch.as_tensor(x)
        conv.append(x.to(spec.dtype) if x.dtype != spec.dtype else x)
    from .interpret import NarrowingInterpreter

    with torch.no_grad():
        out = NarrowingInterpreter(sig.graph_module).run(*weights, *conv)
    return sig.unflatten_outputs(list(out))
