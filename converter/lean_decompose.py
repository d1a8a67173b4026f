"""Decompose a freshly exported graph to core ATen node by node, without re-tracing the program.

``ExportedProgram.run_decompositions`` re-traces the whole program (functionalization plus fake
tensor dispatch of every node): a second export that costs as much as the first. Most nodes of
an exported inference graph are core ATen already, so this pass visits the graph once and:

- keeps core-ATen ops and the ops the backends keep whole;
- turns an in-place op (``relu_``, ``add_``, ...) into its functional form when that is provably
  the same program: it writes a tensor that no view shares and that is not a graph input;
- replaces every other op by its decomposition from the one table, traced on the node's own
  fake values (traces are cached by op and argument metadata: repeated blocks trace once).

Anything outside that (a mutated input or buffer, an in-place op on a view, a higher-order op,
data-dependent shapes) raises ``NeedsFullRetrace``, and the caller falls back to run_decompositions.
"""

from __future__ import annotations

import operator

import torch

from ._torch_compat import detect_fake_mode, free_unbacked_symbols, is_op_overload, op_schema, tree_leaves
from .decompositions import decomposition_of, splice_subgraph, trace_decomposition
from .registry import LoweringError, arguments

__all__ = ["NeedsFullRetrace", "decompose_in_place"]


class NeedsFullRetrace(Exception):
    """The graph has something this pass does not prove safe; use run_decompositions."""


aten = torch.ops.aten
# Python-level calls an exported graph may hold besides ATen ops: tuple indexing and the
# arithmetic on symbolic sizes of a dynamic-shape export.
_SYMBOLIC_ARITHMETIC = {operator.getitem, operator.add, operator.sub, operator.mul, operator.floordiv,
                        operator.truediv, operator.mod, operator.neg, operator.eq, operator.ne, operator.lt,
                        operator.le, operator.gt, operator.ge, torch.sym_max, torch.sym_min, torch.sym_not,
                        torch.sym_float, torch.sym_int, torch.sym_sqrt}
_CIA = torch.DispatchKey.CompositeImplicitAutograd
# Shape/metadata checks that torch.export's own decomposition drops as well.
_DROP = {aten._assert_tensor_metadata.default}
_DROPOUT = {aten.dropout.default, aten.dropout_.default, aten.feature_dropout.default, aten.feature_dropout_.default,
            aten.alpha_dropout.default, aten.alpha_dropout_.default}


# Direct rewrites of the ops that make up most decomposed nodes, into exactly what their decomposition
# traces to, without tracing (a make_fx per distinct shape costs ~3 ms, the first one in a process
# ~80 ms; a ResNet has dozens). Each returns the node that replaces ``node``, or None to trace it.

# batch_norm(Tensor input, Tensor? weight, Tensor? bias, Tensor? running_mean, Tensor? running_var,
#     bool training, float momentum, float eps, bool cudnn_enabled) -> Tensor
def _batch_norm(graph, node, fake_mode):
    a = _bound(node)
    if a["training"]:
        raise NeedsFullRetrace("training-mode batch_norm")
    if a["running_mean"] is None or a["running_var"] is None:
        return None
    args = (a["input"], a["weight"], a["bias"], a["running_mean"], a["running_var"], a["momentum"], a["eps"])
    op = aten._native_batch_norm_legit_no_training.default
    with fake_mode:
        vals = op(*[x.meta["val"] if isinstance(x, torch.fx.Node) else x for x in args])
    bn = _insert(graph, node, op, args, vals)
    return _insert(graph, node, operator.getitem, (bn, 0), node.meta["val"])


# conv{1,2,3}d(Tensor input, Tensor weight, Tensor? bias=None, SymInt[] stride=1, SymInt[] padding=0,
#     SymInt[] dilation=1, SymInt groups=1) -> Tensor
def _conv(graph, node, fake_mode):
    a = _bound(node)
    nd = a["weight"].meta["val"].ndim - 2
    if a["input"].meta["val"].ndim != nd + 2:
        return None  # unbatched input: its decomposition adds the batch dim

    def full(v):
        v = [v] if isinstance(v, int) else list(v)
        return v * nd if len(v) == 1 else v

    args = (a["input"], a["weight"], a["bias"], full(a["stride"]), full(a["padding"]), full(a["dilation"]), False,
            [0] * nd, a["groups"])
    return _insert(graph, node, aten.convolution.default, args, node.meta["val"])


# transpose.int(Tensor(a) self, int dim0, int dim1) -> Tensor(a)
def _transpose(graph, node, fake_mode):
    a = _bound(node)
    perm = list(range(a["self"].meta["val"].ndim))
    d0, d1 = (d % len(perm) if perm else 0 for d in (a["dim0"], a["dim1"]))
    perm[d0], perm[d1] = perm[d1], perm[d0]
    return _insert(graph, node, aten.permute.default, (a["self"], perm), node.meta["val"])


