"""litert_torch: tpu-export's litert-torch-style API under its top-level name (distribution tpu-export-litert-torch).

``litert_torch`` and every ``litert_torch.X`` are the very module objects of ``tpu_export.litert_torch`` and
``tpu_export.litert_torch.X``: one copy of each module under two names, so isinstance checks, module state
and monkeypatches agree whichever name the code used.

This is one module file, never a package directory, so none of its files is one of Google's litert-torch
distribution (``litert_torch/``), in either order of installation. Where both are installed, Python imports
Google's directory and this file is not reached; tpu_export.litert_torch and ``tpu-export doctor`` say so.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys

import tpu_export.litert_torch as _facade

__all__ = list(_facade.__all__)

_ALIAS = __name__ + "."
_REAL = _facade.__name__ + "."


class _SameModule(importlib.abc.Loader):
    """Loads ``litert_torch.X`` as the module ``tpu_export.litert_torch.X``, imported under its own name."""

    def __init__(self, module):
        self._module = module
        self._spec = module.__spec__

    def create_module(self, spec):
        return self._module

    def exec_module(self, module):
        # the import system set the alias's spec on the module; it keeps its own (reload, pickle, pkgutil)
        module.__spec__ = self._spec


class _AliasFinder(importlib.abc.MetaPathFinder):
    """Answers ``litert_torch.X`` with ``tpu_export.litert_torch.X`` (a name it lacks: the usual error)."""

    def find_spec(self, fullname, path=None, target=None):
        if not fullname.startswith(_ALIAS) or sys.modules.get(__name__) is not _facade:
            return None
        real = _REAL + fullname[len(_ALIAS):]
        if importlib.util.find_spec(real) is None:
            return None
        module = importlib.import_module(real)
        return importlib.util.spec_from_loader(fullname, _SameModule(module), is_package=hasattr(module, "__path__"))


if not any(isinstance(f, _AliasFinder) for f in sys.meta_path):
    sys.meta_path.insert(0, _AliasFinder())  # before the path finder, which would load a second copy
sys.modules[__name__] = _facade  # `import litert_torch` returns what sys.modules holds once this file has run
