"""The lowering contract, one for every backend (edge/LiteRT, tpu/JAX) and public for users' ops.

A backend owns one ``LoweringRegistry``; a lowering is one small function registered for an
op (an ATen ``OpOverload``, a ``torch.library`` custom op's overload, or a Python operator on
SymInts), with the op's schema in a comment above it::

    # mylib::scale_tanh(Tensor x, float scale=1.0) -> Tensor
    @table.lowering(torch.ops.mylib.scale_tanh.default)
    def scale_tanh(ctx, x, scale=1.0): ...

- **Arguments** are the op's schema arguments in schema order, defaults filled, keyword-only
  ones included (``bind_args``), with tensors as the backend's values. Every backend's driver
  binds through the one binder here, as does the converter's decomposition pass.
- **The context** (first argument) has, on every backend, the same names and forms
  (``LoweringContextBase``): ``ctx.node`` (the fx node), ``ctx.out_dtype`` / ``ctx.out_shape``
  (the first output's) and ``ctx.out_dtypes`` / ``ctx.out_shapes`` (one per output), in the
  backend's own dtype and dim types; the rest is the backend's (emitting LiteRT builtins, jax
  options).
- **Registration** of an op twice is an error naming both sites: silent overwrites (as in some
  peers) make the op table depend on import order. ``override=True`` replaces a lowering on
  purpose (a user's lowering of an ATen op).
- **Support**: ``@supported_if(pred)`` limits a lowering to the nodes for which ``pred(node)``
  is true; the support check asks it before anything is written, so such nodes are reported
  with every other unsupported op and the user's source line. A predicate that raises is a
  bug, not a "no": the error names the op, the predicate and the user's line. ``arguments(node)``
  gives a predicate the node's arguments by schema name, defaults filled.
- **Errors** a lowering raises are wrapped once, by ``LoweringRegistry.call``, in a
  ``LoweringError`` (a ConversionError) naming the backend, the op, the node and the user's
  source line.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any, Callable, Iterable

import torch

from ._torch_compat import is_op_overload, op_schema
from .errors import ConversionError, source_line

__all__ = ["LoweringRegistry", "DuplicateLoweringError", "LoweringError", "LoweringContextBase", "supported_if",
           "bind_args", "arguments", "unbind_args", "op_name", "OP_FAMILIES", "import_op_families"]

# The op families every backend splits its lowerings by, one file each (edge/ops_<family>.py,
# tpu_backend/lowering/ops_<family>.py): an op's lowerings and its test row are found under one name.
OP_FAMILIES = ("activation", "attention", "conv", "creation", "detection", "elementwise", "index", "logical", "nn",
               "norm", "pool", "reduce", "resize", "rnn", "sampling", "shape", "slice", "symbolic")


class DuplicateLoweringError(RuntimeError):
    """An op was registered twice in one table without ``override=True``."""


class LoweringError(ConversionError):
    """A lowering failed on a node it claimed to support (a bug, or an argument it cannot take)."""


def op_name(target) -> str:
    """'aten.add.Tensor' for an OpOverload; the callable's name for Python operators."""
    if is_op_overload(target):
        schema = op_schema(target)
        ns, op = schema.name.split("::", 1)  # 'aten::add' (no overload suffix)
        return f"{ns}.{op}.{schema.overload_name or 'default'}"
    return f"{getattr(target, '__module__', '')}.{getattr(target, '__name__', repr(target))}".lstrip(".")


def _site(fn) -> str:
    code = getattr(fn, "__code__", None)
    where = f" ({code.co_filename}:{code.co_firstlineno})" if code is not None else ""
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}{where}"


def import_op_families(package: str) -> list[str]:
    """Import ``package``.ops_<family> for every family the package has a file for (which registers
    its lowerings); returns the families found."""
    found = [f for f in OP_FAMILIES if importlib.util.find_spec(f"{package}.ops_{f}") is not None]
    for f in found:
        importlib.import_module(f"{package}.ops_{f}")
    return found


# ---------------------------------------------------------------------------- the one argument binder

# target -> ((name, kwarg_only, has_default, default, optional), ...); the schema is read once per
# op (torch builds its Argument objects anew on every access, and this runs for every node).
_SPECS: dict = {}