# softmax.int(Tensor self, int dim, ScalarType? dtype=None) -> Tensor
def _softmax(graph, node, fake_mode):
    a = _bound(node)
    if a["dtype"] is not None:
        return None
    return _insert(graph, node, aten._softmax.default, (a["self"], a["dim"], False), node.meta["val"])


# flatten.using_ints(Tensor(a) self, int start_dim=0, int end_dim=-1) -> Tensor(a)
def _flatten(graph, node, fake_mode):
    x = _bound(node)["self"]
    shape = list(node.meta["val"].shape)
    if not x.meta["val"].is_contiguous() or not all(isinstance(d, int) for d in shape):
        return None  # a symbolic size must come from a graph node: let the decomposition trace it
    return _insert(graph, node, aten.view.default, (x, shape), node.meta["val"])


# to.dtype(Tensor(a) self, ScalarType dtype, bool non_blocking=False, bool copy=False,
#     MemoryFormat? memory_format=None) -> Tensor(a)
def _to_dtype(graph, node, fake_mode):
    a = _bound(node)
    if a["non_blocking"] or a["memory_format"] is not None:
        return None
    if a["self"].meta["val"].dtype == a["dtype"] and not a["copy"]:
        return a["self"]  # no conversion: the same tensor
    return _insert(graph, node, aten._to_copy.default, (a["self"],), node.meta["val"], {"dtype": a["dtype"]})


# contiguous(Tensor(a) self, *, MemoryFormat memory_format=contiguous_format) -> Tensor(a)
def _contiguous(graph, node, fake_mode):
    if _bound(node)["memory_format"] != torch.contiguous_format:
        return None
    return _insert(graph, node, aten.clone.default, (node.args[0],), node.meta["val"],
                   {"memory_format": torch.contiguous_format})


# max_pool2d(Tensor self, int[2] kernel_size, int[2] stride=[], int[2] padding=0, int[2] dilation=1,
#     bool ceil_mode=False) -> Tensor
def _max_pool2d(graph, node, fake_mode):
    if node.kwargs:
        return None
    op = aten.max_pool2d_with_indices.default
    with fake_mode:
        vals = op(node.args[0].meta["val"], *node.args[1:])
    pool = _insert(graph, node, op, node.args, vals)
    return _insert(graph, node, operator.getitem, (pool, 0), node.meta["val"])


_DIRECT = {aten.batch_norm.default: _batch_norm, aten.conv1d.default: _conv, aten.conv2d.default: _conv,
           aten.conv3d.default: _conv, aten.transpose.int: _transpose, aten.softmax.int: _softmax,
           aten.flatten.using_ints: _flatten, aten.to.dtype: _to_dtype, aten.contiguous.default: _contiguous,
           aten.max_pool2d.default: _max_pool2d}


def _bound(node) -> dict:
    """The op's arguments by schema name, defaults filled in (the lowering contract's binder)."""
    try:
        return arguments(node)
    except LoweringError as e:
        raise NeedsFullRetrace(str(e)) from e


def _insert(graph, node, target, args, val, kwargs=None):
    with graph.inserting_before(node):
        new = graph.call_function(target, tuple(args), kwargs)
    new.meta = {**node.meta, "val": val}  # the user's source line and module stack stay
    return new


def decompose_in_place(ep: torch.export.ExportedProgram, table: dict, keep) -> int:
    """Rewrite ``ep``'s graph to core ATen + ``keep``; returns the number of nodes replaced."""
    gs = ep.graph_signature
    if gs.buffers_to_mutate or gs.user_inputs_to_mutate:
        raise NeedsFullRetrace("the program mutates an input or buffer")
    gm = ep.graph_module
    graph = gm.graph
    for n in graph.nodes:
        if free_unbacked_symbols(n.meta.get("val")):
            raise NeedsFullRetrace("data-dependent shapes")
        if n.op == "get_attr" and isinstance(getattr(gm, n.target, None), torch.fx.GraphModule):
            raise NeedsFullRetrace("higher-order op subgraph")
    cache: dict = {}
    replaced = 0
    fake_mode = detect_fake_mode([n.meta.get("val") for n in graph.nodes if n.op == "placeholder"])
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target in _SYMBOLIC_ARITHMETIC:
            continue
        op = node.target
        if not is_op_overload(op):
            raise NeedsFullRetrace(f"non-ATen call {op}")
        if op in _DROP:
            if node.users:
                raise NeedsFullRetrace(f"{op} has users")
            graph.erase_node(node)
            continue
        if op in _DROPOUT and not _bound(node)["train"]:  # eval-mode dropout, in place or not: the identity
            node.replace_all_uses_with(node.args[0])
            graph.erase_node(node)
            continue
        if op_schema(op).is_mutable:
            node = _functionalize(graph, node)
            op = node.target
        # The same rule as run_decompositions: an op in the table, or a composite op not kept whole.
        if op in keep or not (op in table or op.has_kernel_for_dispatch_key(_CIA)):
            continue
        rule = _DIRECT.get(op)
        new = rule(graph, node, fake_mode) if rule is not None else None
        if new is not None:
            node.replace_all_uses_with(new)
            graph.erase_node(node)
        else:
            _replace_with_decomposition(gm, node, table, cache, fake_mode)
        replaced += 1
    graph.eliminate_dead_code()
    graph.lint()
    gm.recompile()
    return replaced


