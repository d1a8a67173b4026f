"""The layer recipes that map onto a quantization scheme here (litert-torch 0.10's ``supported_schemes``)."""

from __future__ import annotations

__all__ = ["get_supported_layer_schemes"]


def get_supported_layer_schemes() -> list[tuple]:
    """The supported (activation dtype, weight dtype, mode, algorithm, granularity) combinations.

    Returns:
        One tuple of ``quant_attrs`` members per combination ``LayerQuantRecipe.verify`` accepts.

    Examples:
        >>> from tpu_export.litert_torch.generative.quantize import supported_schemes
        >>> len(supported_schemes.get_supported_layer_schemes())
        9
    """
    from .quant_recipe import _SCHEMES

    return list(_SCHEMES)
