"""tpu_export.explore: our artifacts in Model Explorer, with overlays, and the layer-by-layer compare.

    import tpu_export.explore
    tpu_export.explore("out/android/android.tflite", overlays=["runs_on.gpu"])   # Model Explorer on localhost
    tpu_export.explore("out/tpu-v6e/model.tpuexp", png="view.png")               # a screenshot (headless Chromium)
    result = tpu_export.explore.compare(model, "out/android/android.tflite", (x,))
    print(result.table()); result.first_divergence
    mixed, report = tpu_export.explore.mixed_precision(model, "out/cpu/cpu.tflite", (x,), max_rel_err=1e-2)

``explore`` needs the ``explore`` extra (``pip install 'tpu-export[explore]'``: Model Explorer, which runs offline
here); ``compare``, ``write_overlays`` and ``mixed_precision`` do not. The package itself is callable:
``tpu_export.explore(...)`` is ``tpu_export.explore.explore(...)``.

The public names are this package's ``__all__``; its submodules are internal and may change between releases.
"""

from __future__ import annotations

import sys
import types

from tpu_export.converter.lazy_exports import lazy_getattr

__all__ = ["explore", "compare", "write_overlays", "numeric_overlay", "overlay_path", "CompareResult", "LayerRow",
           "ExploreError", "OVERLAYS", "mixed_precision", "MixedPrecisionReport"]

_WHERE = {"explore": "app", "ExploreError": "app", "compare": "layerwise", "CompareResult": "layerwise",
          "LayerRow": "layerwise", "write_overlays": "overlays", "numeric_overlay": "overlays",
          "overlay_path": "overlays", "OVERLAYS": "overlays", "mixed_precision": "mixed",
          "MixedPrecisionReport": "mixed"}

__getattr__ = lazy_getattr(__name__, _WHERE)


class _CallablePackage(types.ModuleType):
    # `tpu_export.explore` names both this package and its main function: importing the package binds the name to
    # the module, so the module answers the call.
    def __call__(self, *args, **kwargs):
        return self.explore(*args, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage
