"""The one module of tpu-export that imports or reads private torch names (internal).

Everything else in the package reaches torch's private modules and attributes (a leading underscore
anywhere in the dotted path, and ``torch.fx.experimental``) through the small functions here, so a torch
release that moves one of them breaks one function, which ``tests/converter/test_torch_compat.py``
calls on the running torch. Each function records the private name it uses, why it is needed and the
public alternative, if torch has one (``USES``; ``docs/torch_compat.md`` is generated from it). Where
torch has an equivalent public API the call sites use that instead (``REPLACED``).

Nothing is imported at module import: each private module loads on the first call that needs it, so
importing this module (or ``tpu_export``) pulls in no torch submodule.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, NamedTuple

__all__ = [
    "CHECKED_ON",
    "USES",
    "REPLACED",
    "PrivateUse",
    "PublicReplacement",
    # operators
    "is_op_overload",
    "op_schema",
    "registered_op_names",
    "register_quantized_decomposed_ops",
    # fake tensors and symbolic shapes
    "detect_fake_mode",
    "new_fake_mode",
    "free_unbacked_symbols",
    "statically_known_true",
    # tracing and decomposition
    "trace_with_decompositions",
    "core_aten_decompositions",
    "skip_graph_codegen",
    "preload_export_tracer",
    "innermost_user_frames",
    # torch.export errors
    "is_export_user_error",
    "is_dynamo_error",
    # .pt2 deserialization
    "payload_config",
    "TensorLayout",
    "tensor_layout",
    "serde_sym_ops",
    "deserialize_program",
    # pytree
    "tree_leaves",
    "tree_flatten",
    "tree_unflatten",
    "tree_map",
    "tree_flatten_with_path",
    "treespec_dumps",
    "treespec_loads",
    # nn.Module internals
    "set_module_tensor",
    "module_owns_tensor",
    "module_children",
    "replace_module_children",
]

# The torch releases every function here was run against (tests/converter/test_torch_compat.py).
CHECKED_ON = ("2.13.0", "2.14.1")


class PrivateUse(NamedTuple):
    """One function of this module: the private torch name it uses, why, and the public alternative."""

    function: str
    private: str
    why: str
    public: str


class PublicReplacement(NamedTuple):
    """A private torch name the package used to read, and the public API that replaced it."""

    private: str
    public: str
    where: str


USES: list[PrivateUse] = []

REPLACED: tuple[PublicReplacement, ...] = (
    PublicReplacement("torch._utils._element_size(dtype)", "torch.dtype.itemsize",
                      "converter/pt2_load.py: a raw tensor entry's byte count"),
    PublicReplacement("OpOverload._name", "OpOverload.name()",
                      "converter/passes/fold_constants.py, edge/lower.py: the never-fold test by op name"),
    PublicReplacement("OpOverload._overloadname", "FunctionSchema.overload_name (or 'default')",
                      "converter/registry.py op_name, converter/lean_decompose.py: an op's overload"),
    PublicReplacement("torch._C.DispatchKey", "torch.DispatchKey (the same class, in torch.__all__)",
                      "converter/lean_decompose.py: is an op composite (CompositeImplicitAutograd)"),
    PublicReplacement("Module._parameters / Module._buffers (reading)",
                      "Module.named_parameters / named_buffers(recurse=False, remove_duplicate=False)",
                      "converter/lazy_weights.py: every parameter and buffer under each of its names"),
)


def _private(private: str, why: str, public: str = "none") -> Callable:
    """Record what the decorated function uses in USES and say it in its docstring."""

    def mark(fn):
        USES.append(PrivateUse(fn.__name__, private, why, public))
        fn.__doc__ = (f"{fn.__doc__}\n\nPrivate torch API: ``{private}`` (checked on torch "
                      f"{' and '.join(CHECKED_ON)}). Why: {why}. Public alternative: {public}.")
        return fn

    return mark


# --- operators -----------------------------------------------------------------------------------


@functools.cache
def _op_overload_type():
    from torch._ops import OpOverload

    return OpOverload


@_private("torch._ops.OpOverload",
          "tell an operator call (torch.ops.<ns>.<op>.<overload>) in an FX graph from a Python callable "
          "(operator.getitem, the sym_* functions on sizes)",
          "none (torch.library imports the class but does not export it)")
def is_op_overload(x) -> bool:
    """Whether ``x`` is one overload of a torch operator (ATen or a custom op)."""
    return isinstance(x, _op_overload_type())


@_private("OpOverload._schema",
          "an op's argument names, defaults and alias/mutation annotations: binding a node's arguments, "
          "functionalizing in-place ops, telling view ops",
          "none (torch.library.infer_schema builds a schema from a Python function, not from an op)")
def op_schema(target):
    """The ``torch.FunctionSchema`` of an operator overload; None for anything else (a Python operator,
    a higher-order op)."""
    return getattr(target, "_schema", None)


@_private("torch._C._dispatch_get_all_op_names()",
          "every registered operator schema: dir(torch.ops.aten) lists only the packets a process has "
          "touched so far, so the op-support table would differ from process to process")
def registered_op_names() -> list[str]:
    """Every operator name the dispatcher knows, as 'ns::op' or 'ns::op.overload'."""
    import torch

    return list(torch._C._dispatch_get_all_op_names())


# --- fake tensors and symbolic shapes --------------------------------------------------------------


@_private("torch._guards.detect_fake_mode",
          "decompositions and new placeholders must run under the exported graph's own FakeTensorMode "
          "(its ShapeEnv holds the dynamic dims)")
def detect_fake_mode(values):
    """The FakeTensorMode the fake tensors in ``values`` belong to (or the active one); None if none."""
    from torch._guards import detect_fake_mode as detect

    return detect(values)


@_private("torch._subclasses.fake_tensor.FakeTensorMode",
          "fake values for a placeholder added to a graph that carries none")
def new_fake_mode():
    """A fresh FakeTensorMode."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    return FakeTensorMode()


