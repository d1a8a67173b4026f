"""Quantizing a float .tflite with ai-edge-quantizer: full-integer int8 (static) and float16 weights.

ai-edge-quantizer keys its recipe and calibration results by tensor name and refuses a model whose
tensor names repeat, so names are made unique first (see ``unique_tensor_names``).
"""

from __future__ import annotations

import collections

__all__ = ["unique_tensor_names", "quantize_int8", "float16_weights", "QuantizationError"]


class QuantizationError(RuntimeError):
    pass


def unique_tensor_names(tflite: bytes) -> bytes:
    """The same model with every repeated tensor name in a subgraph suffixed ``_1``, ``_2``...

    The edge writer can give an op's output the name of the op it was lowered from (e.g. the PAD
    before a CONV_2D); ai-edge-quantizer's ParamsGenerator requires unique names. Returns the input
    unchanged when the names are already unique.
    """
    from ai_edge_litert import schema_py_generated as s

    model = s.Model.GetRootAs(tflite, 0)
    dup = False
    for g in range(model.SubgraphsLength()):
        sg = model.Subgraphs(g)
        names = [sg.Tensors(i).Name() for i in range(sg.TensorsLength())]
        if len(set(names)) != len(names):
            dup = True
            break
    if not dup:
        return tflite
    import flatbuffers

    obj = s.ModelT.InitFromObj(model)
    for sg in obj.subgraphs:
        taken = {t.name for t in sg.tensors}
        seen = collections.Counter()
        for t in sg.tensors:
            seen[t.name] += 1
            if seen[t.name] > 1:
                k = seen[t.name] - 1
                while t.name + b"_%d" % k in taken:
                    k += 1
                t.name = t.name + b"_%d" % k
                taken.add(t.name)
    b = flatbuffers.Builder(len(tflite) + (1 << 16))
    b.Finish(obj.Pack(b), file_identifier=b"TFL3")
    return bytes(b.Output())


def _signature_inputs(tflite: bytes) -> dict[str, list[str]]:
    from ai_edge_litert.interpreter import Interpreter

    sigs = Interpreter(model_content=tflite).get_signature_list()
    return {k: list(v["inputs"]) for k, v in sigs.items()}


def _calibration_by_signature(tflite: bytes, calibration_data) -> dict:
    """Accepts {signature: [ {input: array}, ... ]}, or a list of {input: array} for a one-signature model."""
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


def quantize_int8(tflite: bytes, calibration_data) -> bytes:
    """Full-integer int8 (weights and activations; int8 inputs/outputs) by ai-edge-quantizer's
    static_wi8_ai8 recipe, calibrated on ``calibration_data``."""
    from ai_edge_quantizer import quantizer, recipe

    if calibration_data is None:
        raise QuantizationError("full-integer int8 needs calibration_data: a list of {input name: array} samples "
                                "(or {signature: [...]}) that look like real inputs")
    model = unique_tensor_names(tflite)
    data = _calibration_by_signature(model, calibration_data)
    q = quantizer.Quantizer(bytearray(model), recipe.static_wi8_ai8())
    try:
        result = q.calibrate(data, num_threads=2)
        out = q.quantize(result, enable_progress_report=False)
    except Exception as e:  # noqa: BLE001 - the quantizer raises plain ValueErrors; name the step
        raise QuantizationError(f"ai-edge-quantizer (static int8) failed: {type(e).__name__}: {e}") from e
    return bytes(out.quantized_model)


def float16_weights(tflite: bytes) -> bytes:
    """Weights of FULLY_CONNECTED / CONV_2D / DEPTHWISE_CONV_2D / TRANSPOSE_CONV / EMBEDDING_LOOKUP stored
    as float16 (ai-edge-quantizer's float_casting algorithm): half the size; the GPU delegates compute
    in fp16 anyway, the CPU dequantizes once at load."""
    from ai_edge_quantizer import qtyping, quantizer
    from ai_edge_quantizer.algorithm_manager import AlgorithmName

    q = quantizer.Quantizer(bytearray(unique_tensor_names(tflite)))
    q.add_weight_only_config(".*", qtyping.TFLOperationName.ALL_SUPPORTED, 16,
                             algorithm_key=AlgorithmName.FLOAT_CASTING)
    try:
        out = q.quantize(enable_progress_report=False)
    except Exception as e:  # noqa: BLE001
        raise QuantizationError(f"ai-edge-quantizer (float16 weights) failed: {type(e).__name__}: {e}") from e
    return bytes(out.quantized_model)
