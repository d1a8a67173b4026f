"""litert_torch.generative: LLMs with their KV cache (litert-torch 0.10's module layout).

    from tpu_export.litert_torch.generative import export_hf
    export_hf.export(model="path/to/hf_dir", output_dir="out", prefill_lengths=[32], cache_length=1024)

The public names are this package's ``__all__``; its submodules are internal and may change between releases.
"""

from __future__ import annotations

__all__ = ["export_hf", "quantize"]


def __getattr__(name):
    if name == "export_hf":
        import importlib

        return importlib.import_module(".export_hf", __name__)
    if name == "quantize":
        import importlib

        return importlib.import_module(".quantize", __name__)
    from .._refused import refuse

    refuse(__name__, name)  # litert-torch 0.10 names not provided: NotImplementedError with the alternative
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
