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
                  dynamic_shapes: Any = None) -> "Converter":
        from converter import SignatureRequest

        if any(r.name == name for r in self._requests):
            raise ValueError(f"signature {name!r} was already added")
        args = () if sample_args is None else sample_args
        self._requests.append(SignatureRequest(name, module, args, sample_kwargs, dynamic_shapes))
        return self

    def convert(self, module=None, sample_args=None, sample_kwargs=None, *, strict_export="auto",
                quant_config=None, calibration_data=None, dynamic_shapes=None, enable_x64=False):
        from converter import prepare_many
        from converter.gc_pause import gc_paused
        from edge import convert_program
        from edge.quantize import as_quant_config, calibration_feeds, quantize_tflite

        from ._model import Model

        quant = as_quant_config(quant_config)  # an unknown scheme fails before capture
        if calibration_data is not None and (quant is None or not quant.needs_calibration):
            raise ValueError(f"calibration_data is only used by static int8 quantization; quant_config is "
                             f"{quant_config!r}")
        if module is not None:
            self.signature("serving_default", module, sample_args, sample_kwargs, dynamic_shapes=dynamic_shapes)
        if not self._requests:
            raise ValueError("nothing to convert: pass a module, or add signatures with .signature(...)")
        with gc_paused():
            prog = prepare_many(self._requests, strict=strict_export, enable_x64=enable_x64)
            # calibration samples are checked against the signatures before lowering
            feeds = calibration_feeds(prog, calibration_data) if quant is not None and quant.needs_calibration else None
            tflite = convert_program(prog)
        if quant is not None:
            tflite = quantize_tflite(tflite, quant, feeds)
        return Model(tflite)


def convert(module, sample_args=None, sample_kwargs=None, *, strict_export="auto", quant_config=None,
            calibration_data=None, dynamic_shapes=None, enable_x64=False):
    """Convert ``module`` (called as module(*sample_args, **sample_kwargs)) to a LiteRT Model.

    ``quant_config``: a scheme name ("dynamic_int8", "weight_only_int8", "weight_only_int4", "fp16",
    "static_int8"), a ``QuantConfig`` (e.g. ``QuantConfig("static_int8", io_dtype="int8")``) or an
    ai-edge-quantizer recipe; ``calibration_data``: an iterable of sample-argument tuples (static int8).
    """
    return Converter().convert(module, sample_args, sample_kwargs, strict_export=strict_export,
                               quant_config=quant_config, calibration_data=calibration_data,
                               dynamic_shapes=dynamic_shapes, enable_x64=enable_x64)


def signature(name: str, module, sample_args=None, sample_kwargs=None, *, dynamic_shapes=None) -> Converter:
    """Start a multi-signature conversion: signature(...).signature(...).convert()."""
    return Converter().signature(name, module, sample_args, sample_kwargs, dynamic_shapes=dynamic_shapes)
