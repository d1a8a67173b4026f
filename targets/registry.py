"""Named deployment targets: where an artifact will run, which backend makes it, with what defaults.

A target is data plus checks; it never lowers anything itself. ``options`` are the backend defaults
(layout, dtypes, quantization); ``checks`` name what a conversion for the target verifies (see
targets/checks.py); ``packaging`` says which files the target's package holds.
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
    chip: str | None = None  # libtpu generation name; chip facts: tpu_backend.chips.CHIPS[target.name]
    default_topology: str | None = None
    options: dict = dataclasses.field(default_factory=dict)  # backend defaults
    delegates: tuple = ()  # edge: accelerator tables in targets.compat, first = the one reported by default
    checks: tuple = ()  # what a conversion for this target verifies
    packaging: str = ""  # the files the target's package holds


_TPU_CHECKS = ("op support (tpu backend)", "topology valid for the chip", "AOT compile and HBM fit (with topology)")
_TPU_PACKAGE = "tpu artifact (manifest + StableHLO + weights [+ AOT executables])"
# Image models take and give NHWC at the boundary on mobile (to_channel_last_io semantics), overridable.
_MOBILE = {"channel_last_io": True, "fp16_weights": False}

_T = [
    Target("tpu-v5e", "tpu", "Cloud TPU v5e: StableHLO + AOT executable", ("tpu", "cpu"), "v5e", "2x2",
           checks=_TPU_CHECKS, packaging=_TPU_PACKAGE),
    Target("tpu-v6e", "tpu", "Cloud TPU v6e (Trillium): StableHLO + AOT executable", ("tpu", "cpu"), "v6e", "2x2",
           checks=_TPU_CHECKS, packaging=_TPU_PACKAGE),
    Target("tpu-v5p", "tpu", "Cloud TPU v5p: StableHLO + AOT executable", ("tpu", "cpu"), "v5p", "2x2x1",
           checks=_TPU_CHECKS, packaging=_TPU_PACKAGE),
    Target("tpu-v7x", "tpu", "Cloud TPU v7x (Ironwood, libtpu 'tpu7x'): StableHLO + AOT executable",
           ("tpu", "cpu"), "tpu7x", "2x2x1", checks=_TPU_CHECKS, packaging=_TPU_PACKAGE),
    Target("cuda", "tpu", "StableHLO artifact for NVIDIA GPUs through PJRT (jax cuda)", ("cuda", "cpu"),
           checks=("op support (tpu backend)",), packaging=_TPU_PACKAGE),
    Target("cpu-xla", "tpu", "StableHLO artifact for CPUs through PJRT (XLA:CPU)", ("cpu",),
           checks=("op support (tpu backend)",), packaging=_TPU_PACKAGE),
    Target("android", "edge", "LiteRT .tflite for Android (CPU/XNNPACK, GPU delegate)", options=dict(_MOBILE),
           delegates=("gpu",), checks=("op support (edge backend)", "GPU delegate compatibility"),
           packaging="<name>.tflite"),
    Target("ios", "edge", "LiteRT .tflite for iOS (CPU, Core ML / Metal delegates)", options=dict(_MOBILE),
           delegates=("coreml", "metal"),
           checks=("op support (edge backend)", "Core ML delegate compatibility", "Metal delegate compatibility"),
           packaging="<name>.tflite"),
    Target("web", "edge", "LiteRT .tflite for the browser (LiteRT.js, wasm/XNNPACK)",
           options={"channel_last_io": False}, delegates=("cpu",),
           checks=("op support (edge backend)", "LiteRT.js I/O dtypes (float32, int32, uint8)"),
           packaging="<name>.tflite + <name>.js (ES module: load and run with LiteRT.js)"),
    Target("iot", "edge", "LiteRT .tflite for microcontrollers (TFLite Micro, full-integer int8)",
           options={"channel_last_io": True, "quantization": "int8", "calibration_data": None,
                    "flash_kib": None, "ram_kib": None},
           delegates=("tflm",),
           checks=("op support (edge backend)", "calibration data present", "full-integer int8",
                   "TFLite Micro ops", "run in TFLite Micro vs float", "flash/RAM budget"),
           packaging="<name>.tflite + <name>_model.c/.h (aligned array, arena size)"),
    Target("cpu", "edge", "LiteRT .tflite for desktop/server CPUs (XNNPACK)", options={"channel_last_io": False},
           delegates=("cpu",), checks=("op support (edge backend)",), packaging="<name>.tflite"),
]
TARGETS: dict[str, Target] = {t.name: t for t in _T}


def get_target(name) -> Target:
    if isinstance(name, Target):
        return name
    try:
        return TARGETS[name]
    except (KeyError, TypeError):
        raise UnknownTargetError(f"unknown target {name!r}; known targets: {', '.join(TARGETS)}") from None
