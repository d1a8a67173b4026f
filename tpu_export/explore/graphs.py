"""What Model Explorer is shown for each kind of artifact.

A ``.tflite`` (and a ``.litertlm``, whose TFLite sections Model Explorer's flatbuffer adapter reads) goes as is:
its tensors already carry the captured graph's stable names (``<module path>/<op>``).

A TPU artifact's signature is StableHLO (jax.export). Its text is rewritten before it is shown: the arguments are
named after the torch parameters and inputs they hold (the manifest's ``weight_names`` and input names; jax calls
them ``weights_list[i]`` and ``xs[i]``), and each op's location names what it lowers. From the artifact alone that
is the lowering (``convolution/conv_general_dilated``); given the torch model, the signature is exported again
with every node's value as an extra output (the debug export compare() runs), which ties each StableHLO op to its
torch node: the location then carries the node's ``<module path>/<op>`` name and the user's source line.
Model Explorer's MLIR adapter shows neither argument locations nor file locations, so the graph it builds is
completed here (argument labels, ``torch_node``/``source`` attributes, a ``tensor_name`` on each node's value that
the overlays key on) and handed to it as graph JSON.
"""

from __future__ import annotations

import json
import os
import re

__all__ = ["artifact_kind", "stablehlo_text", "annotate_mlir", "mlir_graphs", "tpu_graph_id"]

_LOC_ALIAS = re.compile(r"^(#loc\d*) = loc\((.*)\)\s*$")
_OP_LINE = re.compile(r"^(\s*)(%[\w.$-]+(?::\d+)?(?:\s*,\s*%[\w.$-]+)*)\s*=\s*(\"?[\w.]+\"?)(.*?)\s*loc\((.*)\)\s*$")
_CLOSE = re.compile(r"^(\s*)\}\)(.*?)\s*loc\((.*)\)\s*$")  # the last line of an op with regions (stablehlo.case)
_ARG = re.compile(r'%arg(\d+): [^%]*?loc\("((?:[^"\\]|\\.)*)"\)')
_RETURN = re.compile(r"^\s*(?:return|func\.return)\s+(.*?)\s*:\s.*loc\(.*\)\s*$")


def artifact_kind(path: str) -> str:
    """"tflite", "litertlm" or "tpu" for a model file we write; ValueError naming the path otherwise."""
    p = os.fspath(path)
    if p.endswith(".tflite"):
        return "tflite"
    if p.endswith(".litertlm"):
        return "litertlm"
    if p.endswith((".tpuexp", ".zip")) or os.path.exists(os.path.join(p, "manifest.json")):
        return "tpu"
    raise ValueError(f"{p!r} is not a .tflite, .litertlm or TPU artifact (.tpuexp folder or .zip)")


def tpu_graph_id(signatures, signature: str) -> str:
    """The graph id of ``signature``'s ``main`` in a TPU artifact's view: ``main`` where the artifact has one
    signature; the signature's name where it has several (each signature is a model of its own in Model
    Explorer, and node data is matched by graph id: one shared ``main`` would put one signature's overlay on
    another's graph)."""
    return "main" if len(signatures) == 1 else signature


def _aliases(text: str) -> dict:
    out = {}
    for line in text.splitlines():
        m = _LOC_ALIAS.match(line)
        if m:
            out[m.group(1)] = m.group(2)
    return out


def _frames(loc: str, aliases: dict, depth: int = 0) -> list:
    """The function names of a location's call stack, innermost first."""
    loc = loc.strip()
    if depth > 200:
        return []
    if loc.startswith("#loc"):
        return _frames(aliases.get(loc, "unknown"), aliases, depth + 1)
    m = re.match(r"^callsite\((#loc\d*) at (#loc\d*)\)$", loc)
    if m:
        return _frames(m.group(1), aliases, depth + 1) + _frames(m.group(2), aliases, depth + 1)
    m = re.match(r'^"([^"]*)"\((#loc\d*)\)$', loc)
    if m:
        name = m.group(1)
        return [name] + _frames(m.group(2), aliases, depth + 1)
    return []