@_private("torch.fx.experimental.symbolic_shapes.free_unbacked_symbols",
          "a node whose sizes depend on tensor values (data-dependent shapes) cannot be decomposed node "
          "by node")
def free_unbacked_symbols(value) -> set:
    """The unbacked (data-dependent) size symbols in a node's meta value."""
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols as free

    return free(value)


@_private("torch.fx.experimental.symbolic_shapes.statically_known_true",
          "decide a comparison of dynamic sizes without adding a guard that would specialize the export")
def statically_known_true(cond) -> bool:
    """True only when ``cond`` (a bool or SymBool) holds for every value of the dynamic dims in it."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true as known

    return known(cond)


# --- tracing and decomposition ---------------------------------------------------------------------


@_private("torch.fx.experimental.proxy_tensor.make_fx",
          "trace one op's decomposition on a node's fake values, into a subgraph spliced in place of the "
          "node",
          "ExportedProgram.run_decompositions re-traces the whole program, which converter/decompositions.py "
          "uses when the node-by-node pass declines")
def trace_with_decompositions(fn, table: dict, *fake_args):
    """``fn`` traced on ``fake_args`` (under the caller's fake mode) with ``table`` applied to what it calls."""
    from torch.fx.experimental.proxy_tensor import make_fx

    return make_fx(fn, decomposition_table=table, tracing_mode="real")(*fake_args)


@_private("torch._decomp._core_aten_decompositions_post_autograd",
          "the ATen core decompositions alone: torch's public table also enumerates and wraps every "
          "composite op of every namespace on first read (0.06-0.08 s of a conversion)",
          "torch.export.default_decompositions(), used when the private builder is gone")
def core_aten_decompositions() -> dict:
    """A fresh dict: ATen op overload -> its core-ATen decomposition."""
    try:
        from torch._decomp import _core_aten_decompositions_post_autograd as core_aten
    except ImportError:
        import torch

        return dict(torch.export.default_decompositions())
    return dict(core_aten())


@_private("torch.fx._lazy_graph_module._use_lazy_graph_module",
          "a traced subgraph is only read and spliced, never called: skip generating its Python code "
          "(~1 ms a trace)",
          "none; without it (the context is then a no-op) the code is generated and unused")
def skip_graph_codegen():
    """A context in which GraphModules created skip generating their Python code until first called."""
    try:
        from torch.fx._lazy_graph_module import _use_lazy_graph_module
    except ImportError:
        return contextlib.nullcontext()
    return _use_lazy_graph_module(True)


@_private("torch.export._trace",
          "import torch.export's tracer before gc.freeze so its module objects are frozen with the rest "
          "of the process",
          "none (torch.export imports it on the first export)")
def preload_export_tracer() -> None:
    """Import the module torch.export.export traces with."""
    import torch.export._trace  # noqa: F401


@_private("torch.fx.experimental.proxy_tensor._ModuleStackTracer._filter_traceback_frames",
          "non-strict torch.export keeps only the frames of functions named forward in a node's stack trace, so an "
          "op called in a helper (timm's crossvit.scale_image, a model's forward_features) is reported at the "
          "forward that calls the helper; the innermost frame outside torch is kept as well, the line that called "
          "the op, which errors quote",
          "none (torch.fx.traceback.annotate_fn keeps the frames of functions registered one at a time)")
def innermost_user_frames():
    """A context in which non-strict torch.export also records, in each node's stack trace, the innermost frame
    outside torch and this package (after the first forward), besides the forward frames it records itself."""
    try:
        from torch.fx.experimental.proxy_tensor import _ModuleStackTracer
    except ImportError:
        return contextlib.nullcontext()
    if not callable(getattr(_ModuleStackTracer, "_filter_traceback_frames", None)):
        return contextlib.nullcontext()
    return _keep_innermost_frame(_ModuleStackTracer)


@contextlib.contextmanager
def _keep_innermost_frame(cls):
    import os
    import traceback

    import torch

    # not the user's line: torch's own frames, and the converter's helpers a forward may call (nms_padded, ...)
    skip = tuple(os.path.dirname(os.path.abspath(f)) + os.sep for f in (torch.__file__, __file__))
    had = "_filter_traceback_frames" in cls.__dict__
    own = cls.__dict__.get("_filter_traceback_frames")
    base = cls._filter_traceback_frames

    def filter_frames(self, summary):
        kept = base(self, summary)
        frames = list(summary)
        first = next((i for i, f in enumerate(frames) if f.name == "forward"), None)
        if first is None:
            return kept
        inner = [i for i in range(first, len(frames)) if not os.path.abspath(frames[i].filename).startswith(skip)]
        if not inner or any(f is frames[inner[-1]] for f in kept):
            return kept
        pos = {id(f): i for i, f in enumerate(frames)}
        merged = sorted([*kept, frames[inner[-1]]], key=lambda f: pos.get(id(f), -1))
        return traceback.StackSummary.from_list(merged)

    cls._filter_traceback_frames = filter_frames
    try:
        yield
    finally:
        if had:
            cls._filter_traceback_frames = own
        else:
            del cls._filter_traceback_frames


# --- torch.export errors ---------------------------------------------------------------------------


@_private("torch._dynamo.exc.UserError",
          "torch.export raises it for problems in the user's model that the user can fix; the capture "
          "error reports it as such rather than as a converter failure")
def is_export_user_error(e: BaseException) -> bool:
    """Whether ``e`` is torch.export's report of a problem in the user's model."""
    from torch._dynamo.exc import UserError

    return isinstance(e, UserError)


@_private("torch._dynamo (exception module names)",
          "an error raised by torch's tracer inside an op (a guard on a data-dependent value) must reach "
          "torch.export as is, not be re-reported as the op's failure")
def is_dynamo_error(e: BaseException) -> bool:
    """Whether ``e`` is an exception class defined by torch's tracer (torch._dynamo)."""
    return type(e).__module__.startswith("torch._dynamo")


# --- .pt2 deserialization ---------------------------------------------------------------------------

_UNSAFE_LOAD = ("torch.export.load does the whole load, but it unpickles the sample inputs and evaluates shape "
                "expressions as Python, so it is never run on a user's file (converter/pt2_load.py)")


@_private("torch._export.serde.serialize._dict_to_dataclass, torch._export.serde.schema.PayloadConfig",
          "read a .pt2's weights/constants config without unpickling anything", _UNSAFE_LOAD)
def payload_config(raw: dict):
    """A .pt2's ``*_config.json`` (parsed JSON) as torch's PayloadConfig dataclass."""
    from torch._export.serde import schema
    from torch._export.serde.serialize import _dict_to_dataclass

    return _dict_to_dataclass(schema.PayloadConfig, raw)


class TensorLayout(NamedTuple):
    """How a serialized tensor's storage is viewed: torch types, ready for torch.as_strided."""

    dtype: Any
    device: Any
    size: Any
    stride: Any
    storage_offset: Any


@_private("torch._export.serde.serialize.deserialize_{scalar_type,device,size,stride,storage_offset}",
          "build a weight from its raw bytes exactly as torch's own loader lays it out", _UNSAFE_LOAD)
def tensor_layout(meta) -> TensorLayout:
    """dtype, device, size, stride and storage offset of a serialized TensorMeta."""
    from torch._export.serde import serialize as s

    return TensorLayout(s.deserialize_scalar_type(meta.dtype), s.deserialize_device(meta.device),
                        s.deserialize_size(meta.sizes), s.deserialize_stride(meta.strides),
                        s.deserialize_storage_offset(meta.storage_offset))


@_private("torch._export.serde.serialize._SYM_OPS",
          "the Python callables (operator.add, torch.sym_max, ...) a serialized graph may name as node "
          "targets besides torch.ops; anything else is refused before deserializing", _UNSAFE_LOAD)
def serde_sym_ops() -> frozenset:
    """The non-operator callables torch's serializer writes as node targets."""
    from torch._export.serde.serialize import _SYM_OPS

    return frozenset(_SYM_OPS)


@_private("torch._export.serde.serialize.ExportedProgramDeserializer, torch._export.serde.schema.ExportedProgram",
          "turn a .pt2's checked graph JSON into an ExportedProgram with the weights read from raw entries, "
          "never reading the pickled sample inputs", _UNSAFE_LOAD)
def deserialize_program(raw: dict, weights: dict, constants: dict):
    """The ExportedProgram of a .pt2's ``models/<name>.json`` (parsed JSON), with no sample inputs."""
    from torch._export.serde import schema
    from torch._export.serde.serialize import ExportedProgramDeserializer, _dict_to_dataclass

    serialized = _dict_to_dataclass(schema.ExportedProgram, raw)
    # b"": no sample inputs; torch would unpickle data/sample_inputs
    return ExportedProgramDeserializer().deserialize(serialized, weights, constants, b"")


@_private("torch.ao.quantization.fx._decomposed",
          "PT2E quantization's quantize/dequantize operators (torch.ops.quantized_decomposed.*) are registered when "
          "this module is imported; a .pt2 saved from convert_pt2e's output calls them",
          "none: importing torchao registers them too, but the converter does not depend on torchao")
def register_quantized_decomposed_ops() -> None:
    """Register ``torch.ops.quantized_decomposed.*`` (a no-op once registered)."""
    import torch.ao.quantization.fx._decomposed  # noqa: F401


# --- pytree --------------------------------------------------------------------------------------

_PYTREE_PUBLIC = ("none in torch 2.13/2.14 (torch.export.pytree is the same private module; there is no "
                  "torch.utils.pytree)")


@functools.cache
def _pytree():
    import torch.utils._pytree as pytree

    return pytree


@_private("torch.utils._pytree.tree_leaves", "the tensors inside nested args, kwargs and outputs", _PYTREE_PUBLIC)
def tree_leaves(tree) -> list:
    """The leaves of ``tree`` in torch's flattening order."""
    return _pytree().tree_leaves(tree)


@_private("torch.utils._pytree.tree_flatten",
          "flatten call arguments the way torch.export recorded the program's in_spec", _PYTREE_PUBLIC)
def tree_flatten(tree):
    """(leaves, TreeSpec) of ``tree``."""
    return _pytree().tree_flatten(tree)


@_private("torch.utils._pytree.tree_unflatten", "rebuild the model's output structure from flat results",
          _PYTREE_PUBLIC)
def tree_unflatten(leaves, spec):
    """The tree ``spec`` describes, with ``leaves`` in it."""
    return _pytree().tree_unflatten(leaves, spec)


@_private("torch.utils._pytree.tree_map", "apply a function to every leaf of nested op arguments",
          _PYTREE_PUBLIC)
def tree_map(fn, tree):
    """``tree`` with every leaf replaced by ``fn(leaf)``."""
    return _pytree().tree_map(fn, tree)


@_private("torch.utils._pytree.tree_flatten_with_path", "name each output leaf by its path (key or index)",
          _PYTREE_PUBLIC)
def tree_flatten_with_path(tree):
    """([(key path, leaf)], TreeSpec) of ``tree``."""
    return _pytree().tree_flatten_with_path(tree)


@_private("torch.utils._pytree.treespec_dumps",
          "store a signature's input/output TreeSpec in a .tflite's metadata as JSON (never code)", _PYTREE_PUBLIC)
def treespec_dumps(spec) -> str:
    """A TreeSpec as JSON text."""
    return _pytree().treespec_dumps(spec)


@_private("torch.utils._pytree.treespec_loads", "read a TreeSpec stored by treespec_dumps back", _PYTREE_PUBLIC)
def treespec_loads(text: str):
    """The TreeSpec of JSON text written by ``treespec_dumps``."""
    return _pytree().treespec_loads(text)


# --- nn.Module internals -------------------------------------------------------------------------


@_private("Module._parameters / Module._buffers (writing)",
          "swap a parameter or buffer for a view of loaded weights and back, changing nothing else",
          "setattr / register_parameter / register_buffer, which also run registration hooks and checks and "
          "reset a buffer's persistent flag")
def set_module_tensor(module, attr: str, tensor, is_param: bool) -> None:
    """Put ``tensor`` in ``module``'s own parameter (``is_param``) or buffer table under ``attr``."""
    (module._parameters if is_param else module._buffers)[attr] = tensor


@_private("Module._parameters / Module._buffers (membership)",
          "tell whether a name is already a module's own parameter or buffer, a slot registered as None "
          "included",
          "name in dict(module.named_parameters(recurse=False)), which skips slots registered as None")
def module_owns_tensor(module, name: str) -> bool:
    """Whether ``name`` is a parameter or buffer slot of ``module`` itself."""
    return name in module._parameters or name in module._buffers


@_private("Module._modules",
          "a module's own child table, slots registered as None included, to walk and extend it by name",
          "dict(module.named_children()), which skips None slots and repeated children")
def module_children(module) -> dict:
    """``module``'s own child-module table (the live dict: name -> module or None)."""
    return module._modules


@_private("Module._modules (replacing)",
          "a shallow copy of a module shares its child table; an eval-mode copy of the tree needs its own",
          "none (copy.copy shares the table; copy.deepcopy copies the parameters too)")
def replace_module_children(module, children: dict) -> None:
    """Give ``module`` the child-module table ``children`` (name -> module or None)."""
    module.__dict__["_modules"] = children
