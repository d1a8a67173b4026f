"""Stable tensor names: '<module path>/<op>' (e.g. 'layer1.0.conv1/convolution').

Names come from where the op sits in the user's module tree, not from the order the tracer
happened to visit nodes, so a small model edit renames few tensors. Stored in
node.meta['tensor_name']; backends use them for intermediate tensors in their artifacts.
"""

from __future__ import annotations

from ..program import Program


def name_tensors(prog: Program) -> None:
    for sig in prog.signatures.values():
        used: dict[str, int] = {}
        for n in sig.graph.nodes:
            if n.op == "placeholder":
                base = n.meta.get("weight_name", n.name)
            elif n.op == "call_function":
                stack = n.meta.get("nn_module_stack") or {}
                path = list(stack.values())[-1][0] if stack else ""
                op = getattr(n.target, "__name__", str(n.target)).split(".")[0]
                base = f"{path}/{op}" if path else op
            else:
                continue
            k = used.get(base, 0)
            used[base] = k + 1
            n.meta["tensor_name"] = base if k == 0 else f"{base}_{k}"
