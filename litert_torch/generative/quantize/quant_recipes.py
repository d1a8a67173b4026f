"""The whole-model recipes (litert-torch 0.10's ``quant_recipes``), as ``QuantConfig``s.

    quant_config = quant_recipes.full_dynamic_recipe()
    model = litert_torch.convert(module, args, quant_config=quant_config)

==========================================================================  =========================
recipe                                                                      scheme
==========================================================================  =========================
``full_dynamic_recipe()``                                                   ``dynamic_int8``
``full_dynamic_recipe(weight_dtype=Dtype.INT4, granularity=BLOCKWISE_32)``  ``dynamic_int4_block32``
``full_dynamic_recipe(weight_dtype=Dtype.INT4, granularity=BLOCKWISE_64)``  int4 blocks of 64 (also 128, 256)
``full_dynamic_recipe(weight_dtype=Dtype.INT4)``                            int4 per channel
``full_weight_only_recipe()``                                               ``weight_only_int8``
``full_weight_only_recipe(weight_dtype=Dtype.INT4)``                        ``weight_only_int4``
``full_fp16_recipe()``                                                      ``fp16``
==========================================================================  =========================
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import quant_recipe_utils
from .quant_attrs import Dtype, Granularity

if TYPE_CHECKING:
    from tpu_export.edge.quantize import QuantConfig

__all__ = ["full_dynamic_recipe", "full_weight_only_recipe", "full_fp16_recipe"]


def full_dynamic_recipe(mcfg: Any = None, weight_dtype: Dtype = Dtype.INT8,
                        granularity: Granularity = Granularity.CHANNELWISE) -> QuantConfig:
    """Dynamic-range quantization of every layer: integer weights, activations quantized at run time.

    Args:
        mcfg: litert-torch's model config; accepted and unused (the recipe is the same for every layer).
        weight_dtype: ``Dtype.INT8`` or ``Dtype.INT4``.
        granularity: ``Granularity.CHANNELWISE``, or for int4 ``BLOCKWISE_32``/``64``/``128``/``256``.

    Returns:
        The ``QuantConfig`` for ``convert(..., quant_config=...)``.

    Raises:
        NotImplementedError: The combination has no scheme (the message names the nearest recipe).

    Examples:
        >>> import torch
        >>> from tpu_export import litert_torch
        >>> from tpu_export.litert_torch.generative.quantize import quant_recipes
        >>> quant_recipes.full_dynamic_recipe().scheme
        'dynamic_int8'
        >>> m = torch.nn.Linear(64, 16).eval()
        >>> model = litert_torch.convert(m, (torch.ones(1, 64),), quant_config=quant_recipes.full_dynamic_recipe())
        >>> model(torch.ones(1, 64)).shape
        torch.Size([1, 16])
    """
    return quant_recipe_utils.create_layer_quant_dynamic(weight_dtype, granularity).quant_config()


def full_weight_only_recipe(mcfg: Any = None, weight_dtype: Dtype = Dtype.INT8,
                            granularity: Granularity = Granularity.CHANNELWISE) -> QuantConfig:
    """Weight-only quantization of every layer: integer weights, float compute.

    Args:
        mcfg: litert-torch's model config; accepted and unused (the recipe is the same for every layer).
        weight_dtype: ``Dtype.INT8`` or ``Dtype.INT4``.
        granularity: ``Granularity.CHANNELWISE``.

    Returns:
        The ``QuantConfig`` for ``convert(..., quant_config=...)``.

    Raises:
        NotImplementedError: The combination has no scheme (the message names the nearest recipe).

    Examples:
        >>> from tpu_export.litert_torch.generative.quantize import quant_recipes
        >>> quant_recipes.full_weight_only_recipe().scheme
        'weight_only_int8'
    """
    return quant_recipe_utils.create_layer_quant_weight_only(weight_dtype, granularity).quant_config()


def full_fp16_recipe(mcfg: Any = None) -> QuantConfig:
    """float16 weights for every layer.

    Args:
        mcfg: litert-torch's model config; accepted and unused.

    Returns:
        The ``QuantConfig`` for ``convert(..., quant_config=...)``.

    Examples:
        >>> from tpu_export.litert_torch.generative.quantize import quant_recipes
        >>> quant_recipes.full_fp16_recipe().scheme
        'fp16'
    """
    return quant_recipe_utils.create_layer_quant_fp16().quant_config()
