"""Quantization for edge targets: which schemes each target's runtime runs, and the calls the
packaging uses. The quantization itself (recipes, calibration, ai-edge-quantizer) is edge/quantize.py.
"""

from __future__ import annotations

from tpu_export.edge.quantize import (
    QuantConfig,
    QuantizationError,
    as_quant_config,
    is_pt2e_config,
    quantize_tflite,
    unique_tensor_names,
)

from .registry import get_target

__all__ = ["QuantizationError", "QuantConfig", "unique_tensor_names", "quantize_int8", "resolve_quant",
           "web_scheme", "iot_scheme"]

# The LiteRT interpreter (Android, iOS, desktop CPUs) runs every scheme; LiteRT.js tensors hold float32,
# int32 and uint8 only (targets/web.py), so int8 inputs/outputs are out there; TFLite Micro has integer
# kernels only: full-integer int8 (no hybrid FULLY_CONNECTED/CONV_2D, no int4 or float16 DEQUANTIZE).
# Each rule is the quant_scheme hook of its target class (targets/registry.py).
_IOT_SCHEMES = ("static_int8",)


def web_scheme(cfg: QuantConfig | None) -> QuantConfig | None:
    if cfg is not None and cfg.io_dtype == "int8":
        raise QuantizationError("target 'web': LiteRT.js tensors hold float32, int32 and uint8, not int8; "
                                "use QuantConfig('static_int8', io_dtype='float32')")
    return cfg


def iot_scheme(quant_config) -> QuantConfig:
    """Always full-integer int8; a bare "static_int8" (or none) means int8 I/O, what a microcontroller feeds. A PT2E
    QuantConfig (litert_torch.quantize) is returned as it is: the model's own ranges, int8 I/O (targets/iot.py)."""
    if is_pt2e_config(quant_config):
        global_config = quant_config.pt2e_quantizer.global_config
        if global_config is not None and global_config.is_dynamic:
            raise QuantizationError("target 'iot' (TFLite Micro) runs full-integer int8 only: a dynamic PT2E "
                                    "configuration leaves activations float; use "
                                    "get_symmetric_quantization_config(is_dynamic=False)")
        return quant_config
    cfg = as_quant_config("static_int8" if quant_config is None else quant_config)
    if isinstance(quant_config, str) or quant_config is None:
        cfg = QuantConfig(cfg.scheme, io_dtype="int8") if cfg.scheme == "static_int8" else cfg
    if cfg.recipe is not None or cfg.scheme not in _IOT_SCHEMES:
        raise QuantizationError(f"target 'iot' (TFLite Micro) runs full-integer int8 only: quant_config "
                                f"{cfg.scheme!r} is not runnable there; use 'static_int8' with calibration_data")
    return cfg


def resolve_quant(target, quant_config, calibration_data) -> QuantConfig | None:
    """The QuantConfig ``target``'s runtime runs for ``quant_config`` (its ``quant_scheme`` hook), with the
    calibration data checked against the scheme, without touching the model: before capture."""
    t = get_target(target)
    quant = t.quant_scheme(quant_config)
    if is_pt2e_config(quant) or is_pt2e_config(quant_config):
        if calibration_data is not None:
            raise TypeError(f"target {t.name!r} does not take option calibration_data with a PT2E quant_config: "
                            "the model was calibrated in torch (prepare_pt2e) before convert_pt2e")
        return quant
    if quant is not None and quant.needs_calibration and calibration_data is None:
        raise QuantizationError(f"target {t.name!r}: {quant.scheme} builds a full-integer int8 model and needs "
                                "calibration_data (a list of sample inputs: tuples of the module's args, or "
                                "{input name: array})")
    if calibration_data is not None and (quant is None or not quant.needs_calibration):
        raise TypeError(f"target {t.name!r} does not take option calibration_data without a static quant_config "
                        "(e.g. quant_config='static_int8')")
    return quant


def _signature_inputs(tflite: bytes) -> dict[str, list[str]]:
    from ai_edge_litert.interpreter import Interpreter

    sigs = Interpreter(model_content=tflite).get_signature_list()
    return {k: list(v["inputs"]) for k, v in sigs.items()}


def _calibration_by_signature(tflite: bytes, calibration_data) -> dict:
    """Accepts {signature: [ {input name: array}, ... ]}, or a list of {input name: array} for a one-signature model."""
    sigs = _signature_inputs(tflite)
    if isinstance(calibration_data, dict) and set(calibration_data) <= set(sigs):
        data = calibration_data
    elif len(sigs) == 1:
        data = {next(iter(sigs)): list(calibration_data)}
    else:
        raise QuantizationError(f"calibration_data must be keyed by signature ({', '.join(sigs)})")
    for sig, samples in data.items():
        if not samples:
            raise QuantizationError(f"calibration_data for signature {sig!r} is empty")
        for i, sample in enumerate(samples):
            missing = set(sigs[sig]) - set(sample)
            if missing:
                raise QuantizationError(f"calibration sample {i} of {sig!r} lacks inputs {sorted(missing)}; "
                                        f"the model's inputs are {sigs[sig]}")
    return data


def quantize_int8(tflite: bytes, calibration_data, *, io_dtype: str = "int8") -> bytes:
    """Full-integer int8 (weights and activations; int8 inputs/outputs by default), calibrated on
    ``calibration_data``: [{input name: array}] in the .tflite's layout, or {signature: [...]}."""
    if calibration_data is None:
        raise QuantizationError("full-integer int8 needs calibration_data: a list of {input name: array} samples "
                                "(or {signature: [...]}) that look like real inputs")
    model = unique_tensor_names(tflite)
    data = _calibration_by_signature(model, calibration_data)
    return quantize_tflite(model, QuantConfig("static_int8", io_dtype=io_dtype), data)
