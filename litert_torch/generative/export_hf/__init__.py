"""litert_torch.generative.export_hf: an LLM (model directory or object) to a .litertlm bundle, with litert-torch
0.10's names. Both spellings its users write work:

    from tpu_export.litert_torch.generative import export_hf
    export_hf.export(model="path/to/hf_dir", output_dir="out", prefill_lengths=[32], cache_length=1024)

    from tpu_export.litert_torch.generative.export_hf import export   # litert-torch 0.10: ``export`` is a module there
    export.export(model="path/to/hf_dir", output_dir="out")

The public names are this package's ``__all__``; its submodules are internal and may change between releases.
"""

from __future__ import annotations

from .export import export

# litert-torch 0.10 keeps the function in a submodule of the same name (``export_hf.export.export``); the package
# attribute is our function, which also answers to ``.export`` so that code written against the peer runs unchanged
export.export = export

__all__ = ["export"]
