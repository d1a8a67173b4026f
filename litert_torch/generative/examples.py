"""litert-torch 0.10's ``litert_torch.generative.examples``: not provided. Every name taken from it
(``from litert_torch.generative.examples import ...``) and every submodule (``import
litert_torch.generative.examples.<name>``) raise NotImplementedError naming the alternative
(litert_torch/_refused.py)."""

from tpu_export.litert_torch._refused import RefusedSubmodules, refuse

__all__: list[str] = []
__path__ = RefusedSubmodules("generative.examples")


def __getattr__(name):
    if not name.startswith("__"):
        refuse("tpu_export.litert_torch.generative", "examples")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
