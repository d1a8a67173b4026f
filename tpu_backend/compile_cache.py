"""A persistent cache of AOT-compiled TPU executables, so a repeated conversion of the same program
for the same slice skips libtpu's compile (minutes for a real-size CNN on a small host).

jax's own persistent compilation cache does not serve here: it writes entries for compile-only TPU
devices but cannot read them back ("PjRtCompiler must be constructed with a Client to call
DeserializeLoadedExecutable", jax 0.10.2 / libtpu 0.0.42). Nothing is loaded from this cache
either: an entry is the serialized executable's bytes, which go into the artifact as a fresh
compile's would, and XLA's figures (cost, memory) as JSON.

The key is a SHA-256 of everything the executable depends on: the lowered module's text (the
program, shapes, dtypes, shardings, donation), the devices it was placed on (slice name, device ids,
kind), the jax/jaxlib/libtpu versions and the compiler's environment (``XLA_FLAGS``,
``LIBTPU_INIT_ARGS``). It is on by default, in the user's cache folder (``$XDG_CACHE_HOME/tpu-export/aot``,
else ``~/.cache/tpu-export/aot``); ``cache_dir=`` on ``compile_for`` or the ``TPU_EXPORT_AOT_CACHE`` environment
variable names another folder, and ``cache_dir=False`` or the value ``none`` turns it off. Entries are written
atomically (converter.atomic), so concurrent conversions share a folder safely; deleting the folder is safe.
"""

from __future__ import annotations

import hashlib
import json
import os

from tpu_export.converter.atomic import write_file

from .artifact.versions import runtime_versions

__all__ = ["cache_folder", "default_folder", "cache_key", "read", "write", "ENV", "OFF"]

ENV = "TPU_EXPORT_AOT_CACHE"
OFF = "none"  # as cache_dir, --cache-dir or $TPU_EXPORT_AOT_CACHE: no cache
_FORMAT = 1


def default_folder() -> str:
    """The user's cache folder for executables: $XDG_CACHE_HOME/tpu-export/aot, else ~/.cache/tpu-export/aot."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "tpu-export", "aot")


def cache_folder(cache_dir=None) -> str | None:
    """The folder to use: ``cache_dir`` (False or "none": no cache), else $TPU_EXPORT_AOT_CACHE (``none``: no
    cache), else ``default_folder()``."""
    if cache_dir is False:
        return None
    folder = cache_dir if cache_dir is not None else os.environ.get(ENV) or default_folder()
    folder = os.fspath(folder)
    return None if folder.lower() == OFF else folder


def cache_key(module_text: str, devices, libtpu_topology) -> str:
    h = hashlib.sha256()
    ctx = {
        "format": _FORMAT,
        "topology": libtpu_topology,
        "devices": [(d.id, d.device_kind, d.platform) for d in devices],
        "versions": {k: v for k, v in runtime_versions().items() if k != "tpu_export"},
        "env": {k: os.environ.get(k) for k in ("XLA_FLAGS", "LIBTPU_INIT_ARGS")},
    }
    h.update(json.dumps(ctx, sort_keys=True).encode())
    h.update(module_text.encode())
    return h.hexdigest()


def _paths(folder: str, key: str) -> tuple[str, str]:
    base = os.path.join(folder, key[:2], key)
    return base + ".exe", base + ".json"


def read(folder: str, key: str):
    """(executable bytes, figures dict) of a complete entry, else None."""
    exe, meta = _paths(folder, key)
    try:
        with open(meta, encoding="utf-8") as f:
            figures = json.load(f)
        with open(exe, "rb") as f:
            raw = f.read()
    except (OSError, ValueError):
        return None
    if figures.get("executable_bytes") != len(raw):  # a torn or foreign entry: compile afresh
        return None
    return raw, figures


def write(folder: str, key: str, raw: bytes, figures: dict) -> None:
    """Store an entry: the executable first, then its figures (a reader needs both and checks the size)."""
    exe, meta = _paths(folder, key)
    os.makedirs(os.path.dirname(exe), exist_ok=True)
    write_file(exe, raw)
    write_file(meta, json.dumps(figures, sort_keys=True).encode())
