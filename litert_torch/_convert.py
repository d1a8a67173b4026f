"""convert(), signature() and Converter: capture once with converter/, lower with edge/."""

from __future__ import annotations

from typing import Any

__all__ = ["convert", "signature", "Converter"]


class Converter:
    """Collects signatures (name, module, sample inputs) and converts them into one Model whose
    signatures share weights: a parameter common to several modules is stored once."""

    def __init__(self):
        self._requests: list = []

    def signature(self, name: str, module, sample_args=None, sample_kwargs=None, *,
                  dynamic_shapes: Any = None, dim_sizes: dict | None = None) -> "Converter":
        """``module``: an nn.Module, ExportedProgram, .pt2 path, or an ONNX model (an .onnx path or an
        onnx.ModelProto: sample inputs optional; ``dim_sizes={"batch": 1}`` fixes its named dims)."""
        from tpu_export.converter import SignatureRequest
        from tpu_export.converter.onnx import is_onnx

        if any(r.name == name for r in self._requests):
            raise ValueError(f"signature {name!r} was already added")
        if is_onnx(module):
            from tpu_export.converter.onnx import capture_inputs

            module, sample_args, dynamic_shapes = capture_inputs(module, sample_args, dynamic_shapes, dim_sizes)
        elif dim_sizes is not None:
            raise TypeError("dim_sizes is for ONNX models (an .onnx path or a ModelProto)")
        args = () if sample_args is None else sample_args
        self._requests.append(SignatureRequest(name, module, args, sample_kwargs, dynamic_shapes))
        return self

    def convert(self, module=None, sample_args=None, sample_kwargs=None, *, strict_export="auto",
                quant_config=None, calibration_data=None, dynamic_shapes=None, enable_x64=False,
                output_file_path=None, lightweight_conversion=False, delete_in_memory_params=False,
                weights_loader=None, progress=None, dim_sizes=None):
        from tpu_export.converter import prepare_many
        from tpu_export.converter.gc_pause import gc_paused
        from tpu_export.edge.quantize import as_quant_config, calibration_feeds, quantize_tflite

        from ._large import check_memory, materialized, streams_quantization, write_or_bytes

        quant = as_quant_config(quant_config)  # an unknown scheme fails before capture
        if calibration_data is not None and (quant is None or not quant.needs_calibration):
            raise ValueError(f"calibration_data is only used by static int8 quantization; quant_config is "
                             f"{quant_config!r}")
        if module is not None:
            self.signature("serving_default", module, sample_args, sample_kwargs, dynamic_shapes=dynamic_shapes,
                           dim_sizes=dim_sizes)
        if not self._requests:
            raise ValueError("nothing to convert: pass a module, or add signatures with .signature(...)")
        modules = [r.module for r in self._requests]
        to_file = output_file_path is not None or lightweight_conversion
        streamed = streams_quantization(quant, modules, to_file)
        if streamed:
            quant = None  # applied tensor by tensor as the weights are written
        check_memory(modules, to_file=to_file and quant is None, loader=weights_loader)
        with materialized(modules, weights_loader, output_file_path, progress), gc_paused():
            prog = prepare_many(self._requests, strict=strict_export, enable_x64=enable_x64)
            # calibration samples are checked against the signatures before lowering
            feeds = calibration_feeds(prog, calibration_data) if quant is not None and quant.needs_calibration else None
            result = write_or_bytes(prog, modules, output_file_path=None if quant is not None else output_file_path,
                                    lightweight=lightweight_conversion and quant is None,
                                    delete_params=delete_in_memory_params, progress=progress,
                                    stream_quant=streamed)
        if quant is not None:
            result = quantize_tflite(result.tflite_model() if not isinstance(result, bytes) else result, quant, feeds)
            if output_file_path is not None:
                from ._model import Model

                Model(result).export(output_file_path)
                return Model(output_file_path)
        if isinstance(result, bytes):
            from ._model import Model

            return Model(result)
        return result


def convert(module, sample_args=None, sample_kwargs=None, *, strict_export="auto", quant_config=None,
            calibration_data=None, dynamic_shapes=None, enable_x64=False, output_file_path=None,
            lightweight_conversion=False, delete_in_memory_params=False, weights_loader=None, progress=None,
            dim_sizes=None):
    """Convert ``module`` (called as module(*sample_args, **sample_kwargs)) to a LiteRT Model.

    ``module`` may be an ONNX model: an ``.onnx`` path or an ``onnx.ModelProto`` (sample inputs optional;
    ``dim_sizes={"batch": 1}`` fixes named dims, the others stay dynamic).

    ``quant_config``: a scheme name ("dynamic_int8", "weight_only_int8", "weight_only_int4", "fp16",
    "static_int8"), a ``QuantConfig`` (e.g. ``QuantConfig("static_int8", io_dtype="int8")``) or an
    ai-edge-quantizer recipe; ``calibration_data``: an iterable of sample-argument tuples (static int8).

    Large models (litert-torch 0.10's names and meanings):
    ``output_file_path``: write the .tflite there, streaming the weights into the file (no
    whole-model bytes in memory), and return a Model that memory-maps it; past 2 GiB the file is
    in the large-model form (weights after the flatbuffer). ``lightweight_conversion``: the same
    streaming write into a temp file when no path is given (deleted with the Model).
    ``delete_in_memory_params``: free each parameter's storage once its bytes are in the file
    (the module is unusable afterwards). ``weights_loader``: a callable ``name -> tensor`` or a
    dict giving parameter values by ``named_parameters()`` name; with the module built on the meta
    device, weights are loaded one at a time into a file-backed map, never all in memory
    (``converter.safetensors_weights.safetensors_loader(folder)`` reads a model directory's shards).
    ``progress(msg)``: a line per long step (weights written: tensors, MiB, MiB/s).
    With ``quant_config`` ``"dynamic_int8"``, ``"weight_only_int8"`` or ``"dynamic_int4_block32"``, a
    file output and more than 1 GiB of weights, the quantization runs while streaming: each
    FULLY_CONNECTED weight and embedding table (made an EMBEDDING_LOOKUP) gets the bytes and scales
    ai-edge-quantizer's recipe of that name gives it as it is written, without a float copy of the
    model in memory; other constants (convolutions) stay float.
    """
    return Converter().convert(module, sample_args, sample_kwargs, strict_export=strict_export,
                               quant_config=quant_config, calibration_data=calibration_data,
                               dynamic_shapes=dynamic_shapes, enable_x64=enable_x64,
                               output_file_path=output_file_path, lightweight_conversion=lightweight_conversion,
                               delete_in_memory_params=delete_in_memory_params, weights_loader=weights_loader,
                               progress=progress, dim_sizes=dim_sizes)


def signature(name: str, module, sample_args=None, sample_kwargs=None, *, dynamic_shapes=None,
              dim_sizes=None) -> Converter:
    """Start a multi-signature conversion: signature(...).signature(...).convert()."""
    return Converter().signature(name, module, sample_args, sample_kwargs, dynamic_shapes=dynamic_shapes,
                                 dim_sizes=dim_sizes)
