"""A lowering registry keyed by the ATen overload, shared in form by every backend.

Each backend owns one ``LoweringRegistry``; a lowering is a small function registered with
``@registry.lowering(aten.add.Tensor)``. Registering an overload twice is an error: silent
overwrites (as in some peers) make the op table depend on import order.
"""

from __future__ import annotations

from typing import Callable, Iterable

__all__ = ["LoweringRegistry", "DuplicateLoweringError", "op_name"]


class DuplicateLoweringError(RuntimeError):
    pass


def op_name(target) -> str:
    """'aten.add.Tensor' for an OpOverload; the callable's name for Python operators."""
    if hasattr(target, "_overloadname") and hasattr(target, "_schema"):  # an OpOverload
        ns, op = target._schema.name.split("::", 1)  # 'aten::add' (no overload suffix)
        return f"{ns}.{op}.{target._overloadname or 'default'}"
    return f"{getattr(target, '__module__', '')}.{getattr(target, '__name__', repr(target))}".lstrip(".")


class LoweringRegistry:
    def __init__(self, backend: str):
        self.backend = backend
        self._table: dict[object, Callable] = {}

    def lowering(self, *targets) -> Callable[[Callable], Callable]:
        """Decorator: register fn as the lowering of each given ATen overload (or Python op)."""

        def register(fn: Callable) -> Callable:
            for t in targets:
                if t in self._table:
                    prev = self._table[t]
                    raise DuplicateLoweringError(
                        f"{self.backend}: {op_name(t)} is already lowered by "
                        f"{prev.__module__}.{prev.__qualname__}; refusing to overwrite it with "
                        f"{fn.__module__}.{fn.__qualname__}"
                    )
                self._table[t] = fn
            return fn

        return register

    def get(self, target) -> Callable | None:
        return self._table.get(target)

    def __contains__(self, target) -> bool:
        return target in self._table

    def __len__(self) -> int:
        return len(self._table)

    def targets(self) -> Iterable:
        return self._table.keys()
