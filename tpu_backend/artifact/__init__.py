"""The TPU artifact: a versioned, self-describing directory (or the same files in one zip).

Layout::

    model.tpuexp/
      manifest.json                       format version, signatures, shardings, versions, hashes
      weights.safetensors                 every weight once (safetensors; memory-mapped on load)
      signatures/<name>.jaxexport         jax.export serialization (StableHLO) per signature
      compiled/<target>-<topology>/       optional AOT-compiled TPU executables
          <signature>.bin                 raw PJRT executable bytes
          report.json                     cost and memory analysis, per chip and whole program

The public names are this package's ``__all__``; its submodules are internal and may change between releases.
"""

from __future__ import annotations

from tpu_export.converter.lazy_exports import lazy_getattr

__all__ = [
    "save", "read_artifact", "TpuArtifact", "FORMAT_VERSION", "MIN_READABLE_VERSION",
    "ArtifactError", "ArtifactVersionError", "ArtifactCorruptError", "ManifestError",
    "CompiledTarget", "CompiledSignature", "ArtifactTensorSpec",
]

_WHERE = {
    "save": "store", "read_artifact": "load", "TpuArtifact": "load",
    "FORMAT_VERSION": "format", "MIN_READABLE_VERSION": "format",
    "ArtifactError": "errors", "ArtifactVersionError": "errors", "ArtifactCorruptError": "errors",
    "ManifestError": "errors", "CompiledTarget": "compiled", "CompiledSignature": "compiled",
    "ArtifactTensorSpec": "specs",
}


__getattr__ = lazy_getattr(__name__, _WHERE)