def _aliases(node) -> bool:
    """Whether ``node``'s output may share memory with an input (a view op, or not an op at all)."""
    if node.op != "call_function":
        return True  # a graph input (writing it would be a mutation) or anything unusual
    op = node.target
    if not is_op_overload(op):
        return node.target is not operator.getitem
    return any(r.alias_info is not None for r in op_schema(op).returns)


def _functionalize(graph, node):
    op = node.target
    schema = op_schema(op)
    name = schema.name.split("::")[1]
    args = schema.arguments
    # Only the plain in-place form: `op_(Tensor(a!) self, ...) -> Tensor(a!)`, writing nothing else.
    if (not name.endswith("_") or not args or args[0].alias_info is None or not args[0].alias_info.is_write
            or any(a.alias_info is not None and a.alias_info.is_write for a in args[1:])):
        raise NeedsFullRetrace(f"mutating op {op}")
    packet = getattr(torch.ops.aten, name[:-1], None)
    functional = getattr(packet, schema.overload_name or "default", None) if packet is not None else None
    if functional is None or op_schema(functional).is_mutable:
        raise NeedsFullRetrace(f"no functional form of {op}")
    target = node.args[0]
    if not isinstance(target, torch.fx.Node) or _aliases(target):
        raise NeedsFullRetrace(f"{op} writes a graph input or a view")
    if any(u is not node and u.op == "call_function" and _aliases(u) for u in target.users):
        raise NeedsFullRetrace(f"{op} writes a tensor that a view shares")
    later = [u for u in target.users if u > node]  # fx nodes compare by graph position
    with graph.inserting_before(node):
        new = graph.call_function(functional, node.args, node.kwargs)
    new.meta = dict(node.meta)
    for u in later:
        u.replace_input_with(target, new)
    node.replace_all_uses_with(new)
    graph.erase_node(node)
    return new


def _meta_key(x):
    if isinstance(x, torch.fx.Node):
        v = x.meta.get("val")
        if isinstance(v, torch.Tensor):
            return ("T", tuple(map(str, v.shape)), v.dtype, tuple(map(str, v.stride())))  # symbolic sizes too
        return ("N", repr(v))
    if isinstance(x, (list, tuple)):
        return (type(x).__name__,) + tuple(_meta_key(y) for y in x)
    if isinstance(x, dict):
        return ("dict",) + tuple((k, _meta_key(v)) for k, v in x.items())
    return ("V", type(x).__name__, repr(x))


def _replace_with_decomposition(gm, node, table, cache, fake_mode):
    op = node.target
    key = (op, _meta_key((node.args, node.kwargs)))
    sub = cache.get(key)
    if sub is not None:  # same op on same-looking arguments: the trace's placeholders take this node's inputs
        inputs = [a for a in tree_leaves((node.args, node.kwargs)) if isinstance(a, torch.fx.Node)]
    else:
        if not all(isinstance(n.meta.get("val"), (torch.Tensor, torch.SymInt)) for n in node.all_input_nodes):
            raise NeedsFullRetrace(f"{op} takes a non-tensor node")  # SymInt: a dynamic size
        try:
            sub, inputs = trace_decomposition(node, decomposition_of(op, table), table, fake_mode)
        except Exception as e:  # noqa: BLE001
            raise NeedsFullRetrace(f"{op}: {type(e).__name__}: {e}") from e
        for n in list(sub.graph.nodes):
            if n.op == "get_attr":
                raise NeedsFullRetrace(f"the decomposition of {op} holds a constant")
            if n.op == "call_function" and is_op_overload(n.target) and op_schema(n.target).is_mutable:
                _functionalize(sub.graph, n)  # e.g. adaptive_avg_pool2d restrides its fresh output in place
        cache[key] = sub
    outs = next(n for n in sub.graph.nodes if n.op == "output").args[0]
    if isinstance(outs, (list, tuple)) and any(u.target is not operator.getitem for u in node.users):
        raise NeedsFullRetrace(f"{op}: a multi-output op used whole")
    splice_subgraph(gm, node, sub, inputs)
