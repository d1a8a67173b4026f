"""tpu_export: the application on top of the layers (the tpu-export CLI, the demo, the multi-target convert,
the op-support table).

    import tpu_export
    written = tpu_export.convert(model, sample_args, targets=["tpu-v6e", "android"], out_dir="out")
    tpu_export.convert_lm("my_llama", ["android", "tpu-v6e"], "out_lm")      # a model directory
    tpu_export.load_generator("out_lm/tpu-v6e").generate("Hello", 32).text
    tpu_export.explore("out/android/android.tflite")                         # Model Explorer on localhost
    tpu_export.serve.run(["out/tpu-v6e/model.tpuexp"], port=8000)            # KServe v2 / OpenAI over HTTP

Imports point one way: converter <- edge, tpu_backend <- targets <- tpu_export. Heavy modules load on
first use.
"""

from __future__ import annotations

from tpu_export.converter._version import __version__
from tpu_export.converter.lazy_exports import lazy_getattr

__all__ = ["convert", "convert_lm", "load_generator", "explore", "serve", "main", "__version__"]

_WHERE = {"convert": "multi_target", "convert_lm": "targets.lm", "load_generator": "generators", "main": "cli"}

_from_submodule = lazy_getattr(__name__, _WHERE)


def __getattr__(name):
    # the two subpackages load on first use; importing one binds it here, so this runs once per name
    if name == "explore":
        import tpu_export.explore
    elif name == "serve":
        import tpu_export.serve  # noqa: F401 - binds tpu_export.serve (read back below)
    else:
        return _from_submodule(name)
    return globals()[name]
