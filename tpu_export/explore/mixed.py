"""Accuracy-driven mixed precision: a weight scheme (int8, int4) everywhere but the ops the output is most sensitive to.

Each op the scheme quantizes is quantized alone and the model's output error against torch eager measured (its
sensitivity). Then, starting from the whole model quantized, the most sensitive ops go back to float one at a time
(an ai-edge-quantizer recipe with a ``NO_QUANTIZE`` entry per op, matched on the op's output tensor name) until the
output error is at most ``max_rel_err``. The report names the ops that stayed float and what they cost in size and in
latency on this CPU.
"""

from __future__ import annotations

import dataclasses
import os
import re
import statistics
import time

import numpy as np

__all__ = ["MixedPrecisionReport", "mixed_precision"]

# the weight schemes (no calibration): each op's sensitivity is the error with that op alone quantized
SCHEMES = ("dynamic_int8", "weight_only_int8", "dynamic_int4_block32", "weight_only_int4")


@dataclasses.dataclass
class MixedPrecisionReport:
    """What mixed_precision() chose and what it costs."""

    scheme: str
    max_rel_err: float
    rel_err: dict  # "float" / "quantized" / "mixed" -> the output's rel error against torch eager
    float_ops: list  # [(output tensor name, op, sensitivity)] kept in float, most sensitive first
    quantized_ops: list  # [(output tensor name, op, sensitivity)] quantized in the result
    bytes: dict  # "float" / "quantized" / "mixed" -> file size
    latency_us: dict  # "float" / "quantized" / "mixed" -> median invoke time on this CPU

    def summary(self) -> str:
        lines = [f"{self.scheme} with max rel err {self.max_rel_err:g}: output rel err {self.rel_err['mixed']:.3g} "
                 f"(float {self.rel_err['float']:.3g}, all quantized {self.rel_err['quantized']:.3g})"]
        if self.float_ops:
            lines.append(f"kept in float ({len(self.float_ops)} of {len(self.float_ops) + len(self.quantized_ops)} "
                         "quantizable ops), by sensitivity:")
            lines += [f"  {name} ({op}): alone quantized, rel err {s:.3g}" for name, op, s in self.float_ops]
        else:
            lines.append("every quantizable op quantized")
        for k in ("float", "quantized", "mixed"):
            lines.append(f"{k:9s} {self.bytes[k]:>10d} bytes  {self.latency_us[k]:10.1f} us")
        return "\n".join(lines)

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def _scope(name: str) -> str:
    # ai-edge-quantizer matches a recipe's regex against the op's output tensor names joined with ";" and
    # ended by one (tfl_flatbuffer_utils.get_op_scope)
    return f"(^|;){re.escape(name)};"


def _recipe(base: list, float_names=()) -> list:
    """``base`` with the ops writing ``float_names`` left in float (a later recipe entry wins for its scope)."""
    from ai_edge_quantizer import qtyping, recipe_manager
    from ai_edge_quantizer.algorithm_manager import AlgorithmName

    rm = recipe_manager.RecipeManager()
    every = qtyping.TFLOperationName.ALL_SUPPORTED
    rm.load_quantization_recipe(base)
    for name in float_names:
        rm.add_quantization_config(_scope(name), every, algorithm_key=AlgorithmName.NO_QUANTIZE)
    return rm.get_quantization_recipe()


def _quantize(data: bytes, recipe: list) -> bytes:
    from tpu_export.edge.quantize import QuantConfig, quantize_tflite

    return quantize_tflite(data, QuantConfig(recipe=recipe))


def _quantized_ops(data: bytes) -> list:
    """(output tensor name, op) of every op of the quantized model that reads int8 weights."""
    from tpu_export.targets.compat.model_ops import read_ops

    out = []
    for op in read_ops(data):
        if any(t is not None and t.is_const and t.dtype in ("int8", "int4") for t in op.inputs) and op.outputs:
            out.append((op.outputs[0].name, op.name))
    return out


def _as_nhwc(x, shape: tuple):
    """``x`` (torch's NCHW) in a .tflite input's layout: as it is, or NHWC where the file takes that."""
    if x.shape != shape and x.ndim == 4 and (x.shape[0], x.shape[2], x.shape[3], x.shape[1]) == shape:
        return np.ascontiguousarray(x.transpose(0, 2, 3, 1))
    return x


def _as_nchw(y, shape: tuple):
    """A .tflite output back in torch's layout where the file gives it NHWC."""
    if y.shape != shape and y.ndim == 4 and (y.shape[0], y.shape[3], y.shape[1], y.shape[2]) == shape:
        return y.transpose(0, 3, 1, 2)
    return y


def _runner(data: bytes, signature: str):
    from ai_edge_litert.interpreter import Interpreter

    interp = Interpreter(model_content=data, num_threads=1)
    return interp.get_signature_runner(signature)