def _lowering_name(loc: str, aliases: dict) -> tuple[str, str]:
    """(the lowering function that emitted an op, jax's primitive name) from the op's location."""
    frames = _frames(loc, aliases)
    prim = next((f.rsplit("/", 1)[-1] for f in frames if f.startswith("jit(")), "")
    for k, f in enumerate(frames):
        if f == "_lower_and_cast" and k > 0:
            return re.sub(r"\.<locals>\..*$", "", frames[k - 1]), prim
    return "", prim


def _q(s: str) -> str:
    return s.replace("\\", "\\\\").replace('"', '\\"')


def stablehlo_text(artifact_path: str, signature: str) -> tuple[str, list, list]:
    """(StableHLO text, weight names, input names) of one signature of a TPU artifact."""
    from tpu_export.tpu_backend.artifact import read_artifact

    art = read_artifact(artifact_path)
    if signature not in art.signatures:
        raise KeyError(f"{artifact_path}: no signature {signature!r}; it has {sorted(art.signatures)}")
    s = art.signatures[signature]
    return s.exported.mlir_module(), list(s.weight_names), [t.name for t in s.inputs]


def annotate_mlir(text: str, weight_names: list, input_names: list, node_of_value: dict | None = None,
                  node_info: dict | None = None) -> tuple[str, dict]:
    """The StableHLO text with torch names in its locations, and {op line index: annotation}.

    Args:
        text: StableHLO text (``Exported.mlir_module()``).
        weight_names: The torch parameter name of each ``weights_list[i]`` argument.
        input_names: The input name of each ``xs[i]`` argument.
        node_of_value: SSA value (``%17``) -> torch tensor name, for the debug export: the op defining a node's
            value and the ops before it (back to the previous node's) belong to that node.
        node_info: torch tensor name -> {"source": (file, line), "node": fx node name, "op": ATen op}.

    Returns:
        (text, {line index: {"namespace", "tensor_name"?, "source"?, "torch_node"?}}).
    """
    aliases = _aliases(text)
    node_of_value = node_of_value or {}
    node_info = node_info or {}

    def arg_name(m):
        kind, i = m.group(1), int(m.group(2))
        names = weight_names if kind.startswith("weights") else input_names
        return f'loc("{_q(names[i])}")' if i < len(names) else m.group(0)

    lines = text.splitlines()
    notes: dict = {}
    pending: list = []
    owner: dict = {}  # line index -> tensor name, for the debug export
    if node_of_value:
        for k, line in enumerate(lines):
            m = _OP_LINE.match(line)
            if _LOC_ALIAS.match(line) or m is None:
                continue
            pending.append(k)
            names = [v.strip().split(":")[0] for v in m.group(2).split(",")]
            hit = next((node_of_value[v] for v in names if v in node_of_value), None)
            if hit is not None:
                for j in pending:
                    owner[j] = hit
                pending = []
    out = []
    for k, line in enumerate(lines):
        line = re.sub(r'loc\("(weights_list|weights|xs|inputs)\[(\d+)\]"\)', arg_name, line)
        m = _OP_LINE.match(line)
        if m is not None and not _LOC_ALIAS.match(line):
            lowering, prim = _lowering_name(m.group(5), aliases)
            prim = prim or m.group(3).strip('"').split(".")[-1]
            tname = owner.get(k)
            info = node_info.get(tname, {}) if tname else {}
            base = tname or lowering or "jax"
            note = {"namespace": f"{base}/{prim}"}
            loc = f'"{_q(note["namespace"])}"'
            if info.get("source"):
                f, ln = info["source"]
                loc += f'("{_q(f)}":{int(ln)}:0)'
                note["source"] = f"{f}:{ln}"
            if info:
                note["torch_node"] = info.get("node", "")
                note["torch_op"] = info.get("op", "")
            defined = [v.strip().split(":")[0] for v in m.group(2).split(",")]
            if tname and any(node_of_value.get(v) == tname for v in defined):
                note["tensor_name"] = tname
            notes[k] = note
            line = line[:m.start(5) - 4] + f"loc({loc})"
        elif m is None:
            c = _CLOSE.match(line)
            if c is not None:
                lowering, prim = _lowering_name(c.group(3), aliases)
                # jax's platform_dependent: one case op whose branches are the TPU and the CPU form
                note = {"namespace": f"{owner.get(k) or lowering or 'platform_dependent'}/{prim or 'case'}"}
                notes[k] = note
                line = line[:c.start(3) - 4] + f'loc("{_q(note["namespace"])}")'
        out.append(line)
    return "\n".join(out) + "\n", notes


