"""litert_torch.generative.quantize: litert-torch 0.10's quantization recipes for generative models, mapped onto
tpu-export's quantization schemes.

    from tpu_export.litert_torch.generative.quantize import quant_recipes
    model = litert_torch.convert(module, args, quant_config=quant_recipes.full_dynamic_recipe())

Each recipe is a ``QuantConfig`` (``litert_torch.QuantConfig``) that ``convert(..., quant_config=...)`` and
``export_hf.export(..., quantization_recipe=...)`` take. The recipes apply to the whole model, as litert-torch's
``full_*`` recipes do; a combination with no scheme behind it is refused by name with the nearest one.

The public names are this package's ``__all__``; its submodules are internal and may change between releases
(each is also importable under its litert-torch 0.10 name).
"""

from __future__ import annotations

__all__ = ["quant_recipes", "quant_attrs", "quant_recipe", "quant_recipe_utils", "supported_schemes"]


def __getattr__(name):
    import importlib

    # literal names, one per submodule (tests/test_layers.py refuses computed module names)
    if name == "quant_recipes":
        m = importlib.import_module(".quant_recipes", __name__)
    elif name == "quant_attrs":
        m = importlib.import_module(".quant_attrs", __name__)
    elif name == "quant_recipe":
        m = importlib.import_module(".quant_recipe", __name__)
    elif name == "quant_recipe_utils":
        m = importlib.import_module(".quant_recipe_utils", __name__)
    elif name == "supported_schemes":
        m = importlib.import_module(".supported_schemes", __name__)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return m
