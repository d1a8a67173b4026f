"""The release version, written once: pyproject.toml reads it (setuptools' dynamic version) and
tpu_export.__version__ and tpu_export.litert_torch.__version__ re-export it. It lives in the lowest layer
so that every layer may read it."""

__all__ = ["__version__"]

__version__ = "0.3.0"
