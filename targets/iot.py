"""The iot target: a full-integer int8 .tflite for TFLite Micro, verified in its interpreter, packaged as C.

Flow: float .tflite (edge backend) -> ai-edge-quantizer static int8 (calibration inputs required) ->
op check against TFLite Micro's resolver -> run in TFLite Micro vs the float model in LiteRT ->
arena measured -> .tflite + <name>_model.c/.h (16-byte aligned array, arena size constant) -> budgets.
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np

from .compat import compatibility
from .compat.model_ops import read_ops
from .quantize import quantize_int8
from .tflm_run import io_names, measure_arena, run_tflm

__all__ = ["IotModel", "BudgetError", "NotFullIntegerError", "convert_iot", "c_sources", "check_budget",
           "write_iot_package", "package_iot", "pt2e_int8"]

# Ops whose float side is the model boundary, not computation.
_BOUNDARY_OPS = {"QUANTIZE", "DEQUANTIZE"}


class BudgetError(ValueError):
    """The model does not fit the flash / RAM budget; the message has the numbers."""


class NotFullIntegerError(ValueError):
    pass


@dataclasses.dataclass
class IotModel:
    tflite: bytes  # the int8 model
    arena_bytes: int  # measured by TFLite Micro's recording allocator
    compat: object  # targets.compat.Report for "iot"
    agreement: dict  # top1 (fraction, if a classifier), max_abs_err (dequantized units), samples
    input_types: dict  # name -> dtype of the int8 model's inputs
    output_types: dict

    @property
    def flash_bytes(self) -> int:
        return len(self.tflite)

    def summary(self) -> str:
        a = self.agreement
        top1 = f"top-1 agreement {a['top1']:.0%}, " if a.get("top1") is not None else ""
        return (f"iot: int8 model {self.flash_bytes / 1024:.1f} KiB flash, "
                f"arena {self.arena_bytes / 1024:.1f} KiB RAM; "
                f"TFLite Micro vs float over {a['samples']} sample(s): {top1}max abs err {a['max_abs_err']:.4g} "
                f"(float output range {a['float_range']:.4g})")


def _float_tensors(tflite: bytes) -> list[str]:
    bad = set()
    for op in read_ops(tflite):
        if op.name in _BOUNDARY_OPS:
            continue
        for t in list(op.inputs) + list(op.outputs):
            if t is not None and not t.is_const and t.dtype.startswith("float"):
                bad.add(op.name)
    return sorted(bad)


def _run_float(tflite: bytes, sample: dict) -> dict:
    from ai_edge_litert.interpreter import Interpreter

    runner = Interpreter(model_content=tflite).get_signature_runner()
    return runner(**{k: np.asarray(v) for k, v in sample.items()})


def _agreement(float_tflite: bytes, int8_tflite: bytes, samples: list, arena: int) -> dict:
    max_err, agree, n_cls, lo, hi = 0.0, 0, 0, np.inf, -np.inf
    for sample in samples:
        ref = _run_float(float_tflite, sample)
        got = run_tflm(int8_tflite, sample, arena)
        for name, r in ref.items():
            r = np.asarray(r, np.float32)
            g = np.asarray(got[name], np.float32).reshape(r.shape)
            max_err = max(max_err, float(np.abs(g - r).max()))
            lo, hi = min(lo, float(r.min())), max(hi, float(r.max()))
            if r.ndim == 2 and r.shape[1] > 1:  # a classifier's logits: compare the argmax per row
                agree += int((g.argmax(1) == r.argmax(1)).sum())
                n_cls += r.shape[0]
    return {"samples": len(samples), "max_abs_err": max_err, "top1": (agree / n_cls) if n_cls else None,
            "float_range": hi - lo}


def convert_iot(float_tflite: bytes, calibration_data, *, verify_inputs=None, io_dtype: str = "int8",
                int8_tflite: bytes | None = None) -> IotModel:
    """Quantize to full-integer int8, check it against TFLite Micro, run it there, measure the arena.

    ``calibration_data``: list of {input name: float array} (or {signature: [...]}) in the float
    model's layout. ``verify_inputs``: samples for the agreement check (default: the calibration set).
    ``io_dtype``: "int8" inputs/outputs (default), or "float32" with QUANTIZE/DEQUANTIZE at the boundary.
    ``int8_tflite``: the full-integer model already made (a PT2E model's, ``pt2e_int8``); ``float_tflite`` is then
    the reference its TFLite Micro run is compared with and ``calibration_data`` is None.
    """
    pre = compatibility(float_tflite, "iot")
    if not pre.ok:  # quantizing cannot add a kernel TFLite Micro lacks: say so before calibrating
        pre.raise_if_fallback()
    int8 = int8_tflite if int8_tflite is not None else quantize_int8(float_tflite, calibration_data, io_dtype=io_dtype)
    compatibility(int8, "iot", strict=True)
    floats = _float_tensors(int8)
    if floats:
        why = ("the PT2E quantizer left them float" if int8_tflite is not None
               else "ai-edge-quantizer has no int8 kernel recipe for them")
        raise NotFullIntegerError(f"after int8 quantization these ops still compute in float: {', '.join(floats)} "
                                  f"({why})")
    arena = measure_arena(int8)
    if isinstance(calibration_data, dict):
        calibration_data = next(iter(calibration_data.values()))
    samples = list(verify_inputs if verify_inputs is not None else calibration_data)
    agreement = _agreement(float_tflite, int8, samples, arena)
    from ai_edge_litert.interpreter import Interpreter

    interp = Interpreter(model_content=int8)
    names_in, names_out = io_names(int8)
    ins = {n: str(np.dtype(d["dtype"])) for n, d in zip(names_in, interp.get_input_details())}
    outs = {n: str(np.dtype(d["dtype"])) for n, d in zip(names_out, interp.get_output_details())}
    return IotModel(int8, arena, compatibility(int8, "iot"), agreement, ins, outs)


def _identifier(name: str) -> str:
    ident = re.sub(r"\W", "_", name)
    return ident if ident and not ident[0].isdigit() else f"m_{ident}"


def c_sources(tflite: bytes, name: str, arena_bytes: int) -> tuple[str, str]:
    """(header, source): the model as a 16-byte aligned byte array (TFLite Micro reads the flatbuffer
    in place and its buffers must stay aligned) and the arena size as a constant."""
    ident = _identifier(name)
    guard = f"{ident.upper()}_MODEL_H_"
    header = f"""// Generated by tpu-export (target iot): {name}.tflite as a C array for TFLite Micro.
#ifndef {guard}
#define {guard}

#include <stddef.h>

#ifdef __cplusplus
extern "C" {{
#endif

// Tensor arena the model needs, measured with TFLite Micro's RecordingMicroAllocator on a 64-bit host.
#define {ident.upper()}_ARENA_SIZE {arena_bytes}u
#define {ident.upper()}_MODEL_SIZE {len(tflite)}u

extern const unsigned char {ident}_model[];  // 16-byte aligned
extern const size_t {ident}_model_len;
extern const size_t {ident}_arena_size;

#ifdef __cplusplus
}}
#endif

#endif  // {guard}
"""
    rows = []
    for i in range(0, len(tflite), 16):
        rows.append("  " + ", ".join(f"0x{b:02x}" for b in tflite[i:i + 16]) + ",")
    source = f"""// Generated by tpu-export (target iot): {name}.tflite as a C array for TFLite Micro.
#include "{name}_model.h"

#if defined(__cplusplus)
#define TPX_ALIGN16 alignas(16)
#else
#define TPX_ALIGN16 _Alignas(16)
#endif

TPX_ALIGN16 const unsigned char {ident}_model[{len(tflite)}] = {{
{chr(10).join(rows)}
}};
const size_t {ident}_model_len = {len(tflite)}u;
const size_t {ident}_arena_size = {ident.upper()}_ARENA_SIZE;
"""
    return header, source


def check_budget(flash_bytes: int, ram_bytes: int, *, flash_kib: float | None = None,
                 ram_kib: float | None = None) -> None:
    """Fail when the model (flash) or its arena (RAM) exceeds the budget, with both numbers."""
    over = []
    if flash_kib is not None and flash_bytes > flash_kib * 1024:
        over.append(f"flash: the model needs {flash_bytes / 1024:.1f} KiB ({flash_bytes} bytes), "
                    f"budget {flash_kib} KiB")
    if ram_kib is not None and ram_bytes > ram_kib * 1024:
        over.append(f"RAM: the tensor arena needs {ram_bytes / 1024:.1f} KiB ({ram_bytes} bytes), budget {ram_kib} KiB")
    if over:
        raise BudgetError("model does not fit the iot budget: " + "; ".join(over))


def write_iot_package(model: IotModel, out_dir: str, name: str = "model", *, flash_kib=None, ram_kib=None) -> dict:
    """Write <name>.tflite, <name>_model.h, <name>_model.c into ``out_dir`` (budgets checked first)."""
    from .files import write_files

    check_budget(model.flash_bytes, model.arena_bytes, flash_kib=flash_kib, ram_kib=ram_kib)
    header, source = c_sources(model.tflite, name, model.arena_bytes)
    return write_files(out_dir, {f"{name}.tflite": model.tflite, f"{name}_model.h": header.encode(),
                                 f"{name}_model.c": source.encode()})


def pt2e_int8(prog, channel_last=False) -> bytes:
    """A PT2E-quantized Program (``prepare_pt2e`` / ``convert_pt2e``) as a full-integer .tflite: int8 kernels with
    the observed ranges and int8 inputs and outputs (edge/quantize_pt2e.py), what TFLite Micro runs.

    Raises:
        NotFullIntegerError: An op, input or output the PT2E quantizer left float (named).
    """
    from tpu_export.edge.convert import lower_program

    from .mobile import _io

    try:
        return lower_program(prog, _io(prog, channel_last), pt2e_io_int8=True).finish()
    except ValueError as e:
        if "full-integer" not in str(e):
            raise
        raise NotFullIntegerError(f"target 'iot': {e}") from None


def package_iot(float_tflite: bytes, job) -> dict:
    """The iot target's ``finish`` hook: int8 through TFLite Micro (convert_iot), then the C package within
    the budgets of ``job.options`` (IotOptions). A PT2E model (``job.quant`` its QuantConfig) is made int8 with
    its own ranges; ``float_tflite`` (its int8 kernels between float inputs and outputs) is the reference."""
    from tpu_export.edge.quantize import is_pt2e_config

    from .checks import calibration_samples, nhwc_inputs

    o = job.options
    ver = None if o.verify_inputs is None else calibration_samples(
        float_tflite, o.verify_inputs, channel_last_inputs=nhwc_inputs(job.prog_or_bytes, job.channel_last_io))
    if is_pt2e_config(job.quant):
        if ver is None:
            raise ValueError("target 'iot' with a PT2E model needs option verify_inputs: the samples its TFLite Micro "
                             "run is checked on (the model was calibrated in torch)")
        if isinstance(job.prog_or_bytes, (bytes, bytearray, memoryview)):
            raise TypeError("target 'iot' with a PT2E quant_config takes the module (or its Program), "
                            "not .tflite bytes")
        int8 = pt2e_int8(job.prog_or_bytes, job.channel_last_io)
        model = convert_iot(float_tflite, None, verify_inputs=ver, int8_tflite=int8)
    else:
        model = convert_iot(float_tflite, job.feeds, verify_inputs=ver, io_dtype=job.quant.io_dtype)
    job.say(model.compat.summary())
    job.say(model.summary())
    return write_iot_package(model, job.out_dir, job.name, flash_kib=o.flash_kib, ram_kib=o.ram_kib)
