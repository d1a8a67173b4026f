"""tpu_export: the application on top of the layers (the tpu-export CLI, the demo, the multi-target convert,
the op-support table).

    import tpu_export
    written = tpu_export.convert(model, sample_args, targets=["tpu-v6e", "android"], out_dir="out")
    tpu_export.convert_lm("my_llama", ["android", "tpu-v6e"], "out_lm")      # a model directory
    tpu_export.load_generator("out_lm/tpu-v6e").generate("Hello", 32).text

Imports point one way: converter <- edge, tpu_backend <- targets <- tpu_export. Heavy modules load on
first use.
"""

from __future__ import annotations

from tpu_export.converter._version import __version__
from tpu_export.converter.lazy_exports import lazy_getattr

__all__ = ["convert", "convert_lm", "load_generator", "main", "__version__"]

_WHERE = {"convert": "multi_target", "convert_lm": "targets.lm", "load_generator": "generators", "main": "cli"}

__getattr__ = lazy_getattr(__name__, _WHERE)
