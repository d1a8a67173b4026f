"""Typed options of each target, checked once before capture.

    opts = options_for("iot", {"calibration_data": cal, "ram_kib": 256})   # IotOptions, checked
    opts = options_for("tpu-v6e", {"topology": "2x2"})                       # TpuOptions, checked

Every target's options are one frozen dataclass (its ``options_type``): an unknown name, a value of
the wrong type, a scheme the target's runtime cannot run, static int8 without calibration data or a
topology the chip does not come in fails here, before anything is captured or written. Each option
has one name; the old spellings are refused with the new one named.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

__all__ = ["EdgeOptions", "IotOptions", "XlaOptions", "TpuOptions", "OptionsError", "options_for", "split_shared",
           "OLD_NAMES"]


class OptionsError(TypeError):
    """An option a target does not take, or a value of the wrong type; the message names both."""


# Old spellings of an option -> the fix. "channel_last_io" is a bool, as our target defaults are;
# litert_torch.to_channel_last_io stays a function that wraps a module (litert-torch's API).
OLD_NAMES = {
    "to_channel_last_io": "channel_last_io",
    "channel_last": "channel_last_io",
    "fp16_weights": "quant_config='fp16'",
}


def _bool_or_none(v) -> bool:
    return v is None or isinstance(v, bool)


def _kib(v) -> bool:
    return v is None or (isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0)


def _samples(v) -> bool:  # a list of samples (tuples of args or {input name: array}) or {signature: [...]}
    return v is None or isinstance(v, Mapping) or (hasattr(v, "__iter__") and not isinstance(v, (str, bytes)))


def _name(v) -> bool:
    return v is None or (isinstance(v, str) and v not in ("", ".", "..") and "/" not in v and "\\" not in v)


def _use_pallas(v) -> bool:
    if isinstance(v, str):
        return v == "auto"
    return v is None or isinstance(v, bool) or type(v).__name__ == "PallasConfig"  # no jax import to check it


# field -> (accepts, what it takes); one table for every options class
_TYPES = {
    "channel_last_io": (_bool_or_none, "True or False (NHWC image inputs/outputs)"),
    "strict_ops": (lambda v: isinstance(v, bool), "True or False"),
    "quant_config": (lambda v: True, ""),  # checked against the target's runtime below
    "calibration_data": (_samples, "a list of samples (tuples of the module's args, or {input name: array})"),
    "name": (_name, "a file name stem without '/'"),
    "verify_inputs": (_samples, "a list of samples (tuples of the module's args, or {input name: array})"),
    "flash_kib": (_kib, "a positive number of KiB"),
    "ram_kib": (_kib, "a positive number of KiB"),
    "topology": (lambda v: v is None or isinstance(v, str), "a topology string such as '2x2'"),
    "use_pallas": (_use_pallas, "True, False, 'auto' or a PallasConfig"),
    "dtype": (lambda v: v is None or (isinstance(v, str) and v in ("float32", "fp32", "bfloat16", "bf16")),
              "'float32' or 'bfloat16'"),
    "precision": (lambda v: v is None or v in ("highest", "high", "default"), "'highest', 'high' or 'default'"),
    "mesh": (lambda v: True, ""),  # checked by tpu_backend.sharding.MeshSpec below
    "partition_rules": (lambda v: True, ""),
    "aot": (lambda v: isinstance(v, bool), "True or False"),
    "aot_in_process": (_bool_or_none, "True (compile in this process), False (in a child process) or None (auto)"),
    "slots": (lambda v: v is None or (isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= 1024),
              "an integer from 1 to 1024 (convert_lm: decode_slots over that many requests)"),
}


class _Options:
    def check(self, target) -> "_Options":
        """Types of every field, then what the target's runtime can run; returns self."""
        for f in dataclasses.fields(self):
            accepts, what = _TYPES[f.name]
            v = getattr(self, f.name)
            if not accepts(v):
                raise OptionsError(f"target {target.name!r}: option {f.name} must be {what}, got {v!r} "
                                   f"({type(v).__name__})")
        self._check_values(target)
        return self

    def _check_values(self, target) -> None:
        pass


@dataclasses.dataclass(frozen=True)
class EdgeOptions(_Options):
    """Options of a LiteRT (.tflite) target. ``channel_last_io`` None: the target's default (NHWC image I/O
    on android / ios / iot); ``name``: the file stem (default: the target's name in convert, "model" in
    package); ``quant_config``: a scheme of edge/quantize.py the target's runtime runs."""

    channel_last_io: bool | None = None
    strict_ops: bool = False
    quant_config: Any = None
    calibration_data: Any = None
    name: str | None = None

    def _check_values(self, target) -> None:
        from .quantize import resolve_quant

        resolve_quant(target, self.quant_config, self.calibration_data)  # the scheme and the calibration data

    def channel_last_for(self, target) -> bool:
        """channel_last_io, or the target's default when None."""
        return target.channel_last_io if self.channel_last_io is None else self.channel_last_io


@dataclasses.dataclass(frozen=True)
class IotOptions(EdgeOptions):
    """The iot target's options: EdgeOptions plus the agreement samples and the flash / RAM budget."""

    verify_inputs: Any = None
    flash_kib: float | None = None
    ram_kib: float | None = None


