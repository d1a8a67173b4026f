"""litert_torch.hlfb: mark a region of a model as one named op (a composite), litert-torch 0.10's
``StableHLOCompositeBuilder``.

    builder = StableHLOCompositeBuilder(name="odml.scaled_tanh", attr={"scale": 2.0})
    x = builder.mark_inputs(x)
    y = torch.tanh(x * 2.0)
    y = builder.mark_outputs(y)

The marks are identity ops (``tpu_export_hlfb::mark_tensor``) that ``torch.export`` keeps. At conversion the
region between a builder's input and output marks becomes one call of the composite's op
(:func:`composite_op`) when the backend has a lowering for it, registered through the public custom-op API
(:func:`composite_lowering`, or ``@edge.lowering(composite_op(name))``); otherwise the marks are dropped and the
region is lowered op by op. A composite lowering sees only the marked inputs and the attributes: mark every tensor
the region reads (weights included) that its lowering needs.

``convert(..., _litert_converter_flags={"enable_composite_direct_lowering": False})`` lowers every region op by op.
"""

from __future__ import annotations

import functools
import json
import re
import uuid
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    import torch

    from tpu_export.converter.program import Program

__all__ = ["StableHLOCompositeBuilder", "composite_op", "composite_lowering", "apply_composites"]

_NS = "tpu_export_hlfb"
_ATTR_TYPES = (bool, int, float, str)


def _serialize_attr(attr: dict | None) -> str:
    if attr is None:
        return "{}"
    if not isinstance(attr, dict):
        raise TypeError(f"StableHLOCompositeBuilder: attr must be a dict of str -> value, got {type(attr).__name__}")
    for k, v in attr.items():
        ok = isinstance(v, _ATTR_TYPES) or (
            isinstance(v, (list, tuple)) and all(isinstance(e, (bool, int, float)) for e in v))
        if not isinstance(k, str) or not ok:
            raise TypeError(f"StableHLOCompositeBuilder: attr[{k!r}] is a {type(v).__name__}; attributes are bool, "
                            "int, float, str or a list of numbers (pass a tensor through mark_inputs instead)")
    return json.dumps({k: list(v) if isinstance(v, tuple) else v for k, v in attr.items()}, sort_keys=True)


@functools.cache
def _mark_op():
    """``tpu_export_hlfb::mark_tensor``: an identity (a copy, as a custom op may not alias its input) that
    torch.export keeps whole; both backends lower it as the identity when no composite pass removed it."""
    import torch

    # the schema is spelled out: this module's annotations are strings (from __future__ import annotations)
    @torch.library.custom_op(f"{_NS}::mark_tensor", mutates_args=(),
                             schema="(Tensor x, str name, int pos, str id, bool is_input, str attr) -> Tensor")
    def mark_tensor(x, name, pos, id, is_input, attr):
        return x.clone()

    @mark_tensor.register_fake
    def _(x, name, pos, id, is_input, attr):
        return torch.empty_like(x)

    op = torch.ops.tpu_export_hlfb.mark_tensor.default
    from tpu_export.edge.registry import EDGE
    from tpu_export.tpu_backend.lowering.registry import JAX_LOWERINGS

    EDGE.register(op, lambda lw, x, *_: lw.alias(x))
    JAX_LOWERINGS.register(op, lambda ctx, x, *_: x)
    return op


def _op_name(name: str) -> str:
    return "c_" + re.sub(r"[^0-9A-Za-z_]", lambda m: "_" if m.group() == "." else f"_x{ord(m.group()):x}_", name)


@functools.cache
def composite_op(name: str) -> Any:
    """The op a composite region named ``name`` becomes: ``tpu_export_hlfb::c_<name>(Tensor[] inputs, str attr)
    -> Tensor[]``, defined on first use.

    Register its lowering with ``@edge.lowering(composite_op(name))``: the function is called as
    ``fn(lw, inputs, attr)`` with ``inputs`` the lowered marked inputs in mark order and ``attr`` the attributes
    as a JSON string, and returns one lowered value per marked output (a tuple). :func:`composite_lowering` does
    the unpacking for you.

    Args:
        name: The composite's name, as given to ``StableHLOCompositeBuilder`` (``"odml.rms_norm"``).

    Returns:
        The ``torch.ops`` overload of the composite.

    Raises:
        ValueError: ``name`` is empty, or another composite's name maps to the same op name.
    """
    import torch

    if not name:
        raise ValueError("composite_op: the composite name is empty")
    op_name = _op_name(name)
    if _NAMES.setdefault(op_name, name) != name:
        raise ValueError(f"composite_op: {name!r} and {_NAMES[op_name]!r} map to the same op name {op_name!r}; "
                         "rename one of the composites")
    lib = torch.library.Library(_NS, "FRAGMENT")
    lib.define(f"{op_name}(Tensor[] inputs, str attr) -> Tensor[]")

    def _eager(inputs, attr):
        # the region's own ops are its definition; the composite op exists only in converted graphs
        raise NotImplementedError(f"the composite {name!r} runs only in a converted model (its region is the "
                                  "eager definition)")

    lib.impl(op_name, _eager, "CompositeExplicitAutograd")
    _LIBS.append(lib)  # a Library unregisters its ops when collected
    return getattr(getattr(torch.ops, _NS), op_name).default


