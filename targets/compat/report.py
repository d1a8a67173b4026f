"""compatibility(tflite, target): which ops run on the target's accelerator and which fall back."""

from __future__ import annotations

import collections
import dataclasses
import functools

from .model_ops import read_ops

__all__ = ["Delegate", "delegates", "Report", "CompatibilityError", "compatibility"]


class CompatibilityError(RuntimeError):
    """strict=True and some op falls back off the accelerator (or cannot run at all)."""


@dataclasses.dataclass(frozen=True)
class Delegate:
    name: str
    accelerator: str  # what the supported ops run on
    fallback: str  # what happens to the others
    source: str
    check: object  # op -> None (supported) or a reason string

    def reason(self, op) -> str | None:
        return self.check(op)


def _table_check(table, common=None):
    def check(op):
        if op.fp16_weights:  # float16 weights: taken by the delegate's FP16GraphPartitionHelper
            return None
        if common is not None:
            reason = common(op)
            if reason:
                return reason
        fn = table.get(op.name)
        if fn is None:
            return f"{op.name} is not supported"
        return fn(op)

    return check


def _set_check(ops):
    return lambda op: None if op.name in ops else f"{op.name} is not registered"


def _delegates() -> dict[str, Delegate]:
    from . import android_gpu, ios_coreml, ios_metal, tflite_micro

    return {
        "gpu": Delegate("gpu", "GPU (LiteRT GPU delegate)", "CPU", android_gpu.SOURCE,
                        _table_check(android_gpu.GPU_OPS)),
        "coreml": Delegate("coreml", "Neural Engine/GPU (Core ML delegate)", "CPU", ios_coreml.SOURCE,
                           _table_check(ios_coreml.COREML_OPS, ios_coreml.coreml_common_check)),
        "metal": Delegate("metal", "GPU (Metal delegate)", "CPU", ios_metal.SOURCE, _table_check(ios_metal.METAL_OPS)),
        "tflm": Delegate("tflm", "MCU (TFLite Micro)", "cannot run (no fallback)", tflite_micro.SOURCE,
                         _set_check(tflite_micro.TFLM_OPS)),
        # LiteRT's builtin CPU kernels (XNNPACK where it applies; LiteRT.js's wasm build is the same
        # runtime compiled to WebAssembly) run every builtin we write: nothing falls back.
        "cpu": Delegate("cpu", "CPU (LiteRT builtin kernels / XNNPACK)", "CPU", "LiteRT builtin op resolver",
                        lambda op: None if not op.name.startswith("CUSTOM:") else "custom op"),
    }


@functools.cache
def delegates() -> dict[str, Delegate]:
    """Every delegate we report on, by name (built on first use: keeps import time flat)."""
    return _delegates()


def _delegate(name: str) -> Delegate:
    known = delegates()
    if name not in known:
        raise ValueError(f"unknown delegate {name!r}; known: {', '.join(known)}")
    return known[name]


@dataclasses.dataclass
class Report:
    target: str
    delegate: str
    accelerator: str
    fallback_to: str
    source: str
    total: int
    accelerated: dict  # op name -> count
    fallback: dict  # op name -> count
    reasons: dict  # op name -> sorted list of distinct reasons

    @property
    def ok(self) -> bool:
        return not self.fallback

    @property
    def accelerated_count(self) -> int:
        return sum(self.accelerated.values())

    @property
    def fallback_count(self) -> int:
        return sum(self.fallback.values())

    def summary(self) -> str:
        head = (f"{self.target} [{self.delegate}]: {self.accelerated_count}/{self.total} ops on {self.accelerator}, "
                f"{self.fallback_count} -> {self.fallback_to}")
        lines = [head]
        if self.accelerated:
            lines.append("  on accelerator: " + ", ".join(f"{k} x{v}" for k, v in sorted(self.accelerated.items())))
        for name, n in sorted(self.fallback.items()):
            lines.append(f"  fallback: {name} x{n}: {'; '.join(self.reasons[name])}")
        lines.append(f"  (table: {self.source})")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()

    def raise_if_fallback(self) -> None:
        if self.fallback:
            ops = ", ".join(f"{k} x{v} ({'; '.join(self.reasons[k])})" for k, v in sorted(self.fallback.items()))
            raise CompatibilityError(
                f"strict: target {self.target!r} ({self.delegate}): {self.fallback_count} of {self.total} ops "
                f"do not run on {self.accelerator} ({self.fallback_to}): {ops}")


def compatibility(tflite: bytes, target, *, delegate: str | None = None, strict: bool = False) -> Report:
    """Check every operator of ``tflite`` against ``target``'s delegate table (default: its first)."""
    from ..registry import TARGETS, get_target

    t = get_target(target)  # unknown names fail with the known list
    tname = t.name
    if t.backend != "edge":
        raise ValueError(f"target {tname!r} does not produce a .tflite; compatibility applies to "
                         f"{', '.join(n for n, x in TARGETS.items() if x.backend == 'edge')}")
    d = _delegate(delegate or t.delegates[0])  # a target's first delegate is the one reported by default
    acc, fb = collections.Counter(), collections.Counter()
    reasons: dict[str, set] = collections.defaultdict(set)
    ops = read_ops(tflite)
    for op in ops:
        reason = d.reason(op)
        if reason is None:
            acc[op.name] += 1
        else:
            fb[op.name] += 1
            reasons[op.name].add(reason)
    rep = Report(tname, d.name, d.accelerator, d.fallback, d.source, len(ops), dict(acc), dict(fb),
                 {k: sorted(v) for k, v in reasons.items()})
    if strict:
        rep.raise_if_fallback()
    return rep
