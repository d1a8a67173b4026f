"""capture -> decompose -> shared passes -> Program. Both backends start from here."""

from __future__ import annotations

import dataclasses
from typing import Any

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


def prepare(module, sample_args=None, sample_kwargs=None, *, dynamic_shapes=None, strict="auto",
            enable_x64=False, keep=KEEP_WHOLE, signature_name="serving_default") -> Program:
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
