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
symbolic shapes) raises ``NeedsFullRetrace``, and the caller falls back to run_decompositions.
"""

from __future__ import annotations

import operator

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from .decompositions import splice_subgraph

__all__ = ["NeedsFullRetrace", "decompose_in_place"]


class NeedsFullRetrace(Exception):
    """The graph has something this pass does not prove safe; use run_decompositions."""


aten = torch.ops.aten
_CIA = torch._C.DispatchKey.CompositeImplicitAutograd
# Shape/metadata checks that torch.export's own decomposition drops as well.
_DROP = {aten._assert_tensor_metadata.default}
_DROPOUT = {aten.dropout.default, aten.dropout_.default, aten.feature_dropout.default, aten.feature_dropout_.default,
            aten.alpha_dropout.default, aten.alpha_dropout_.default}


# batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps, cudnn_enabled)
def _batch_norm(x, weight, bias, mean, var, training, momentum, eps, cudnn_enabled):
    # What run_decompositions yields in eval mode (the traced CIA kernel gives native_batch_norm,
    # which the BatchNorm-folding pass and the backends do not take).
    if training:
        raise NeedsFullRetrace("training-mode batch_norm")
    return aten._native_batch_norm_legit_no_training.default(x, weight, bias, mean, var, momentum, eps)[0]


_OWN = {aten.batch_norm.default: _batch_norm}


def decompose_in_place(ep: torch.export.ExportedProgram, table: dict, keep) -> int:
    """Rewrite ``ep``'s graph to core ATen + ``keep``; returns the number of nodes replaced."""
    gs = ep.graph_signature
    if gs.buffers_to_mutate or gs.user_inputs_to_mutate:
        raise NeedsFullRetrace("the program mutates an input or buffer")
    gm = ep.graph_module
    graph = gm.graph
    for n in graph.nodes:
        v = n.meta.get("val")
        if isinstance(v, torch.SymInt) or (isinstance(v, torch.Tensor) and not all(isinstance(d, int) for d in v.shape)):
            raise NeedsFullRetrace("symbolic or data-dependent shapes")
        if n.op == "get_attr" and isinstance(getattr(gm, n.target, None), torch.fx.GraphModule):
            raise NeedsFullRetrace("higher-order op subgraph")
    cache: dict = {}
    replaced = 0
    fake_mode = torch._guards.detect_fake_mode([n.meta.get("val") for n in graph.nodes if n.op == "placeholder"])
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is operator.getitem:
            continue
        op = node.target
        if not isinstance(op, torch._ops.OpOverload):
            raise NeedsFullRetrace(f"non-ATen call {op}")
        if op in _DROP:
            if node.users:
                raise NeedsFullRetrace(f"{op} has users")
            graph.erase_node(node)
            continue
        if op in _DROPOUT and not node.args[2]:  # eval-mode dropout, in place or not: the identity
            node.replace_all_uses_with(node.args[0])
            graph.erase_node(node)
            continue
        if op._schema.is_mutable:
            node = _functionalize(graph, node)
            op = node.target
        # The same rule as run_decompositions: an op in the table, or a composite op not kept whole.
        if op in keep or not (op in table or op.has_kernel_for_dispatch_key(_CIA)):
            continue
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
    if not isinstance(op, torch._ops.OpOverload):
        return node.target is not operator.getitem
    return any(r.alias_info is not None for r in op._schema.returns)


def _functionalize(graph, node):
    op = node.target
    schema = op._schema
    name = schema.name.split("::")[1]
    args = schema.arguments
    # Only the plain in-place form: `op_(Tensor(a!) self, ...) -> Tensor(a!)`, writing nothing else.
    if (not name.endswith("_") or not args or args[0].alias_info is None or not args[0].alias_info.is_write
            or any(a.alias_info is not None and a.alias_info.is_write for a in args[1:])):
        raise NeedsFullRetrace(f"mutating op {op}")
    packet = getattr(torch.ops.aten, name[:-1], None)
    functional = getattr(packet, op._overloadname, None) if packet is not None else None
    if functional is None or functional._schema.is_mutable:
        raise NeedsFullRetrace(f"no functional form of {op}")
    target = node.args[0]
    if not isinstance(target, torch.fx.Node) or _aliases(target):
        raise NeedsFullRetrace(f"{op} writes a graph input or a view")
    if any(u is not node and u.op == "call_function" and _aliases(u) for u in target.users):
        raise NeedsFullRetrace(f"{op} writes a tensor that a view shares")
    later = set()
    n = node.next
    while n.op != "root":
        later.add(n)
        n = n.next
    with graph.inserting_before(node):
        new = graph.call_function(functional, node.args, node.kwargs)
    new.meta = dict(node.meta)
    for u in list(target.users):
        if u in later:
            u.replace_input_with(target, new)
    node.replace_all_uses_with(new)
    graph.erase_node(node)
    return new


def _meta_key(x):
    if isinstance(x, torch.fx.Node):
        v = x.meta.get("val")
        if isinstance(v, torch.Tensor):
            return ("T", tuple(v.shape), v.dtype, tuple(v.stride()))
        return ("N", repr(v))
    if isinstance(x, (list, tuple)):
        return (type(x).__name__,) + tuple(_meta_key(y) for y in x)
    return ("V", type(x).__name__, repr(x))


def _replace_with_decomposition(gm, node, table, cache, fake_mode):
    op = node.target
    flat, spec = torch.utils._pytree.tree_flatten((node.args, node.kwargs))
    pos = [i for i, a in enumerate(flat) if isinstance(a, torch.fx.Node)]
    key = (op, _meta_key(flat))
    sub = cache.get(key)
    if sub is None:
        fn = _OWN.get(op) or table.get(op) or op.decompose
        fakes = [flat[i].meta.get("val") for i in pos]
        if not all(isinstance(f, torch.Tensor) for f in fakes):
            raise NeedsFullRetrace(f"{op} takes a non-tensor node")

        def run(*vals):
            leaves = list(flat)
            for i, v in zip(pos, vals):
                leaves[i] = v
            a, k = torch.utils._pytree.tree_unflatten(leaves, spec)
            return fn(*a, **k)

        try:
            with fake_mode:
                sub = make_fx(run, decomposition_table=table, tracing_mode="real")(*fakes)
        except Exception as e:  # noqa: BLE001
            raise NeedsFullRetrace(f"{op}: {type(e).__name__}: {e}") from e
        for n in list(sub.graph.nodes):
            if n.op == "get_attr":
                raise NeedsFullRetrace(f"the decomposition of {op} holds a constant")
            if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload) and n.target._schema.is_mutable:
                _functionalize(sub.graph, n)  # e.g. adaptive_avg_pool2d restrides its fresh output in place
        cache[key] = sub
    outs = next(n for n in sub.graph.nodes if n.op == "output").args[0]
    if isinstance(outs, (list, tuple)) and any(u.target is not operator.getitem for u in node.users):
        raise NeedsFullRetrace(f"{op}: a multi-output op used whole")
    splice_subgraph(gm, node, sub, [flat[i] for i in pos])
