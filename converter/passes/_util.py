"""Small helpers the shared passes use to edit a Signature's graph."""

from __future__ import annotations

import torch

from .._torch_compat import detect_fake_mode, new_fake_mode
from ..program import Program, Signature


def fake_mode_of(sig: Signature):
    vals = [n.meta["val"] for n in sig.graph.nodes if n.op == "placeholder" and "val" in n.meta]
    mode = detect_fake_mode(vals)
    return new_fake_mode() if mode is None else mode


def add_weight(prog: Program, sig: Signature, name: str, tensor: torch.Tensor) -> torch.fx.Node:
    """Add ``tensor`` to the program's weights under a fresh name and a placeholder for it in
    ``sig`` (placed after the other weights, before the user inputs)."""
    base, i = name, 1
    while name in prog.weights:
        i += 1
        name = f"{base}_{i}"
    prog.weights[name] = tensor
    mode = fake_mode_of(sig)
    first_input = next((n for n in sig.graph.nodes if n.op == "placeholder" and "weight_name" not in n.meta), None)
    anchor = first_input or next(n for n in sig.graph.nodes if n.op != "placeholder")
    with sig.graph.inserting_before(anchor):
        node = sig.graph.placeholder(_safe_name(name))
    node.meta["val"] = mode.from_tensor(tensor, static_shapes=True)
    node.meta["weight_name"] = name
    return node


def _safe_name(name: str) -> str:
    return "w_" + "".join(c if c.isalnum() else "_" for c in name)


def sync_weights(prog: Program, sig: Signature, *, recompile: bool = True) -> None:
    """Drop weight placeholders nobody reads; refresh ``weight_names`` from the graph.
    ``recompile=False`` leaves regenerating the module's Python code to the caller (passes work
    on the graph; run_shared_passes recompiles once at the end)."""
    for n in list(sig.graph.nodes):
        if n.op == "placeholder" and "weight_name" in n.meta and not n.users:
            sig.graph.erase_node(n)
    sig.weight_names = [n.meta["weight_name"] for n in sig.weight_nodes()]
    if recompile:
        sig.graph_module.recompile()


def drop_unused_weights(prog: Program) -> None:
    used = {w for s in prog.signatures.values() for w in s.weight_names}
    for k in [k for k in prog.weights if k not in used]:
        del prog.weights[k]


def weight_of(prog: Program, node) -> torch.Tensor | None:
    if isinstance(node, torch.fx.Node) and node.op == "placeholder" and "weight_name" in node.meta:
        return prog.weights[node.meta["weight_name"]]
    return None


def downstream_nodes(graph, starts) -> list:
    """The nodes reading ``starts`` directly or through others, in graph order (``starts`` included)."""
    seen, out = set(starts), []
    for n in graph.nodes:
        if n in seen or any(a in seen for a in n.all_input_nodes):
            seen.add(n)
            out.append(n)
    return out


def recompute_values(graph, mode, starts, wait=lambda n: False, *, include_starts: bool = False) -> None:
    """Recompute ``meta["val"]`` of the call_function nodes after ``starts`` (and of ``starts`` too with
    ``include_starts``) from their inputs' (a rewrite made a size static that torch had written as a symbol).
    A node ``wait`` holds, and what reads it, keep theirs."""
    waiting, skip = set(), set() if include_starts else set(starts)
    for n in downstream_nodes(graph, starts):
        if n in skip or n.op != "call_function":
            continue
        if wait(n) or any(a in waiting for a in n.all_input_nodes):
            waiting.add(n)
            continue
        vals = torch.fx.node.map_arg((n.args, n.kwargs), lambda a: a.meta["val"])
        with mode:
            n.meta["val"] = n.target(*vals[0], **vals[1])


_SOURCE_META = ("stack_trace", "nn_module_stack", "source_fn_stack")


def node_maker(graph, mode, like):
    """``call(target, *args, **kwargs)``: a new call_function node in ``graph`` (at its insertion point) with its
    fake value computed under ``mode``, carrying ``like``'s source line and module path, so that an error about a
    rewritten node still names the user's line."""

    def call(target, *args, **kwargs):
        node = graph.call_function(target, args, kwargs)
        vals = torch.fx.node.map_arg((args, kwargs), lambda a: a.meta["val"])
        with mode:
            node.meta["val"] = target(*vals[0], **vals[1])
        for k in _SOURCE_META:
            if k in like.meta:
                node.meta[k] = like.meta[k]
        return node

    return call
