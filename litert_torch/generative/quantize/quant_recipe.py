"""Layer and model quantization recipes (litert-torch 0.10's ``quant_recipe``), each mapped onto a scheme.

A ``GenerativeQuantRecipe`` converts to a ``QuantConfig`` (``.quant_config()``); ``quant_recipes.full_*`` return
that ``QuantConfig`` directly.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from .quant_attrs import Algorithm, Dtype, Granularity, Mode

if TYPE_CHECKING:
    from tpu_export.edge.quantize import QuantConfig

__all__ = ["LayerQuantRecipe", "GenerativeQuantRecipe"]

_F32 = Dtype.FP32
_DYN, _WO = Mode.DYNAMIC_RANGE, Mode.WEIGHT_ONLY
_MM = Algorithm.MIN_MAX
_BLOCKS = {Granularity.BLOCKWISE_64: 64, Granularity.BLOCKWISE_128: 128, Granularity.BLOCKWISE_256: 256}
# (activation, weight, mode, algorithm, granularity) -> our scheme name (edge/quantize.py SCHEMES), or the name of
# an ai-edge-quantizer recipe built here (int4 dynamic range with other block sizes, or per channel)
_SCHEMES: dict[tuple, str] = {
    (_F32, Dtype.INT8, _DYN, _MM, Granularity.CHANNELWISE): "dynamic_int8",
    (_F32, Dtype.INT8, _WO, _MM, Granularity.CHANNELWISE): "weight_only_int8",
    (_F32, Dtype.FP16, _WO, Algorithm.FLOAT_CAST, Granularity.NONE): "fp16",
    (_F32, Dtype.INT4, _DYN, _MM, Granularity.BLOCKWISE_32): "dynamic_int4_block32",
    (_F32, Dtype.INT4, _DYN, _MM, Granularity.BLOCKWISE_64): "dynamic_int4_block64",
    (_F32, Dtype.INT4, _DYN, _MM, Granularity.BLOCKWISE_128): "dynamic_int4_block128",
    (_F32, Dtype.INT4, _DYN, _MM, Granularity.BLOCKWISE_256): "dynamic_int4_block256",
    (_F32, Dtype.INT4, _DYN, _MM, Granularity.CHANNELWISE): "dynamic_int4_channelwise",
    (_F32, Dtype.INT4, _WO, _MM, Granularity.CHANNELWISE): "weight_only_int4",
}


def _nearest(r: LayerQuantRecipe) -> str:
    if r.activation_dtype != _F32:
        return "QuantConfig('static_int8') with calibration_data (activations quantized)"
    if r.weight_dtype == Dtype.FP16:
        return "full_fp16_recipe() ('fp16')"
    if r.weight_dtype == Dtype.INT4:
        return ("full_dynamic_recipe(weight_dtype=Dtype.INT4, granularity=Granularity.BLOCKWISE_32)"
                if r.mode == _DYN else "full_weight_only_recipe(weight_dtype=Dtype.INT4) ('weight_only_int4')")
    return "full_dynamic_recipe() ('dynamic_int8')" if r.mode == _DYN else "full_weight_only_recipe() " \
        "('weight_only_int8')"


def _int4_recipe(granularity: Granularity) -> list:
    from ai_edge_quantizer import qtyping, recipe_manager

    g = qtyping.QuantGranularity
    rm = recipe_manager.RecipeManager()
    rm.add_dynamic_config(regex=".*", operation_name=qtyping.TFLOperationName.ALL_SUPPORTED, num_bits=4,
                          granularity=g.CHANNELWISE if granularity == Granularity.CHANNELWISE
                          else getattr(g, granularity.name))
    return rm.get_quantization_recipe()


@dataclasses.dataclass
class LayerQuantRecipe:
    """How one layer (or the whole model) is quantized.

    Args:
        activation_dtype: The activations' dtype (``Dtype.FP32``: float activations).
        weight_dtype: The weights' dtype.
        mode: ``Mode.DYNAMIC_RANGE`` or ``Mode.WEIGHT_ONLY``.
        algorithm: ``Algorithm.MIN_MAX`` (integers) or ``Algorithm.FLOAT_CAST`` (fp16).
        granularity: ``Granularity.CHANNELWISE``, a ``BLOCKWISE_*`` size, or ``NONE`` (fp16).
    """

    activation_dtype: Dtype
    weight_dtype: Dtype
    mode: Mode
    algorithm: Algorithm
    granularity: Granularity

    def __str__(self) -> str:
        return (f"(a:{self.activation_dtype.name}, w:{self.weight_dtype.name}, {self.mode.name}, "
                f"{self.algorithm.name}, {self.granularity.name}, )")

    __repr__ = __str__

    def _key(self) -> tuple:
        return (self.activation_dtype, self.weight_dtype, self.mode, self.algorithm, self.granularity)

    def verify(self) -> None:
        """Check that the combination maps onto a quantization scheme.

        Raises:
            NotImplementedError: It does not (the message names the nearest recipe that does).
        """
        if self._key() not in _SCHEMES:
            raise NotImplementedError(f"LayerQuantRecipe{self} has no quantization scheme here (supported: "
                                      f"supported_schemes.get_supported_layer_schemes()); nearest: {_nearest(self)}")

    def quant_config(self) -> QuantConfig:
        """The ``QuantConfig`` that applies this recipe to every layer.

        Returns:
            A ``litert_torch.QuantConfig``.

        Raises:
            NotImplementedError: The combination has no scheme here.
        """
        from tpu_export.edge.quantize import QuantConfig

        self.verify()
        scheme = _SCHEMES[self._key()]
        if scheme.startswith("dynamic_int4_") and scheme != "dynamic_int4_block32":
            return QuantConfig(scheme, recipe=_int4_recipe(self.granularity))
        return QuantConfig(scheme)


@dataclasses.dataclass
class GenerativeQuantRecipe:
    """A model's quantization: a default layer recipe (litert-torch 0.10's per-block overrides are refused).

    Args:
        default: The recipe for every layer.
        embedding: litert-torch's embedding-table override: None, or the same as ``default``.
        attention: litert-torch's attention-block override: None, or the same as ``default``.
        feedforward: litert-torch's feed-forward override: None, or the same as ``default``.
    """

    default: LayerQuantRecipe | None = None
    embedding: LayerQuantRecipe | None = None
    attention: LayerQuantRecipe | dict[int, LayerQuantRecipe] | None = None
    feedforward: LayerQuantRecipe | dict[int, LayerQuantRecipe] | None = None
    _model_config: Any = None

    def __str__(self) -> str:
        return (f"GenerativeQuantRecipe(\n  Default: {self.default}\n  Embedding: {self.embedding}\n"
                f"  Attention: {self.attention}\n  Feedforward: {self.feedforward}\n)")

    __repr__ = __str__

    def verify(self) -> None:
        """Check that the recipe maps onto one quantization scheme.

        Raises:
            NotImplementedError: A per-layer override differs from ``default``, or ``default`` has no scheme.
            ValueError: ``default`` is missing.
        """
        if self.default is None:
            raise ValueError("GenerativeQuantRecipe: default= is required (the recipe for every layer)")
        for field in ("embedding", "attention", "feedforward"):
            v = getattr(self, field)
            if v is not None and v != self.default:
                raise NotImplementedError(
                    f"GenerativeQuantRecipe({field}=...): per-layer overrides apply to litert-torch's own generative "
                    "layers, which are not part of this package; quantize selected ops with an ai-edge-quantizer "
                    "recipe list (quant_config=[...], one regex per op group)")
        self.default.verify()

    def quant_config(self) -> QuantConfig:
        """The ``QuantConfig`` for ``convert(..., quant_config=...)``.

        Returns:
            A ``litert_torch.QuantConfig``.

        Raises:
            NotImplementedError: See ``verify``.
            ValueError: ``default`` is missing.
        """
        self.verify()
        return self.default.quant_config()