def _latency_us(data: bytes, signature: str, feed: dict, repeats: int) -> float:
    run = _runner(data, signature)
    run(**feed)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        run(**feed)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def mixed_precision(model, float_tflite: str | os.PathLike, sample_args: tuple = (), sample_kwargs: dict | None = None,
                    *, max_rel_err: float, scheme: str = "dynamic_int8", out: str | os.PathLike | None = None,
                    signature: str = "serving_default", repeats: int = 20) -> tuple[bytes, MixedPrecisionReport]:
    """Quantize ``float_tflite`` with ``scheme``, keeping the most sensitive ops in float until the output's relative
    error against torch eager is at most ``max_rel_err``.

    Args:
        model: The torch model the .tflite was converted from (``nn.Module``, ExportedProgram or ``.pt2`` path).
        float_tflite: The float .tflite (``convert`` without ``--quantize``).
        sample_args: The inputs the error is measured on.
        sample_kwargs: Keyword inputs.
        max_rel_err: The largest output relative error (the library's metric, converter.numerics.rel_err) allowed.
        scheme: The quantization scheme: ``dynamic_int8``, ``weight_only_int8``, ``dynamic_int4_block32`` or
            ``weight_only_int4``.
        out: Where to write the mixed model (default: not written).
        signature: The signature measured.
        repeats: Timed runs per model for the latency figures (median kept).

    Returns:
        (the mixed model's bytes, a MixedPrecisionReport).

    Raises:
        ValueError: ``scheme`` is not one this search takes, ``max_rel_err`` is not positive, or the float model itself
            is past ``max_rel_err`` (no mix of precisions can reach it).
    """
    import torch

    from tpu_export.converter._torch_compat import tree_leaves
    from tpu_export.converter.numerics import rel_err
    from tpu_export.converter.pipeline import SignatureRequest, prepare_many
    from tpu_export.edge.quantize import QuantConfig, recipe_for

    if scheme not in SCHEMES:
        raise ValueError(f"scheme {scheme!r}: the mixed precision search takes {', '.join(SCHEMES)}")
    if not max_rel_err > 0:
        raise ValueError(f"max_rel_err must be a positive number, got {max_rel_err!r}")
    args = sample_args if isinstance(sample_args, tuple) else (sample_args,)
    prog = prepare_many([SignatureRequest(signature, model, args, sample_kwargs)])
    sig = prog.signature(signature)
    flat = sig.flatten_inputs(args, sample_kwargs)
    feed = {s.name: np.asarray(x.detach().cpu().numpy()) for s, x in zip(sig.inputs, flat)}
    module = model if isinstance(model, torch.nn.Module) else None
    with torch.no_grad():
        if module is not None:
            ref = module(*args, **(sample_kwargs or {}))
        else:
            ep = model if isinstance(model, torch.export.ExportedProgram) else torch.export.load(os.fspath(model))
            ref = ep.module()(*args, **(sample_kwargs or {}))
    refs = [r.detach().float().numpy() for r in tree_leaves(ref)]
    names = [s.name for s in sig.outputs]

    def error(data: bytes) -> float:
        got = _runner(data, signature)(**feed)
        return max(rel_err(_as_nchw(np.asarray(got[n], dtype=np.float32), r.shape), r) for n, r in zip(names, refs))

    float_bytes = open(float_tflite, "rb").read()
    # a target with NHWC image I/O (android, ios): the samples in the file's layout
    wanted = _runner(float_bytes, signature).get_input_details()
    feed = {n: _as_nhwc(x, tuple(wanted[n]["shape"])) if n in wanted else x for n, x in feed.items()}
    base = recipe_for(QuantConfig(scheme=scheme))
    full = _quantize(float_bytes, base)
    errs = {"float": error(float_bytes), "quantized": error(full)}
    if errs["float"] > max_rel_err:
        raise ValueError(f"{float_tflite}: the float model's output is already {errs['float']:.3g} from torch eager, "
                         f"past max_rel_err {max_rel_err:g}: no mix of precisions reaches it")
    cands = _quantized_ops(full)
    everyone = [n for n, _ in cands]
    sens = {name: error(_quantize(float_bytes, _recipe(base, [n for n in everyone if n != name])))
            for name in everyone}
    order = sorted(cands, key=lambda c: -sens[c[0]])
    kept: list = []
    mixed, err = full, errs["quantized"]
    while err > max_rel_err and len(kept) < len(order):
        kept.append(order[len(kept)])
        mixed = _quantize(float_bytes, _recipe(base, [n for n, _ in kept]))
        err = error(mixed)
    if err > max_rel_err:  # every op back in float: the float model, which is within the bound
        mixed, err = float_bytes, errs["float"]
    errs["mixed"] = err
    if out is not None:
        from tpu_export.converter.atomic import write_file

        write_file(os.fspath(out), mixed)
    report = MixedPrecisionReport(
        scheme, max_rel_err, errs,
        [(n, op, sens[n]) for n, op in kept],
        [(n, op, sens[n]) for n, op in order if (n, op) not in kept],
        {"float": len(float_bytes), "quantized": len(full), "mixed": len(mixed)},
        {k: _latency_us(d, signature, feed, repeats) for k, d in
         (("float", float_bytes), ("quantized", full), ("mixed", mixed))})
    return mixed, report
