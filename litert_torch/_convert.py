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
                quant_config=None, dynamic_shapes=None, enable_x64=False, target=None):
        from converter import prepare_many
        from edge import convert_program

        from ._model import Model

        _not_yet(quant_config, target)
        if module is not None:
            self.signature("serving_default", module, sample_args, sample_kwargs, dynamic_shapes=dynamic_shapes)
        if not self._requests:
            raise ValueError("nothing to convert: pass a module, or add signatures with .signature(...)")
        prog = prepare_many(self._requests, strict=strict_export, enable_x64=enable_x64)
        return Model(convert_program(prog))


def _not_yet(quant_config, target):
    if quant_config is not None:
        raise NotImplementedError("litert_torch.convert: quant_config is not supported yet; convert in float "
                                  "(quant_config=None)")
    if target is not None:
        raise NotImplementedError("litert_torch.convert: target is not supported yet (target=None)")


def convert(module, sample_args=None, sample_kwargs=None, *, strict_export="auto", quant_config=None,
            dynamic_shapes=None, enable_x64=False, target=None):
    """Convert ``module`` (called as module(*sample_args, **sample_kwargs)) to a LiteRT Model."""
    return Converter().convert(module, sample_args, sample_kwargs, strict_export=strict_export,
                               quant_config=quant_config, dynamic_shapes=dynamic_shapes, enable_x64=enable_x64,
                               target=target)


def signature(name: str, module, sample_args=None, sample_kwargs=None, *, dynamic_shapes=None) -> Converter:
    """Start a multi-signature conversion: signature(...).signature(...).convert()."""
    return Converter().signature(name, module, sample_args, sample_kwargs, dynamic_shapes=dynamic_shapes)