@dataclasses.dataclass(frozen=True)
class XlaOptions(_Options):
    """Options of a StableHLO target without a TPU chip (cuda, cpu-xla). ``use_pallas`` None: "auto" on TPU
    chips, False elsewhere; ``dtype`` None: float32; ``precision`` None: "highest" (a float32 matmul's or
    conv's passes on TPU: "highest" float32-exact, "high" bf16_3x, "default" one bf16 pass, the fastest compile
    and run; tpu_backend.export_program). ``slots`` (convert_lm only): B, adds the ``decode_slots`` and
    ``insert_slot`` signatures (continuous batching of B requests, converter/llm.py); None: none."""

    use_pallas: Any = None
    dtype: str | None = None
    precision: str | None = None
    quant_config: Any = None
    mesh: Any = None
    partition_rules: Any = None
    slots: int | None = None

    def _check_values(self, target) -> None:
        self.export_kwargs(target)

    def export_kwargs(self, target) -> dict:
        """tpu_backend.export_program keywords. TPU chips default to use_pallas="auto" (kernels where their
        shape rules expect a gain) with blocks sized for the chip; CPU/GPU targets to plain XLA (no TPU
        platform in the artifact to run a kernel on)."""
        kw = {}
        if self.dtype in ("bfloat16", "bf16"):
            kw["dtype"] = "bfloat16"
        if self.precision is not None:
            kw["precision"] = self.precision
        if self.quant_config is not None:
            from tpu_export.tpu_backend.quant import parse_quant

            try:
                kw["quant"] = parse_quant(self.quant_config)
            except ValueError as e:
                raise ValueError(f"target {target.name!r}: {e}") from None
        default = "auto" if target.chip is not None else False
        kw["use_pallas"] = self.use_pallas if self.use_pallas is not None else default
        from tpu_export.tpu_backend.pallas.config import GENERATIONS  # pure Python: no jax import

        if target.chip in GENERATIONS:
            kw["generation"] = target.chip
        if self.mesh is not None or self.partition_rules is not None:
            from tpu_export.tpu_backend.sharding import MeshSpec, PartitionRules

            if self.mesh is None:
                raise OptionsError(f"target {target.name!r}: partition_rules need a mesh; pass mesh={{'data': 2}} "
                                   "or similar")
            try:
                MeshSpec.of(self.mesh)
                if self.partition_rules is not None:
                    PartitionRules.of(self.partition_rules)
            except (TypeError, ValueError) as e:
                raise OptionsError(f"target {target.name!r}: {e}") from None
            kw["mesh"] = self.mesh
            if self.partition_rules is not None:
                kw["partition_rules"] = self.partition_rules
        return kw


@dataclasses.dataclass(frozen=True)
class TpuOptions(XlaOptions):
    """Options of a TPU chip target: XlaOptions plus ``topology`` (None: the target's default), ``aot``
    (AOT-compile for the chip when libtpu is installed) and ``aot_in_process``: False compiles in a child
    process (tpu_backend/compile_worker.py: libtpu's compile memory is gone before the save reads the
    weights), True in this one, None (default) a child for 384 MiB of weights or more on a host with no TPU
    attached (tpu_backend.aot.in_child_by_default)."""

    topology: str | None = None
    aot: bool = True
    aot_in_process: bool | None = None

    def _check_values(self, target) -> None:
        super()._check_values(target)
        if self.topology is not None:
            from .tpu import check_topology

            check_topology(target, self.topology)  # InvalidTopologyError lists the valid ones


_ALL = {f.name for cls in (IotOptions, TpuOptions) for f in dataclasses.fields(cls)}


def _refuse_old(names) -> None:
    for n in sorted(names):
        if n in OLD_NAMES:
            raise OptionsError(f"option {n} is gone; use {OLD_NAMES[n]}")


def _refuse_unknown(target, names, cls) -> None:
    taken = [f.name for f in dataclasses.fields(cls)]
    _refuse_old(names)
    bad = sorted(set(names) - set(taken))
    if bad:
        elsewhere = [n for n in bad if n in _ALL]
        why = f" ({', '.join(elsewhere)}: options of other targets)" if elsewhere else ""
        raise OptionsError(f"target {target.name!r} does not take option(s) {', '.join(bad)}{why}; "
                           f"it takes {', '.join(taken)}")


def options_for(target, options=None):
    """``options`` (a mapping, or already the target's options dataclass) as the target's checked options."""
    from .registry import get_target

    t = get_target(target)
    cls = t.options_type
    if isinstance(options, _Options):
        if type(options) is not cls:
            raise OptionsError(f"target {t.name!r} takes {cls.__name__}, got {type(options).__name__}")
        return options.check(t)
    options = dict(options or {})
    _refuse_unknown(t, options, cls)
    return cls(**options).check(t)


def split_shared(targets, shared: Mapping) -> list[dict]:
    """Options given once for every target of a call: each target gets those its options type has; a name
    no target of the call takes (or an old spelling) fails, naming the targets."""
    _refuse_old(shared)
    out, used = [], set()
    for t in targets:
        names = {f.name for f in dataclasses.fields(t.options_type)}
        out.append({k: v for k, v in shared.items() if k in names})
        used |= names
    unknown = sorted(set(shared) - used)
    if unknown:
        raise OptionsError(f"unknown option(s) {', '.join(unknown)}: no target of this call "
                           f"({', '.join(t.name for t in targets)}) takes them")
    return out
