"""The LiteRT Metal (GPU) delegate on iOS: the same op checks as the Android GPU delegate.

Source: tensorflow/tensorflow, tensorflow/lite/delegates/gpu/metal_delegate.mm, whose ``DelegatePrepare``
asks ``GetOpsToReplace`` (tensorflow/lite/delegates/gpu/common/model_builder.cc) for the nodes to take;
that function decides with ``CheckGpuDelegateCompatibility`` (gpu_compatibility.cc), the table in
android_gpu.py. The Metal and OpenCL backends then build the same GPU graph from those nodes.
"""

from __future__ import annotations

from .android_gpu import GPU_OPS

__all__ = ["METAL_OPS", "SOURCE"]

SOURCE = ("tensorflow/lite/delegates/gpu/metal_delegate.mm -> common/model_builder.cc GetOpsToReplace -> "
          "tensorflow/lite/tools/versioning/gpu_compatibility.cc")

METAL_OPS = GPU_OPS
