"""QuantConfig: litert-torch 0.10's quantization request for ``litert_torch.convert(..., quant_config=...)``.

``QuantConfig(pt2e_quantizer=quantizer)`` says the module was quantized with PT2E (``prepare_pt2e`` /
``prepare_qat_pt2e`` and ``convert_pt2e`` with our PT2EQuantizer): the conversion folds its quantize / dequantize
pairs into LiteRT int8 kernels with the observed ranges (dynamic-range kernels for a dynamic configuration).
"""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["QuantConfig"]


@dataclasses.dataclass(frozen=True, init=False)
class QuantConfig:
    """How the converted model is quantized (litert-torch 0.10's ``litert_torch.quantize.quant_config``).

    Attributes:
        pt2e_quantizer: The PT2EQuantizer the module was prepared with (its global configuration tells static
            from dynamic).
        generative_recipe: litert-torch's Generative-API recipes are not supported here (refused by name).
    """

    pt2e_quantizer: Any = None
    generative_recipe: Any = None

    def __init__(self, pt2e_quantizer: Any = None, generative_recipe: Any = None):
        """Args:
            pt2e_quantizer: The ``PT2EQuantizer`` passed to ``prepare_pt2e`` / ``prepare_qat_pt2e``.
            generative_recipe: Not supported (raises).

        Raises:
            NotImplementedError: ``generative_recipe`` is given (pass ``quant_config=quant_recipes.full_*_recipe()``
                or a scheme name such as ``"dynamic_int8"`` to ``litert_torch.convert`` instead).
            ValueError: ``pt2e_quantizer`` is not given.
            TypeError: ``pt2e_quantizer`` is not a PT2EQuantizer.
        """
        from .pt2e_quantizer import PT2EQuantizer

        if generative_recipe is not None:
            raise NotImplementedError(
                "QuantConfig(generative_recipe=...) (litert-torch 0.10) is not provided: pass the recipe itself, "
                "litert_torch.convert(..., quant_config=quant_recipes.full_dynamic_recipe()) (or a scheme name such "
                "as 'dynamic_int8'), or quantize with PT2E and QuantConfig(pt2e_quantizer=...)")
        if pt2e_quantizer is None:
            raise ValueError("QuantConfig needs pt2e_quantizer: the PT2EQuantizer the module was prepared with")
        if not isinstance(pt2e_quantizer, PT2EQuantizer):
            raise TypeError(f"QuantConfig(pt2e_quantizer=...) takes a litert_torch.quantize.pt2e_quantizer."
                            f"PT2EQuantizer, got {type(pt2e_quantizer).__name__}")
        object.__setattr__(self, "pt2e_quantizer", pt2e_quantizer)
        object.__setattr__(self, "generative_recipe", None)

    @property
    def is_dynamic(self) -> bool:
        """Whether the quantizer's global configuration is dynamic (weights only, dynamic-range kernels)."""
        cfg = self.pt2e_quantizer.global_config
        return bool(cfg is not None and cfg.is_dynamic)
