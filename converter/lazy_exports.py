"""The lazy facade every package of the project uses: names resolve to their module on first use.

Public packages stay cheap to import (no torch.export, jax or LiteRT until a name is touched);
``module.__getattr__ = lazy_getattr(__name__, {"name": "submodule", ...})`` does it in one line.
"""

from __future__ import annotations

import importlib
from typing import Callable

__all__ = ["lazy_getattr"]


def lazy_getattr(package: str, where: dict[str, str]) -> Callable[[str], object]:
    """A module-level ``__getattr__`` that imports ``package.where[name]`` when ``name`` is first read."""

    def __getattr__(name: str):
        if name in where:
            return getattr(importlib.import_module(f".{where[name]}", package), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
