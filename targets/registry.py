"""Named deployment targets: where an artifact will run, which backend makes it, with what defaults.

A target is data plus checks; it never lowers anything itself. What differs between targets is a hook
of the target's class, never a test of its name: ``options_type`` (the options it takes, see
targets/options.py), ``quant_scheme`` (which quantization its runtime runs), ``check_io`` (what its
runtime's tensors can hold) and ``finish`` / ``package_files`` (which files its package holds).
``checks`` name what a conversion for the target verifies (see targets/checks.py); ``packaging`` says
which files the package holds.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from .options import EdgeOptions, IotOptions, TpuOptions, XlaOptions

__all__ = ["Target", "XlaTarget", "EdgeTarget", "WebTarget", "IotTarget", "TARGETS", "get_target",
           "UnknownTargetError"]


class UnknownTargetError(ValueError):
    pass


@dataclasses.dataclass(frozen=True)
class Target:
    name: str
    summary: str
    checks: tuple = ()  # what a conversion for this target verifies
    packaging: str = ""  # the files the target's package holds
    backend: ClassVar[str] = ""  # "tpu" (StableHLO via JAX) or "edge" (LiteRT flatbuffer)

    @property
    def options_type(self) -> type:
        raise NotImplementedError


@dataclasses.dataclass(frozen=True)
class XlaTarget(Target):
    """A StableHLO artifact run through PJRT; with a ``chip``, a TPU generation AOT-compiled for a topology."""

    platforms: tuple = ()  # jax.export platforms
    chip: str | None = None  # libtpu generation name; chip facts: tpu_backend.chips.CHIPS[target.name]
    default_topology: str | None = None
    backend: ClassVar[str] = "tpu"

    @property
    def options_type(self) -> type:
        return TpuOptions if self.chip is not None else XlaOptions


@dataclasses.dataclass(frozen=True)
class EdgeTarget(Target):
    """A LiteRT .tflite run by the LiteRT interpreter (every scheme of edge/quantize.py runs there)."""

    channel_last_io: bool = False  # NHWC image inputs/outputs by default (litert_torch.to_channel_last_io semantics)
    delegates: tuple = ()  # accelerator tables in targets.compat, first = the one reported by default
    backend: ClassVar[str] = "edge"

    @property
    def options_type(self) -> type:
        return EdgeOptions

    def quant_scheme(self, quant_config):
        """The QuantConfig this target's runtime runs for ``quant_config`` (None: a float model); a scheme it
        cannot run raises QuantizationError."""
        from tpu_export.edge.quantize import as_quant_config

        return as_quant_config(quant_config)

    def check_io(self, tflite: bytes) -> None:
        """Refuse a model whose inputs/outputs the target's runtime cannot hold."""

    def finish(self, tflite: bytes, job) -> dict:
        """Float .tflite -> the package's files in ``job.out_dir`` ({file name: path}): quantized, checked."""
        from .checks import check_for_target
        from .files import write_files

        if job.quant is not None:
            from tpu_export.edge.quantize import quantize_tflite

            tflite = quantize_tflite(tflite, job.quant, job.feeds)
        check_for_target(tflite, self, strict=job.options.strict_ops, say=job.say)
        return write_files(job.out_dir, self.package_files(tflite, job.name))

    def package_files(self, tflite: bytes, name: str) -> dict:
        return {f"{name}.tflite": tflite}


@dataclasses.dataclass(frozen=True)
class WebTarget(EdgeTarget):
    """LiteRT.js in the browser: its tensors hold float32, int32 and uint8 only; the package adds an ES module."""

    def quant_scheme(self, quant_config):
        from .quantize import web_scheme

        return web_scheme(super().quant_scheme(quant_config))

    def check_io(self, tflite: bytes) -> None:
        from .web import check_web_io

        check_web_io(tflite)

    def package_files(self, tflite: bytes, name: str) -> dict:
        from .web import web_package_files

        return web_package_files(tflite, name)


