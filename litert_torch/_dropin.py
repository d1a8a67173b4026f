"""Who provides the top-level name ``litert_torch``, and the warning when two installed distributions do.

tpu-export installs this facade as ``tpu_export.litert_torch`` only. The top-level ``import litert_torch``
comes from one of two distributions, which share no file: tpu-export-litert-torch (tpu-export's drop-in, a
single module ``litert_torch.py`` that aliases this package) and Google's litert-torch (a package directory
``litert_torch/``, which the import system prefers over a module of the same name in the same folder). With
both installed, one of them is silently unreachable under that name: this module names both and how to choose.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import warnings

__all__ = ["DROPIN", "GOOGLE", "LitertTorchNameWarning", "clash_message", "resolution", "warn_if_clashing"]

DROPIN = "tpu-export-litert-torch"
GOOGLE = "litert-torch"
_FACADE = __name__.rpartition(".")[0]  # tpu_export.litert_torch
# the file each distribution provides the top-level name with
_ENTRY = {DROPIN: "litert_torch.py", GOOGLE: os.path.join("litert_torch", "__init__.py")}


class LitertTorchNameWarning(UserWarning):
    """Both tpu-export-litert-torch and Google's litert-torch are installed: ``import litert_torch`` gives one."""


def _installed(dist: str):
    """The installed distribution ``dist`` (importlib.metadata.Distribution), or None."""
    import importlib.metadata  # on demand: 25 ms, paid only when something provides the name

    try:
        return importlib.metadata.distribution(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _findable() -> bool:
    """Whether anything answers ``import litert_torch`` (without importing it)."""
    if "litert_torch" in sys.modules:
        return True
    try:
        return importlib.util.find_spec("litert_torch") is not None
    except (ImportError, ValueError):
        return True  # the finders disagree with themselves: let the full check say what is there


def _same_file(a: str, b: str) -> bool:
    return os.path.normcase(os.path.realpath(a)) == os.path.normcase(os.path.realpath(b))


def resolution() -> tuple[str | None, str | None]:
    """(the file ``import litert_torch`` loads, or None when nothing provides the name; the distribution that
    file belongs to: DROPIN, GOOGLE, or None for a copy neither installed, e.g. a checkout on sys.path).
    Nothing is imported: a module already imported under the name is looked at, else the import system's
    finders are asked where they would load it from."""
    loaded = sys.modules.get("litert_torch")
    dropin = _installed(DROPIN)
    if loaded is not None and loaded is sys.modules.get(_FACADE):  # the drop-in ran: the name is this package
        return (str(dropin.locate_file(_ENTRY[DROPIN])) if dropin else None), DROPIN
    try:
        spec = importlib.util.find_spec("litert_torch")
    except ValueError:  # a module under the name without a __spec__ (made by hand): it says nothing of its file
        return getattr(loaded, "__file__", None), None
    origin = spec.origin if spec is not None and spec.has_location else None
    if origin is None:
        return None, None
    for name, dist in ((DROPIN, dropin), (GOOGLE, _installed(GOOGLE))):
        if dist is not None and _same_file(origin, str(dist.locate_file(_ENTRY[name]))):
            return origin, name
    return origin, None


def clash_message() -> str | None:
    """One line naming both distributions, which one ``import litert_torch`` loads and how to choose; None
    unless both are installed."""
    if not _findable():  # neither distribution is installed where this interpreter looks
        return None
    google, dropin = _installed(GOOGLE), _installed(DROPIN)
    if google is None or dropin is None:
        return None
    path, owner = resolution()
    loads = {GOOGLE: f"Google's {GOOGLE}", DROPIN: f"tpu-export's {DROPIN}"}.get(owner, "neither of them")
    return (f"two installed distributions provide `import litert_torch`: {GOOGLE} {google.version} (Google's) and "
            f"{DROPIN} {dropin.version} (tpu-export's drop-in); it loads {loads} ({path}). To choose: "
            f"`pip uninstall {GOOGLE}` for tpu-export's, `pip uninstall {DROPIN}` for Google's, or write "
            f"`import tpu_export.litert_torch as litert_torch`, which is always tpu-export's")


_warned = False


def warn_if_clashing() -> None:
    """Warn (LitertTorchNameWarning) when both distributions are installed: once a process, at the facade's
    import (tpu-export's CLI prints it as its one-line warning)."""
    global _warned
    if _warned:
        return
    _warned = True
    message = clash_message()
    if message is not None:
        warnings.warn(message, LitertTorchNameWarning, stacklevel=3)
