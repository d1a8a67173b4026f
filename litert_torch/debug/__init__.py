"""litert_torch.debug: find the part of a model that fails to convert or converts to different numbers
(litert-torch 0.10's ``find_culprits``).

    for culprit in litert_torch.debug.find_culprits(model, args):
        culprit.print_code()   # a runnable snippet: the smallest failing subgraph, with your source lines

The public names are this package's ``__all__``; its submodules are internal and may change between releases.
"""

from __future__ import annotations

from tpu_export.converter.lazy_exports import lazy_getattr

__all__ = ["find_culprits", "Culprit"]

__getattr__ = lazy_getattr(__name__, {"find_culprits": "culprit", "Culprit": "culprit"})