def mlir_graphs(mlir_path: str, notes: dict, text: str, weight_names: list, input_names: list,
                label: str) -> dict:
    """Model Explorer's graph JSON of ``mlir_path`` (its MLIR adapter), completed with the torch names."""
    import ai_edge_model_explorer_adapter as adapter

    cols = json.loads(adapter.ConvertMlirToJson(adapter.VisualizeConfig(), mlir_path))
    # Model Explorer names an op by its location's name, made unique by one counter across the graph
    # ("add", "add_0", "max", "max_1"): the same rule finds each op's annotation here.
    by_namespace: dict = {}
    counter = 0
    for k in sorted(notes):
        ns = notes[k]["namespace"]
        if ns in by_namespace:
            ns = f"{ns}_{counter}"
            counter += 1
        by_namespace[ns] = notes[k]
    # argument index -> name, from the annotated signature (a multi-platform export's first argument is jax's
    # platform index, with no name)
    header = next((ln for ln in text.splitlines() if "func.func public @main(" in ln), "")
    arg_names = {int(i): name for i, name in _ARG.findall(header)}
    for col in cols:
        col["label"] = label
        for g in col.get("subgraphs", []):
            for n in g.get("nodes", []):
                nid = str(n.get("id", ""))
                if nid.startswith("arg") and nid[3:].isdigit() and int(nid[3:]) in arg_names:
                    name = arg_names[int(nid[3:])]
                    n["label"] = name
                    n.setdefault("attrs", []).append({"key": "torch_name", "value": name})
                    for o in n.get("outputsMetadata", []):
                        o.setdefault("attrs", []).append({"key": "tensor_name", "value": name})
                    continue
                note = by_namespace.get(n.get("namespace", ""))
                if note is None:
                    continue
                attrs = n.setdefault("attrs", [])
                for key in ("torch_node", "torch_op", "source"):
                    if note.get(key):
                        attrs.append({"key": key, "value": note[key]})
                if note.get("tensor_name"):
                    for o in n.get("outputsMetadata", [])[:1]:
                        o.setdefault("attrs", []).append({"key": "tensor_name", "value": note["tensor_name"]})
    # the server hands graph JSON to the page as GraphCollection(label, graphs) (model_explorer.utils)
    return {"graphCollections": [{"label": c["label"], "graphs": c.get("subgraphs", [])} for c in cols]}


def user_frame(node) -> tuple | None:
    """(file, line) of the user's source line of an fx node (the last frame outside torch), or None."""
    trace = node.meta.get("stack_trace") or ""
    best = None
    for m in re.finditer(r'File "([^"]+)", line (\d+)', trace):
        f = m.group(1)
        if "/torch/" not in f and "\\torch\\" not in f:
            best = (f, int(m.group(2)))
    return best


def debug_mlir(prog, sig) -> tuple[str, dict, list, list]:
    """The debug export of ``sig`` (every node's value an extra output), annotated with its torch nodes.

    Returns:
        (annotated StableHLO text, its op notes, weight names, input names).
    """
    import jax
    from jax import export

    from tpu_export.converter.registry import op_name

    from .layerwise import debug_export

    low, _, nodes, n_out = debug_export(prog, sig)
    ws, ins = low.abstract_args()
    text = export.export(jax.jit(low.fn), platforms=["cpu"])(ws, *ins).mlir_module()
    ret = None
    for line in text.splitlines():
        m = _RETURN.match(line)
        if m and ret is None:
            ret = [v.strip() for v in m.group(1).split(",")]
    outs = list(sig.output_nodes()) + list(nodes)
    node_of_value: dict = {}
    info: dict = {}
    for v, n in zip(ret or [], outs):
        if not hasattr(n, "meta"):
            continue
        tname = n.meta.get("tensor_name", n.name)
        node_of_value.setdefault(v, tname)
        info[tname] = {"source": user_frame(n), "node": n.name, "op": op_name(n.target) if n.op == "call_function"
                       else n.op}
    annotated, notes = annotate_mlir(text, low.weight_names, [s.name for s in sig.inputs], node_of_value, info)
    return annotated, notes, list(low.weight_names), [s.name for s in sig.inputs]