_LIBS: list = []
_NAMES: dict[str, str] = {}  # op name -> composite name: two names that sanitize alike are refused


def composite_lowering(name: str, *, backend: str = "edge") -> Callable[[Callable], Callable]:
    """Decorator: register ``fn(ctx, *inputs, **attr)`` as the lowering of the composite ``name`` on a backend.

    ``inputs`` are the backend's values of the marked inputs in mark order, ``attr`` the builder's attributes;
    the function returns the value of the one marked output, or a tuple of them.

    Args:
        name: The composite's name (``"odml.scaled_tanh"``).
        backend: ``"edge"`` (LiteRT: ``litert_torch.convert`` applies it) or ``"tpu"`` (the TPU backend: run
            ``tpu_backend.export_program(hlfb.apply_composites(converter.prepare(m, args), "tpu"))``).

    Returns:
        The decorator; it registers the function and returns it unchanged.

    Raises:
        ValueError: ``backend`` is neither ``"edge"`` nor ``"tpu"``.
        tpu_export.converter.registry.DuplicateLoweringError: The composite already has a lowering on that backend.

    Examples:
        >>> import numpy as np
        >>> import torch
        >>> from tpu_export import litert_torch
        >>> from tpu_export.litert_torch import hlfb
        >>> @hlfb.composite_lowering("docs.double_plus")
        ... def double_plus(lw, x, *, bias):
        ...     two = lw.tensor(lw.const(np.asarray(2, x.dtype)))
        ...     y = lw.op("MUL", [lw.tensor(x), two], x.shape, x.dtype, x.perm, lw.options("Mul"))
        ...     b = lw.tensor(lw.const(np.asarray(bias, x.dtype)))
        ...     return lw.op("ADD", [lw.tensor(y), b], x.shape, x.dtype, x.perm, lw.options("Add"))
        >>> class M(torch.nn.Module):
        ...     def forward(self, x):
        ...         b = hlfb.StableHLOCompositeBuilder("docs.double_plus", attr={"bias": 1.0})
        ...         y = b.mark_outputs(b.mark_inputs(x) * 2 + 1.0)
        ...         return y - 1
        >>> model = litert_torch.convert(M().eval(), (torch.ones(2),))
        >>> model(torch.ones(2))
        tensor([2., 2.])
    """
    if backend not in ("edge", "tpu"):
        raise ValueError(f"composite_lowering: backend must be 'edge' or 'tpu', got {backend!r}")

    def register(fn: Callable) -> Callable:
        def lower(ctx, inputs, attr):
            out = fn(ctx, *inputs, **json.loads(attr))
            return tuple(out) if isinstance(out, (tuple, list)) else (out,)

        functools.update_wrapper(lower, fn)  # errors name the user's function and its line
        del lower.__wrapped__  # its own signature (ctx, inputs, attr) is what binds the composite op's schema
        _registry(backend).register(composite_op(name), lower)
        return fn

    return register


def _registry(backend: str):
    if backend == "edge":
        from tpu_export.edge.registry import EDGE

        return EDGE
    from tpu_export.tpu_backend.lowering.registry import JAX_LOWERINGS

    return JAX_LOWERINGS


