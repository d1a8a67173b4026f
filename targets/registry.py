"""Named deployment targets: where an artifact will run, which backend makes it, with what defaults.

A target is data plus checks; it never lowers anything itself.
"""

from __future__ import annotations

import dataclasses

__all__ = ["Target", "TARGETS", "get_target", "UnknownTargetError"]


class UnknownTargetError(ValueError):
    pass


@dataclasses.dataclass(frozen=True)
class Target:
    name: str
    backend: str  # "tpu" (StableHLO via JAX) or "edge" (LiteRT flatbuffer)
    summary: str
    platforms: tuple = ()  # jax.export platforms for the tpu backend
    chip: str | None = None  # key into tpu_backend.chips for AOT compiles
    default_topology: str | None = None
    options: dict = dataclasses.field(default_factory=dict)  # backend defaults


_T = [
    Target("tpu-v5e", "tpu", "Cloud TPU v5e: StableHLO + AOT executable", ("tpu", "cpu"), "v5e", "2x2"),
    Target("tpu-v6e", "tpu", "Cloud TPU v6e (Trillium): StableHLO + AOT executable", ("tpu", "cpu"), "v6e", "2x2"),
    Target("tpu-v5p", "tpu", "Cloud TPU v5p: StableHLO + AOT executable", ("tpu", "cpu"), "v5p", "2x2x1"),
    Target("tpu-v7x", "tpu", "Cloud TPU v7x (Ironwood, libtpu 'tpu7x'): StableHLO + AOT executable",
           ("tpu", "cpu"), "tpu7x", "2x2x1"),
    Target("cuda", "tpu", "StableHLO artifact for NVIDIA GPUs through PJRT (jax cuda)", ("cuda", "cpu")),
    Target("cpu-xla", "tpu", "StableHLO artifact for CPUs through PJRT (XLA:CPU)", ("cpu",)),
    Target("android", "edge", "LiteRT .tflite for Android (CPU/XNNPACK, GPU delegate)"),
    Target("ios", "edge", "LiteRT .tflite for iOS (CPU, Core ML / Metal delegates)"),
    Target("web", "edge", "LiteRT .tflite for the browser (LiteRT.js, wasm/XNNPACK)"),
    Target("iot", "edge", "LiteRT .tflite for microcontrollers (TFLite Micro, full-integer int8)"),
    Target("cpu", "edge", "LiteRT .tflite for desktop/server CPUs (XNNPACK)"),
]
TARGETS: dict[str, Target] = {t.name: t for t in _T}


def get_target(name: str) -> Target:
    try:
        return TARGETS[name]
    except KeyError:
        raise UnknownTargetError(f"unknown target {name!r}; known targets: {', '.join(TARGETS)}") from None
