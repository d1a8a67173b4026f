"""litert-torch 0.10's public names that this package does not provide, each with the reason and the alternative.

Accessing one (``litert_torch.backend``, ``from litert_torch.generative import layers``) raises NotImplementedError
with that line. tests/write_litert_torch_compat_doc.py lists them in docs/litert_torch_compat.md.
"""

from __future__ import annotations

__all__ = ["REFUSED", "RefusedSubmodules", "refuse"]

_EXPORT_HF = ("convert the transformers model with litert_torch.generative.export_hf.export(model=..., "
              "output_dir=...) (or `tpu-export convert-lm`), which runs transformers' own modeling code")
# dotted name under litert_torch -> what to use instead
REFUSED: dict[str, str] = {
    "converter_v2": "litert-torch's TensorFlow-based converter V2 is not part of this package; litert_torch.convert "
                    "is the one converter (torch.export -> LiteRT builtins)",
    "backend": "litert-torch's lowering internals; register your own op lowerings with tpu_export.edge.lowering "
               "(docs/custom_ops.md)",
    "fx_infra": "litert-torch's FX pass infrastructure; the shared passes are tpu_export.converter.passes",
    "examples": "litert-torch's example models are not shipped; convert your module with litert_torch.convert",
    "testing": "litert-torch's test helpers; compare model(*args) with the module's output (torch.testing)",
    "cli": "use the `tpu-export` command line (tpu-export convert / convert-lm / debug)",
    "progress": "pass progress=print to litert_torch.convert, or set litert_torch.config.show_progress = True",
    "version": "use litert_torch.__version__",
    "model": "the converted model's class is litert_torch.Model (litert_torch.load(path) loads a .tflite)",
    "generative.layers": "the re-authored transformer layers are not provided; " + _EXPORT_HF,
    "generative.examples": "the re-authored example LLMs are not provided; " + _EXPORT_HF,
    "generative.utilities": "the re-authored model builders and loaders are not provided; " + _EXPORT_HF,
    "generative.custom_ops": "litert-torch's generative custom ops are not provided; the KV cache update is "
                             "lowered from transformers' code by export_hf",
    "generative.fx_passes": "litert-torch's generative FX passes are not provided; the converter's passes run on "
                            "every conversion",
    "generative.tools": "litert-torch's generative tools are not provided; `tpu-export convert-lm` checks each "
                        "exported LLM's prefill logits against transformers",
}


def refuse(package: str, name: str) -> None:
    """Raise NotImplementedError for ``package.name`` when it is one of REFUSED; return otherwise."""
    prefix = "tpu_export.litert_torch"
    rel = package[len(prefix) + 1:] if package.startswith(prefix + ".") else ""
    key = f"{rel}.{name}" if rel else name
    if key not in REFUSED:
        return
    raise NotImplementedError(f"litert_torch.{key} (litert-torch 0.10) is not provided: {REFUSED[key]}")


class RefusedSubmodules:
    """The ``__path__`` of a refused module: importing any submodule of it (``import
    litert_torch.generative.examples.gemma``, as 0.10 scripts do) raises the module's NotImplementedError.

    The import system looks a submodule up by iterating its parent's ``__path__``; iterating this one refuses. It
    keeps the refusal local to the module, where a finder on ``sys.meta_path`` would be process-wide state.
    """

    def __init__(self, key: str):
        self.key = key

    def __iter__(self):
        raise NotImplementedError(f"litert_torch.{self.key} (litert-torch 0.10) is not provided: {REFUSED[self.key]}")

    def __repr__(self) -> str:
        return f"RefusedSubmodules({self.key!r})"