@dataclasses.dataclass(frozen=True)
class IotTarget(EdgeTarget):
    """TFLite Micro: full-integer int8 only, verified in its interpreter, packaged as C with a flash/RAM budget."""

    @property
    def options_type(self) -> type:
        return IotOptions

    def quant_scheme(self, quant_config):
        from .quantize import iot_scheme

        return iot_scheme(quant_config)

    def finish(self, tflite: bytes, job) -> dict:
        from .iot import package_iot

        return package_iot(tflite, job)


_TPU_CHECKS = ("op support (tpu backend)", "topology valid for the chip", "AOT compile and HBM fit (with topology)")
_TPU_PACKAGE = "tpu artifact (manifest + StableHLO + weights [+ AOT executables])"

_T = [
    XlaTarget("tpu-v5e", "Cloud TPU v5e: StableHLO + AOT executable", _TPU_CHECKS, _TPU_PACKAGE, ("tpu", "cpu"),
              "v5e", "2x2"),
    XlaTarget("tpu-v6e", "Cloud TPU v6e (Trillium): StableHLO + AOT executable", _TPU_CHECKS, _TPU_PACKAGE,
              ("tpu", "cpu"), "v6e", "2x2"),
    XlaTarget("tpu-v5p", "Cloud TPU v5p: StableHLO + AOT executable", _TPU_CHECKS, _TPU_PACKAGE, ("tpu", "cpu"),
              "v5p", "2x2x1"),
    XlaTarget("tpu-v7x", "Cloud TPU v7x (Ironwood, libtpu 'tpu7x'): StableHLO + AOT executable", _TPU_CHECKS,
              _TPU_PACKAGE, ("tpu", "cpu"), "tpu7x", "2x2x1"),
    XlaTarget("cuda", "StableHLO artifact for NVIDIA GPUs through PJRT (jax cuda)", ("op support (tpu backend)",),
              _TPU_PACKAGE, ("cuda", "cpu")),
    XlaTarget("cpu-xla", "StableHLO artifact for CPUs through PJRT (XLA:CPU)", ("op support (tpu backend)",),
              _TPU_PACKAGE, ("cpu",)),
    # Image models take and give NHWC at the boundary on mobile and microcontrollers (channel_last_io=True),
    # as camera frames and GPU delegates expect; overridable per conversion.
    EdgeTarget("android", "LiteRT .tflite for Android (CPU/XNNPACK, GPU delegate)",
               ("op support (edge backend)", "GPU delegate compatibility"), "<name>.tflite",
               channel_last_io=True, delegates=("gpu",)),
    EdgeTarget("ios", "LiteRT .tflite for iOS (CPU, Core ML / Metal delegates)",
               ("op support (edge backend)", "Core ML delegate compatibility", "Metal delegate compatibility"),
               "<name>.tflite", channel_last_io=True, delegates=("coreml", "metal")),
    WebTarget("web", "LiteRT .tflite for the browser (LiteRT.js, wasm/XNNPACK)",
              ("op support (edge backend)", "LiteRT.js I/O dtypes (float32, int32, uint8)"),
              "<name>.tflite + <name>.js (ES module: load and run with LiteRT.js)", delegates=("cpu",)),
    IotTarget("iot", "LiteRT .tflite for microcontrollers (TFLite Micro, full-integer int8)",
              ("op support (edge backend)", "calibration data present", "full-integer int8", "TFLite Micro ops",
               "run in TFLite Micro vs float", "flash/RAM budget"),
              "<name>.tflite + <name>_model.c/.h (aligned array, arena size)", channel_last_io=True,
              delegates=("tflm",)),
    EdgeTarget("cpu", "LiteRT .tflite for desktop/server CPUs (XNNPACK)", ("op support (edge backend)",),
               "<name>.tflite", delegates=("cpu",)),
]
TARGETS: dict[str, Target] = {t.name: t for t in _T}


def get_target(name) -> Target:
    if isinstance(name, Target):
        return name
    try:
        return TARGETS[name]
    except (KeyError, TypeError):
        raise UnknownTargetError(f"unknown target {name!r}; known targets: {', '.join(TARGETS)}") from None
