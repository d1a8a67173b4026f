"""The support check: every op a backend cannot lower, listed at once, before anything is written."""

from __future__ import annotations

from .errors import UnsupportedOpsError, source_line
from .program import Program
from .registry import op_name

__all__ = ["unsupported_ops", "check_support"]


def unsupported_ops(prog: Program, is_supported) -> dict[str, list[str]]:
    """op name -> source lines of the nodes ``is_supported(node)`` rejects."""
    missing: dict[str, list[str]] = {}
    for sig in prog.signatures.values():
        for n in sig.graph.nodes:
            if n.op == "call_function" and not is_supported(n):
                missing.setdefault(op_name(n.target), []).append(source_line(n))
    return missing


def check_support(prog: Program, backend: str, is_supported) -> None:
    missing = unsupported_ops(prog, is_supported)
    if missing:
        raise UnsupportedOpsError(backend, missing)
