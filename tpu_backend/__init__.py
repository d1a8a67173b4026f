"""tpu_backend: Program -> JAX/StableHLO -> versioned TPU artifact -> PJRT runtime.

    bundle = tpu_backend.export_program(prog)                  # jax.export per signature
    bundle.compile_for("tpu-v6e", "2x2")                        # optional AOT compile + report
    tpu_backend.save(bundle, "model.tpuexp")                    # or "model.tpuexp.zip"
    out = tpu_backend.load("model.tpuexp")(x)                   # runs on TPU, GPU or CPU

Heavy modules (jax, libtpu) load on first use; importing this package changes no settings.

The public names are this package's ``__all__``; its submodules are internal and may change between releases.
"""

from __future__ import annotations

from tpu_export.converter.lazy_exports import lazy_getattr

__all__ = [
    "export_program", "export_lowered", "ExportedBundle", "ExportError", "PLATFORMS",
    "save", "load", "read_artifact", "TpuArtifact", "TpuProgram",
    "compile_for", "compile_many", "compile_on_devices", "AotError", "HbmOverflowError", "InvalidTopologyError",
    "CHIPS", "TARGETS", "chip_for_target", "parse_topology",
    "MeshSpec", "PartitionRules", "ShardingError",
    "FORMAT_VERSION", "MIN_READABLE_VERSION", "ArtifactError", "ArtifactVersionError",
    "ArtifactCorruptError", "ManifestError", "lower_signature",
]

_WHERE = {
    "export_program": "export", "export_lowered": "export", "ExportedBundle": "export", "ExportError": "export",
    "PLATFORMS": "export",
    "save": "artifact.store", "read_artifact": "artifact.load", "TpuArtifact": "artifact.load",
    "load": "runtime", "TpuProgram": "runtime",
    "compile_for": "aot", "compile_many": "aot", "compile_on_devices": "aot", "AotError": "aot",
    "HbmOverflowError": "aot",
    "InvalidTopologyError": "chips", "CHIPS": "chips", "TARGETS": "chips", "chip_for_target": "chips",
    "parse_topology": "chips",
    "MeshSpec": "sharding", "PartitionRules": "sharding", "ShardingError": "sharding",
    "FORMAT_VERSION": "artifact.format", "MIN_READABLE_VERSION": "artifact.format",
    "ArtifactError": "artifact.errors", "ArtifactVersionError": "artifact.errors",
    "ArtifactCorruptError": "artifact.errors", "ManifestError": "artifact.errors",
    "lower_signature": "lowering",
}


__getattr__ = lazy_getattr(__name__, _WHERE)
