"""The one decomposition table: core ATen decompositions minus the ops a backend keeps whole.

Decomposition runs once per capture, keeping the union of what the requested backends keep.
A backend that is handed a kept op it does not lower decomposes that op itself with
``decompose_nodes`` — from this same table, so both backends see identical core-ATen math.
"""

from __future__ import annotations

import functools
import logging

import torch

from ._torch_compat import (
    core_aten_decompositions,
    detect_fake_mode,
    skip_graph_codegen,
    trace_with_decompositions,
    tree_flatten,
    tree_unflatten,
)

__all__ = ["KEEP_WHOLE", "decomposition_table", "decompose", "decompose_nodes"]

aten = torch.ops.aten
log = logging.getLogger(__name__)

# Ops worth lowering whole: each maps onto one fused builtin (LiteRT) or a Pallas/XLA pattern
# that the decomposed form would have to be pattern-matched back into.
KEEP_WHOLE: frozenset = frozenset(
    {
        aten.scaled_dot_product_attention.default,
        aten.layer_norm.default,
        aten.group_norm.default,
        aten.rms_norm.default,
        aten.gelu.default,  # core already; listed so a backend must say whether it keeps it
        aten.silu.default,
        aten.hardswish.default,
        aten.hardsigmoid.default,
        aten.upsample_bilinear2d.vec,
        aten.upsample_nearest2d.vec,
        aten.pixel_shuffle.default,
        aten.pixel_unshuffle.default,
        aten.linear.default,
        aten.matmul.default,
        # torch's decomposition unrolls the sequence and, on CPU with mkldnn, writes mkldnn_rnn_layer
        aten.lstm.input,
        aten.rnn_tanh.input,
        aten.rnn_relu.input,
    }
)


def decomposition_table(keep=KEEP_WHOLE) -> dict:
    """torch.export's core-ATen table with the ops in ``keep`` removed (so they stay whole)."""
    table = torch.export.default_decompositions()
    for op in keep:
        if op in table:
            del table[op]
    return table


def decompose(exported: torch.export.ExportedProgram, keep=KEEP_WHOLE, *, in_place: bool = False
              ) -> torch.export.ExportedProgram:
    """Core ATen + ``keep``. ``in_place=True`` (for a program this process just exported and owns)
    rewrites the graph node by node instead of re-tracing it (converter/lean_decompose.py), and
    re-traces only when that pass cannot prove a rewrite safe."""
    if in_place:
        from .lean_decompose import NeedsFullRetrace, decompose_in_place

        try:
            decompose_in_place(exported, _plain_table(frozenset(keep)), frozenset(keep))
            return exported
        except NeedsFullRetrace as why:
            log.debug("node-by-node decomposition declined (%s); re-tracing", why)
            exported.graph_module.recompile()  # every rewrite made so far preserved the program
    return exported.run_decompositions(decomposition_table(keep))


@functools.lru_cache(maxsize=4)
def _plain_table(keep: frozenset) -> dict:
    # The core table without its composite (CIA) entries: both decomposition passes decompose a
    # CIA op through its own kernel (decomposition_of), which is what those entries hold. torch's
    # public table (default_decompositions) enumerates and wraps every CIA op of every namespace on
    # first read: 0.06-0.08 s of a conversion, for entries never looked up. The private builder it
    # starts from is the ATen part alone; if a torch release drops it, the public table still works.
    table = core_aten_decompositions()
    for op in keep:
        table.pop(op, None)
    return table


def decomposition_of(op, table: dict):
    """``op``'s decomposition: its entry in ``table``, or, for a composite op (linear, matmul, the
    CompositeImplicitAutograd ops the core table leaves out), its own kernel."""
    return table.get(op) or op.decompose


def trace_decomposition(node: torch.fx.Node, fn, table: dict, fake_mode=None):
    """``fn`` (a decomposition of ``node``'s op) traced on the node's fake values with ``table``
    for what it calls: (the subgraph, the graph nodes its placeholders stand for, in order)."""
    flat, spec = tree_flatten((node.args, node.kwargs))
    pos = [i for i, a in enumerate(flat) if isinstance(a, torch.fx.Node)]
    fakes = _distinct([flat[i].meta["val"] for i in pos])

    def run(*vals):
        leaves = list(flat)
        for i, v in zip(pos, vals):
            leaves[i] = v
        a, k = tree_unflatten(leaves, spec)
        return fn(*a, **k)

    # the subgraph is only read and spliced, never called: no Python code is generated for it
    # (~1 ms a trace; swin traces 17)
    with fake_mode or detect_fake_mode(fakes), skip_graph_codegen():
        sub = trace_with_decompositions(run, table, *fakes)
    return sub, [flat[i] for i in pos]


def _distinct(fakes: list) -> list:
    """One fake tensor per argument. Two nodes can hold the same fake value (a cached decomposition spliced twice
    copies its nodes' meta into both places: lean_decompose), and the trace takes one tensor passed twice for one
    value: every use then reads the last argument holding it (Mamba-2's einsum of C and B, two same-shaped
    repeat_interleave + reshape results, traced as B against B)."""
    seen, out = set(), []
    for f in fakes:
        if isinstance(f, torch.Tensor) and id(f) in seen:
            with detect_fake_mode([f]):
                f = torch.empty_strided(f.shape, f.stride(), dtype=f.dtype, device=f.device)
        seen.add(id(f))
        out.append(f)
    return out


def decompose_nodes(gm: torch.fx.GraphModule, ops) -> int:
    """Replace every call of an op in ``ops`` by its decomposition, traced on the node's fake
    values and spliced in place. Returns the number of nodes replaced."""
    ops = set(ops)
    count = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in ops:
            continue
        # nothing kept: what the decomposition calls decomposes too, down to core ATen
        table = _plain_table(frozenset())
        sub, inputs = trace_decomposition(node, decomposition_of(node.target, table), table)
        splice_subgraph(gm, node, sub, inputs)
        count += 1
    if count:
        gm.graph.lint()
        gm.recompile()
    return count


def splice_subgraph(gm, node, sub: torch.fx.GraphModule, inputs):
    env = {}
    placeholders = [n for n in sub.graph.nodes if n.op == "placeholder"]
    for ph, arg in zip(placeholders, inputs):
        env[ph] = arg
    result = None
    with gm.graph.inserting_before(node):
        for n in sub.graph.nodes:
            if n.op == "placeholder":
                continue
            if n.op == "output":
                result = torch.fx.node.map_arg(n.args[0], lambda a: env[a])
                continue
            if n.op == "get_attr":
                raise NotImplementedError("decomposition created a constant tensor")
            new = gm.graph.node_copy(n, lambda a: env[a])
            # errors must point at the user's line, not at torch's decomposition code
            new.meta["stack_trace"] = node.meta.get("stack_trace")
            new.meta["nn_module_stack"] = node.meta.get("nn_module_stack", {})
            env[n] = new
    if isinstance(result, (list, tuple)):
        for user in list(node.users):
            # multi-output op: users are getitem nodes
            idx = user.args[1]
            user.replace_all_uses_with(result[idx])
            gm.graph.erase_node(user)
    else:
        node.replace_all_uses_with(result)
    gm.graph.erase_node(node)
