"""Layer recipe constructors (litert-torch 0.10's ``quant_recipe_utils``)."""

from __future__ import annotations

from .quant_attrs import Algorithm, Dtype, Granularity, Mode
from .quant_recipe import LayerQuantRecipe

__all__ = ["create_layer_quant_dynamic", "create_layer_quant_weight_only", "create_layer_quant_fp16"]


def create_layer_quant_dynamic(weight_dtype: Dtype = Dtype.INT8,
                               granularity: Granularity = Granularity.CHANNELWISE) -> LayerQuantRecipe:
    """A dynamic-range recipe: integer weights, float activations quantized at run time.

    Args:
        weight_dtype: ``Dtype.INT8`` or ``Dtype.INT4``.
        granularity: ``Granularity.CHANNELWISE`` or (int4) a ``BLOCKWISE_*`` size.

    Returns:
        The layer recipe.
    """
    return LayerQuantRecipe(Dtype.FP32, weight_dtype, Mode.DYNAMIC_RANGE, Algorithm.MIN_MAX, granularity)


def create_layer_quant_weight_only(weight_dtype: Dtype = Dtype.INT8,
                                   granularity: Granularity = Granularity.CHANNELWISE) -> LayerQuantRecipe:
    """A weight-only recipe: integer weights, dequantized for float compute.

    Args:
        weight_dtype: ``Dtype.INT8`` or ``Dtype.INT4``.
        granularity: ``Granularity.CHANNELWISE``.

    Returns:
        The layer recipe.
    """
    return LayerQuantRecipe(Dtype.FP32, weight_dtype, Mode.WEIGHT_ONLY, Algorithm.MIN_MAX, granularity)


def create_layer_quant_fp16() -> LayerQuantRecipe:
    """A float16-weights recipe.

    Returns:
        The layer recipe.
    """
    return LayerQuantRecipe(Dtype.FP32, Dtype.FP16, Mode.WEIGHT_ONLY, Algorithm.FLOAT_CAST, Granularity.NONE)
