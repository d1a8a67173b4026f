"""Data records of an AOT compile, as the artifact stores them (no jax objects inside)."""

from __future__ import annotations

import dataclasses

__all__ = ["CompiledSignature", "CompiledTarget"]


@dataclasses.dataclass
class CompiledSignature:
    executable: bytes | None  # raw PJRT executable bytes (Executable.serialize(); no pickle); None when
    # read from an artifact without load_executables (executables are code: read only on request)
    input_shapes: list[list[list[int]]]  # concrete shapes it was compiled for: [weights, inputs]
    compile_seconds: float


@dataclasses.dataclass
class CompiledTarget:
    target: str  # "tpu-v6e"
    topology: str  # "2x2"
    platform: str  # "tpu"
    device_kind: str  # "TPU v6 lite"
    num_devices: int  # devices the executables run on
    versions: dict  # {"jax", "jaxlib", "libtpu"}
    signatures: dict[str, CompiledSignature]
    report: dict  # report.json content

    @property
    def key(self) -> str:
        return f"{self.target}-{self.topology}"