def _spec(target):
    spec = _SPECS.get(target)
    if spec is None:
        schema = op_schema(target)
        if schema is None:  # a Python operator on SymInts (operator.mul, torch.sym_max, getitem)
            spec = ()
        else:
            spec = tuple((a.name, a.kwarg_only, a.has_default_value(),
                          a.default_value if a.has_default_value() else None,
                          isinstance(a.type, torch.OptionalType)) for a in schema.arguments)
        _SPECS[target] = spec
    return spec


def bind_args(node: torch.fx.Node) -> list:
    """``node``'s arguments in schema order, defaults filled, keyword-only ones after the
    positional ones (fx Nodes stay Nodes). A Python operator's are its positional arguments."""
    spec = _spec(node.target)
    args, kwargs = node.args, node.kwargs
    if not spec:
        if kwargs:
            raise LoweringError(f"{op_name(node.target)}: unexpected keyword arguments {sorted(kwargs)} "
                                f"at {source_line(node)}")
        return list(args)
    out = []
    for i, (name, kwarg_only, has_default, default, optional) in enumerate(spec):
        if i < len(args) and not kwarg_only:
            out.append(args[i])
        elif name in kwargs:
            out.append(kwargs[name])
        elif has_default:
            out.append(list(default) if isinstance(default, list) else default)  # a fresh list per node
        elif optional:
            out.append(None)
        else:
            raise LoweringError(f"{op_name(node.target)}: argument {name!r} missing at {source_line(node)}")
    return out


def arguments(node: torch.fx.Node) -> dict:
    """``node``'s arguments by schema name, defaults filled (for support predicates and graph passes)."""
    return dict(zip((s[0] for s in _spec(node.target)), bind_args(node)))


def unbind_args(target, values: list) -> tuple[list, dict]:
    """Schema-ordered ``values`` back to the (args, kwargs) the op is called with (keyword-only ones
    by name), to evaluate it in torch."""
    spec = _spec(target)
    args = [v for v, s in zip(values, spec) if not s[1]] if spec else list(values)
    return args, {s[0]: v for v, s in zip(values, spec) if s[1]}


# ---------------------------------------------------------------------------- the context shape


class LoweringContextBase:
    """The part of a lowering's context that is the same on every backend.

    A backend's context sets ``node`` and says how a torch dtype and a fake tensor's shape read
    in its terms (``_dtype``, ``_shape``: numpy dtypes and None for dynamic dims on the edge; jnp
    dtypes and jax.export symbolic dims on the TPU)."""

    node: torch.fx.Node

    def _dtype(self, torch_dtype):
        raise NotImplementedError

    def _shape(self, val) -> tuple:
        raise NotImplementedError

    def _outs(self) -> tuple:
        val = self.node.meta["val"]
        return tuple(val) if isinstance(val, (tuple, list)) else (val,)

    @property
    def out_dtype(self):
        """The first output's dtype."""
        return self._dtype(self._outs()[0].dtype)

    @property
    def out_shape(self) -> tuple:
        """The first output's shape."""
        return self._shape(self._outs()[0])

    @property
    def out_dtypes(self) -> tuple:
        """Each output's dtype (None for an output that is not a tensor)."""
        return tuple(self._dtype(v.dtype) if isinstance(v, torch.Tensor) else None for v in self._outs())

    @property
    def out_shapes(self) -> tuple:
        """Each output's shape (None for an output that is not a tensor)."""
        return tuple(self._shape(v) if isinstance(v, torch.Tensor) else None for v in self._outs())


# ---------------------------------------------------------------------------- support and the table


def supported_if(pred: Callable[[torch.fx.Node], bool]) -> Callable[[Callable], Callable]:
    """Decorator: limit a lowering to the nodes for which ``pred(node)`` is true.

    ``edge.supported_if`` and ``tpu_backend.lowering.supported_if`` are this function. Put it under the
    ``lowering`` decorator. The support check asks the predicate for every node of the op before anything is
    written, so the nodes it refuses are reported with every other unsupported op, with the user's source line.
    ``converter.registry.arguments(node)`` gives the predicate the node's arguments by schema name.

    Args:
        pred: ``pred(node) -> bool`` for an fx node of the op; ``node.meta["val"]`` is its output's fake tensor.
            A predicate that raises is a bug, not a "no": the support check turns the error into a
            ``LoweringError`` naming the op, the predicate and the node's source line.

    Returns:
        The decorator; it returns the lowering unchanged, with the predicate attached.

    Examples:
        >>> import torch
        >>> from tpu_export import converter
        >>> from tpu_export.converter.registry import LoweringRegistry, supported_if
        >>> table = LoweringRegistry("example")
        >>> @table.lowering(torch.ops.aten.relu.default)
        ... @supported_if(lambda node: node.meta["val"].dim() <= 4)
        ... def relu(ctx, x):
        ...     return x
        >>> def relu_node(shape):
        ...     prog = converter.prepare(torch.nn.ReLU().eval(), (torch.ones(shape),))
        ...     return next(n for n in prog.signature().graph.nodes if n.op == "call_function")
        >>> table.is_supported(relu_node((2, 3))), table.is_supported(relu_node((1, 1, 1, 1, 2)))
        (True, False)
    """

    def attach(fn):
        fn.supported_if = pred
        return fn

    return attach