class StableHLOCompositeBuilder:
    """Marks the inputs and outputs of a region that converts as one named op (litert-torch 0.10's builder).

    Args:
        name: The composite's name (``"odml.rms_norm"``): the op it becomes where a lowering is registered.
        attr: The composite's attributes: str -> bool, int, float, str or a list of numbers.

    Raises:
        TypeError: An attribute value is of another type.

    Examples:
        >>> import torch
        >>> from tpu_export.litert_torch.hlfb import StableHLOCompositeBuilder
        >>> b = StableHLOCompositeBuilder("odml.gelu", attr={"approximate": "tanh"})
        >>> x = b.mark_inputs(torch.ones(2))
        >>> b.mark_outputs(torch.nn.functional.gelu(x, approximate="tanh")).shape
        torch.Size([2])
    """

    def __init__(self, name: str, attr: dict[str, Any] | None = None):
        self.name = name
        self.attr = attr
        self._attr = _serialize_attr(attr)
        self.id = uuid.uuid4().hex
        self._counts = {True: 0, False: 0}

    def _mark(self, tensors, is_input: bool):
        import torch

        op = _mark_op()
        out = []
        for t in tensors:
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"StableHLOCompositeBuilder({self.name!r}): mark_{'inputs' if is_input else 'outputs'}"
                                f" takes tensors, got {type(t).__name__}")
            pos = self._counts[is_input]
            self._counts[is_input] += 1
            out.append(op(t, self.name, pos, self.id, is_input, "{}" if is_input else self._attr))
        return out[0] if len(out) == 1 else tuple(out)

    def mark_inputs(self, *tensors: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """Mark the region's inputs; use the returned tensors in the region.

        Args:
            *tensors: The tensors the region reads.

        Returns:
            The marked tensor (one input) or a tuple of them.

        Raises:
            TypeError: An argument is not a tensor.
        """
        return self._mark(tensors, True)

    def mark_outputs(self, *tensors: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """Mark the region's outputs; use the returned tensors after the region.

        Args:
            *tensors: The tensors the region produces.

        Returns:
            The marked tensor (one output) or a tuple of them.

        Raises:
            TypeError: An argument is not a tensor.
        """
        return self._mark(tensors, False)


def _has_marks(prog: Program) -> bool:
    return any(n.op == "call_function" and str(getattr(n.target, "namespace", "")) == _NS
               and "mark_tensor" in str(n.target)
               for sig in prog.signatures.values() for n in sig.graph.nodes)


def apply_composites(prog: Program, backend: str = "edge", *, direct_lowering: bool = True) -> Program:
    """Turn each marked region of ``prog`` into one composite op where ``backend`` lowers it, and drop the marks
    of the others (lowered op by op). The converter runs this before lowering; call it yourself only on a
    Program you lower with your own code.

    Args:
        prog: A captured Program (``tpu_export.converter.prepare``).
        backend: ``"edge"`` or ``"tpu"``: whose lowering table decides.
        direct_lowering: False: every region op by op, registered composite lowerings or not.

    Returns:
        ``prog``, changed in place.

    Raises:
        ValueError: A composite's marks are incomplete (a builder's mark_outputs was never called).
    """
    if not _has_marks(prog):
        return prog
    import operator

    from tpu_export.converter.passes import remove_dead_code, run_shared_passes

    registry = _registry(backend)
    mark = _mark_op()

    def rewrite(p):
        for sig in p.signatures.values():
            graph = sig.graph
            groups: dict[str, dict] = {}
            for n in graph.nodes:
                if n.op == "call_function" and n.target is mark:
                    _, name, pos, cid, is_input, attr = n.args
                    g = groups.setdefault(cid, {"name": name, "attr": "{}", "in": {}, "out": {}})
                    g["in" if is_input else "out"][pos] = n
                    if not is_input:
                        g["attr"] = attr
            for g in groups.values():
                op = composite_op(g["name"]) if direct_lowering else None
                complete = (g["in"] and g["out"] and sorted(g["in"]) == list(range(len(g["in"])))
                            and sorted(g["out"]) == list(range(len(g["out"]))))
                if g["in"] and not g["out"]:
                    raise ValueError(f"composite {g['name']!r}: inputs are marked but no outputs "
                                     "(call the builder's mark_outputs on the region's results)")
                if op is not None and complete and op in registry:
                    outs = [g["out"][i] for i in range(len(g["out"]))]
                    ins = [g["in"][i].args[0] for i in range(len(g["in"]))]
                    order = {n: i for i, n in enumerate(graph.nodes)}
                    first = min(outs, key=order.__getitem__)
                    with graph.inserting_before(first):
                        call = graph.call_function(op, (ins, g["attr"]))
                        call.meta["val"] = [o.meta["val"] for o in outs]
                        call.meta["stack_trace"] = outs[0].meta.get("stack_trace")
                        call.meta["nn_module_stack"] = outs[0].meta.get("nn_module_stack", {})
                        for i, o in enumerate(outs):
                            item = graph.call_function(operator.getitem, (call, i))
                            item.meta.update({k: v for k, v in o.meta.items() if k in ("val", "stack_trace")})
                            o.replace_all_uses_with(item)
                    for o in outs:
                        graph.erase_node(o)
            # the marks left (inputs of collapsed regions, every mark of the others) are identities
            for n in list(graph.nodes):
                if n.op == "call_function" and n.target is mark:
                    n.replace_all_uses_with(n.args[0])
                    graph.erase_node(n)

    rewrite.__name__ = "apply_composites"
    return run_shared_passes(prog, passes=[rewrite, remove_dead_code])


def __getattr__(name):
    if name == "mark_pattern":
        raise NotImplementedError(
            "litert_torch.hlfb.mark_pattern (pattern-matched composites over the exported graph) is not provided; "
            "mark the region in the model's code with hlfb.StableHLOCompositeBuilder(name, attr).mark_inputs(...) / "
            ".mark_outputs(...)")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
