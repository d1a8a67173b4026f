"""litert-torch 0.10's ``litert_torch.generative.examples``: not provided. Every name taken from it
(``from litert_torch.generative.examples import ...``) raises NotImplementedError naming the alternative
(litert_torch/_refused.py)."""

from tpu_export.litert_torch._refused import refuse

__all__: list[str] = []


def __getattr__(name):
    if not name.startswith("__"):
        refuse("tpu_export.litert_torch.generative", "examples")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