class LoweringRegistry:
    """One backend's lowering table: op -> ``fn(ctx, *schema_bound_args)``.

    The edge backend's table is ``edge.EDGE`` (its ``lowering`` method is ``edge.lowering``), the TPU
    backend's is ``tpu_backend.lowering.JAX_LOWERINGS`` (``tpu_backend.lowering.lowering``). Register your own
    ops through those names; a table of your own is only useful for trying the contract out.

    Args:
        backend: The backend's name, used in error messages (``"edge"``, ``"tpu"``).
    """

    def __init__(self, backend: str):
        self.backend = backend
        self._table: dict[object, Callable] = {}
        # 'ns.op.overload' -> lowering, for ops of a library that registers them on its own import
        # (torchvision's): bound to the OpOverload the first time a graph or a listing meets it.
        self._by_name: dict[str, Callable] = {}

    def lowering(self, *targets: Any, override: bool = False) -> Callable[[Callable], Callable]:
        """Decorator: register the decorated function as the lowering of each given op.

        This is how a ``torch.library`` custom op (or an ATen op, with ``override=True``) gets lowered:
        ``@edge.lowering(op)`` for the LiteRT backend, ``@tpu_backend.lowering.lowering(op)`` for the TPU backend.
        The function is called as ``fn(ctx, *args)``: ``args`` are the op's schema arguments in schema order,
        defaults filled in and keyword-only ones last, with tensors as the backend's values (on the edge a
        lowered value with ``.shape``, ``.dtype`` and ``.perm``; on the TPU a jax array). ``ctx`` has
        ``ctx.node``, ``ctx.out_dtype``, ``ctx.out_shape`` (and the plural forms for several outputs) on both
        backends; the edge context also emits LiteRT builtins (``ctx.op``, ``ctx.tensor``, ``ctx.const``,
        ``ctx.options``). An exception the function raises reaches the user as one ``LoweringError`` naming the
        backend, the op and the model's source line.

        Args:
            *targets: The ops to lower: ``torch.ops.<namespace>.<op>.<overload>`` (``OpOverload``) objects.
            override: Replace the lowering an op already has (a built-in one, for an ATen op); without it a
                second registration of the op is an error.

        Returns:
            The decorator; it registers the function and returns it unchanged.

        Raises:
            DuplicateLoweringError: An op already has a lowering in this table and ``override`` is False (the
                message names both functions with their file and line).
            TypeError: The decorated object is not callable.

        Examples:
            >>> import numpy as np
            >>> import torch
            >>> from tpu_export import converter, edge, litert_torch, tpu_backend
            >>> from tpu_export.tpu_backend.lowering import lowering as tpu_lowering
            >>> @torch.library.custom_op("tpu_export_docs::double", mutates_args=())
            ... def double(x: torch.Tensor) -> torch.Tensor:
            ...     return x * 2
            >>> @double.register_fake
            ... def _(x):
            ...     return torch.empty_like(x)
            >>> @edge.lowering(torch.ops.tpu_export_docs.double.default)       # LiteRT: one MUL builtin
            ... def double_litert(lw, x):
            ...     two = lw.tensor(lw.const(np.asarray(2, x.dtype)))
            ...     return lw.op("MUL", [lw.tensor(x), two], x.shape, x.dtype, x.perm, lw.options("Mul"))
            >>> @tpu_lowering(torch.ops.tpu_export_docs.double.default)       # TPU: a jax function
            ... def double_jax(ctx, x):
            ...     return x * 2
            >>> class M(torch.nn.Module):
            ...     def forward(self, x):
            ...         return double(x) + 1
            >>> m, x = M().eval(), torch.ones(2, 3)
            >>> litert_torch.convert(m, (x,))(x)
            tensor([[3., 3., 3.],
                    [3., 3., 3.]])
            >>> tpu_backend.export_program(converter.prepare(m, (x,)))(x)
            tensor([[3., 3., 3.],
                    [3., 3., 3.]])
            >>> edge.lowering(torch.ops.tpu_export_docs.double.default)(double_litert)
            Traceback (most recent call last):
            ...
            tpu_export.converter.registry.DuplicateLoweringError: edge: ... is already lowered by ...
        """

        def register(fn: Callable) -> Callable:
            for t in targets:
                self.register(t, fn, override=override)
            return fn

        return register

    def register(self, target, fn: Callable, *, override: bool = False) -> None:
        if not callable(fn):
            raise TypeError(f"{self.backend}: the lowering of {op_name(target)} must be callable, got {fn!r}")
        prev = self._lookup(target)
        if prev is not None and not override:
            raise DuplicateLoweringError(
                f"{self.backend}: {op_name(target)} is already lowered by {_site(prev)}; refusing to "
                f"overwrite it with {_site(fn)} (pass override=True to replace it on purpose)")
        self._table[target] = fn

    def lowering_by_name(self, *names: str) -> Callable[[Callable], Callable]:
        """Decorator: like ``lowering``, for ops named ``'ns.op.overload'`` (``op_name``'s form) that a
        library registers when it is imported, possibly after this table was filled (``torchvision.nms.default``).
        The lowering is bound to the op the first time a graph or a listing meets it; an op never
        registered is never listed.

        Args:
            *names: The ops' names, ``'namespace.op.overload'``.

        Returns:
            The decorator; it records the function under each name and returns it unchanged.

        Raises:
            DuplicateLoweringError: A name already has a lowering recorded this way (both sites named).
        """

        def register(fn: Callable) -> Callable:
            for name in names:
                prev = self._by_name.get(name)
                if prev is not None:
                    raise DuplicateLoweringError(f"{self.backend}: {name} is already lowered by {_site(prev)}; "
                                                 f"refusing to overwrite it with {_site(fn)}")
                self._by_name[name] = fn
            return fn

        return register

    def _bind_named(self) -> None:
        for name, fn in list(self._by_name.items()):
            ns, op, overload = name.split(".")
            try:
                target = getattr(getattr(getattr(torch.ops, ns), op), overload)
            except (AttributeError, RuntimeError):
                continue  # the library is not imported (yet)
            self._by_name.pop(name)
            self._table.setdefault(target, fn)

    def _lookup(self, target) -> Callable | None:
        fn = self._table.get(target)
        if fn is None and self._by_name and is_op_overload(target) and op_name(target) in self._by_name:
            self._bind_named()
            fn = self._table.get(target)
        return fn

    def get(self, target) -> Callable | None:
        return self._lookup(target)

    def __contains__(self, target) -> bool:
        return self._lookup(target) is not None

    def __len__(self) -> int:
        self._bind_named()
        return len(self._table)

    def targets(self) -> Iterable:
        self._bind_named()
        return self._table.keys()

    def items(self) -> Iterable:
        self._bind_named()
        return self._table.items()

    def is_supported(self, node: torch.fx.Node) -> bool:
        """The table lowers ``node``: it has a lowering and that lowering's predicate accepts it."""
        fn = self._lookup(node.target)
        if fn is None:
            return False
        pred = getattr(fn, "supported_if", None)
        if pred is None:
            return True
        try:
            return bool(pred(node))
        except Exception as e:  # noqa: BLE001 - re-raised with the op, the predicate and the user's line
            raise LoweringError(
                f"{self.backend}: the support predicate of {op_name(node.target)} ({_site(pred)}) raised "
                f"{type(e).__name__}: {e} on node {node.name} at {source_line(node)}; a predicate must "
                "return False for what its lowering cannot take") from e

    def call(self, fn: Callable, ctx, args):
        """``fn(ctx, *args)`` for ``ctx.node``; an error it raises comes back as one LoweringError
        naming the backend, the op, the node and the user's source line."""
        try:
            return fn(ctx, *args)
        except LoweringError:
            raise
        except Exception as e:  # noqa: BLE001 - re-raised with the op and the user's line
            node = ctx.node
            raise LoweringError(
                f"{self.backend}: lowering {op_name(node.target)} (node {node.name}) failed at "
                f"{source_line(node)}: {type(e).__name__}: {e}") from e
