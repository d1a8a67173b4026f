"""The ONNX op table: one small function per ONNX op, keyed by (domain, op_type, opset range).

An entry is registered with its attributes and their defaults (``REQUIRED`` for attributes the
op must have), the indices of inputs that must be known at build time (``static``: a Reshape's
shape, a Slice's starts; they reach the function as numpy arrays) or that are taken as numpy when
known (``maybe_static``: a Clip's bounds, a Pad's value) and, for the ops of shape
arithmetic, a numpy ``fold`` used when every input is known (so Shape -> Gather -> Concat ->
Reshape chains become constants). The function's schema is written in a comment above it.
Registering an op twice for overlapping opsets is an error naming both sites, as in
converter/registry.py.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

__all__ = ["OnnxOp", "OnnxOpTable", "REQUIRED", "DuplicateOnnxOpError", "ONNX_OPSETS", "CONTRIB_DOMAIN", "TABLE",
           "load_ops"]

ONNX_OPSETS = (13, 21)  # the default domain's opsets the importer takes
CONTRIB_DOMAIN = "com.microsoft"
REQUIRED = object()


class DuplicateOnnxOpError(RuntimeError):
    """An ONNX op was registered twice for overlapping opsets."""


@dataclasses.dataclass
class OnnxOp:
    domain: str
    op_type: str
    since: int
    until: int | None
    fn: Callable
    attrs: dict
    static: tuple
    fold: Callable | None
    maybe_static: tuple = ()  # inputs passed as numpy when known at build time, as tensors otherwise

    def covers(self, opset: int) -> bool:
        return self.since <= opset and (self.until is None or opset <= self.until)

    def opsets(self) -> str:
        if self.domain == CONTRIB_DOMAIN:
            return "1"
        lo, hi = max(self.since, ONNX_OPSETS[0]), min(self.until or ONNX_OPSETS[1], ONNX_OPSETS[1])
        return f"{lo}" if lo == hi else f"{lo}-{hi}"


def _site(fn) -> str:
    code = getattr(fn, "__code__", None)
    return f"{fn.__module__}.{fn.__qualname__}" + (f" ({code.co_filename}:{code.co_firstlineno})" if code else "")


class OnnxOpTable:
    def __init__(self):
        self._ops: dict[tuple[str, str], list[OnnxOp]] = {}

    def op(self, op_type: str, *, domain: str = "", since: int = 1, until: int | None = None, attrs=None,
           static=(), fold=None, maybe_static=()):
        """Register ``fn(ctx, *inputs, **attrs)`` for ``op_type`` in opsets [since, until]."""

        def deco(fn):
            entry = OnnxOp(domain, op_type, since, until, fn, dict(attrs or {}), tuple(static), fold,
                           tuple(maybe_static))
            for other in self._ops.get((domain, op_type), []):
                lo, hi = max(since, other.since), min(until or 10**9, other.until or 10**9)
                if lo <= hi:
                    raise DuplicateOnnxOpError(f"ONNX op {domain or 'ai.onnx'}::{op_type} opset {lo} registered "
                                               f"twice: {_site(other.fn)} and {_site(fn)}")
            self._ops.setdefault((domain, op_type), []).append(entry)
            return fn

        return deco

    def lookup(self, domain: str, op_type: str, opset: int) -> OnnxOp | None:
        domain = "" if domain == "ai.onnx" else domain
        for e in self._ops.get((domain, op_type), []):
            if e.covers(opset):
                return e
        return None

    def entries(self) -> list[OnnxOp]:
        return sorted((e for v in self._ops.values() for e in v), key=lambda e: (e.domain, e.op_type, e.since))


TABLE = OnnxOpTable()  # filled by converter/onnx/ops_<family>.py when load_ops() imports them


def load_ops() -> OnnxOpTable:
    """The table with every family's ops registered (imports converter/onnx/ops_*.py once)."""
    from ..registry import import_op_families

    import_op_families(__name__.rsplit(".", 1)[0])
    return TABLE
