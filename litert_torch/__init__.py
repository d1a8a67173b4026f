"""litert_torch: the public, drop-in API (litert-torch 0.10 style) over tpu-export's edge backend.

    model = litert_torch.convert(module, sample_args)
    model(*sample_args); model.export("m.tflite"); litert_torch.load("m.tflite")
    litert_torch.signature("a", m1, args1).signature("b", m2, args2).convert()

It installs as ``tpu_export.litert_torch``; the top-level name ``litert_torch`` is the separate drop-in
distribution tpu-export-litert-torch (``pip install ./dropin`` from a checkout), which aliases this package.
``__version__`` is tpu-export's. Importing this package warns (LitertTorchNameWarning) when Google's
litert-torch is installed beside the drop-in, since only one of them can answer ``import litert_torch``.
"""

from __future__ import annotations

from tpu_export.converter._version import __version__
from tpu_export.converter.lazy_exports import lazy_getattr

from ._dropin import LitertTorchNameWarning, warn_if_clashing

__all__ = ["convert", "signature", "Converter", "Model", "load", "to_channel_last_io", "ModelExportError",
           "ModelRunError", "SignatureNotFoundError", "QuantConfig", "QuantizationError", "TfliteFormatError",
           "LitertTorchNameWarning", "__version__", "config", "experimental_add_compilation_backend", "hlfb", "debug"]

_WHERE = {
    "convert": "_convert",
    "signature": "_convert",
    "Converter": "_convert",
    "Model": "_model",
    "load": "_model",
    "ModelExportError": "_model",
    "ModelRunError": "_model",
    "SignatureNotFoundError": "_model",
    "to_channel_last_io": "_channel_last",
    "config": "_config",
    "experimental_add_compilation_backend": "_options",
}
_from_submodule = lazy_getattr(__name__, _WHERE)


def __getattr__(name):
    if name in _WHERE:
        return _from_submodule(name)
    # quantization and the .tflite check live in the edge backend; re-exported here
    if name in ("QuantConfig", "QuantizationError"):
        from tpu_export.edge import quantize

        return getattr(quantize, name)
    if name == "TfliteFormatError":
        from tpu_export.edge.tflite_check import TfliteFormatError

        return TfliteFormatError
    if name == "hlfb":
        import importlib

        return importlib.import_module(".hlfb", __name__)
    if name == "debug":
        import importlib

        return importlib.import_module(".debug", __name__)
    if name == "quantize":  # litert-torch 0.10's PT2E quantization (litert_torch.quantize.pt2e_quantizer)
        import importlib

        return importlib.import_module(".quantize", __name__)
    from ._refused import refuse

    refuse(__name__, name)  # litert-torch 0.10 names not provided: NotImplementedError with the alternative
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


warn_if_clashing()
