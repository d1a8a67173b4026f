"""Overlays: Model Explorer node data (one JSON file per overlay) written beside the artifact.

Each file is Model Explorer's model node data: ``{graph id: {"results": {key: {"value": ..., "bgColor": ...}}}}``,
keyed by a node's output tensor name (a .tflite tensor name, the captured graph's ``<module path>/<op>``), which
Model Explorer matches against each node's ``tensor_name``. Written without Model Explorer installed: the format
is plain JSON.

- ``runs_on.<delegate>``: where each op runs. ``cpu``: XNNPACK or LiteRT's builtin kernel, as this machine's
  interpreter partitions the model; ``gpu``, ``coreml``, ``metal``, ``tflm``: the delegate takes the op, or the
  reason it does not (targets/compat's tables, read from the runtimes' own code).
- ``latency``: each op's time on this CPU, in microseconds per run of its signature, from LiteRT's op profiler
  (litert_profile.py): the model compiled with LiteRT's builtin CPU kernels, one thread, every profiler event tied to
  the op index it names. Where the profiler cannot run (or its events do not map onto the model's ops), the op alone
  in a one-op model, run by the LiteRT interpreter on its real input values (median of repeated runs); the
  overlay's name says which source it holds.
- ``numeric``: each node's max relative error against torch eager (written by compare()).
- ``xla_cost.flops``, ``xla_cost.bytes``, ``xla_cost.time``: a TPU artifact's ops, each compiled alone by XLA for
  the artifact's target: flops, bytes accessed, XLA's estimated time (TPU only), keyed by Model Explorer's node ids
  of the view (xla_cost.py).
"""

from __future__ import annotations

import json
import os
import statistics
import time

import numpy as np

__all__ = ["overlay_path", "overlay_paths", "write_overlays", "numeric_overlay", "DELEGATES", "OVERLAYS",
           "TFLITE_OVERLAYS", "TPU_OVERLAYS"]

DELEGATES = ("cpu", "gpu", "coreml", "metal", "tflm")
TFLITE_OVERLAYS = tuple(f"runs_on.{d}" for d in DELEGATES) + ("latency",)
TPU_OVERLAYS = ("xla_cost.flops", "xla_cost.bytes", "xla_cost.time")
OVERLAYS = TFLITE_OVERLAYS + ("numeric",) + TPU_OVERLAYS
_GOOD, _BAD, _MID = "#a5d6a7", "#ef9a9a", "#fff59d"


def _stem(artifact: str) -> tuple[str, str]:
    p = os.path.abspath(os.fspath(artifact)).rstrip(os.sep)
    base = os.path.basename(p)
    for ext in (".tflite", ".litertlm", ".tpuexp", ".zip"):
        if base.endswith(ext):
            base = base[: -len(ext)]
            break
    return os.path.dirname(p), base


def overlay_path(artifact: str, name: str) -> str:
    """Where overlay ``name`` of ``artifact`` lives: ``<folder>/<stem>.overlay.<name>.json``."""
    folder, stem = _stem(artifact)
    return os.path.join(folder, f"{stem}.overlay.{name}.json")


def overlay_paths(artifact: str) -> dict:
    """Every overlay written beside ``artifact``: name -> path."""
    folder, stem = _stem(artifact)
    pre = f"{stem}.overlay."
    out = {}
    if os.path.isdir(folder):
        for f in sorted(os.listdir(folder)):
            if f.startswith(pre) and f.endswith(".json"):
                out[f[len(pre):-len(".json")]] = os.path.join(folder, f)
    return out


def _write(path: str, data: dict) -> str:
    from tpu_export.converter.atomic import write_file

    write_file(path, json.dumps(data, indent=1).encode())
    return path


def _subgraph_ids(tflite: bytes) -> dict:
    """subgraph index -> the graph id Model Explorer gives it (the subgraph's name, else its signature key)."""
    from ai_edge_litert import schema_py_generated as s

    m = s.Model.GetRootAs(tflite, 0)
    ids = {}
    for i in range(m.SignatureDefsLength()):
        sd = m.SignatureDefs(i)
        ids.setdefault(sd.SubgraphIndex(), (sd.SignatureKey() or b"").decode())
    for g in range(m.SubgraphsLength()):
        name = (m.Subgraphs(g).Name() or b"").decode()
        if name:
            ids[g] = name
        ids.setdefault(g, f"subgraph_{g}")
    return ids


def _xnnpack_ops(path: str) -> dict:
    """subgraph 0's op index -> True where this machine's interpreter hands it to XNNPACK.

    A DELEGATE node replaces a partition of the original nodes: the ops between its inputs and its outputs
    (walking back from the outputs, stopping at the inputs)."""
    from ai_edge_litert.interpreter import Interpreter

    interp = Interpreter(model_path=path)
    interp.allocate_tensors()
    w = interp._interpreter  # noqa: SLF001 - the node table has no public getter
    names = [w.NodeName(k) for k in range(w.NumNodes())]
    producer = {}
    originals = [k for k, n in enumerate(names) if n != "DELEGATE"]
    for k in originals:
        for t in w.NodeOutputs(k):
            producer[int(t)] = k
    taken = set()
    for k, n in enumerate(names):
        if n != "DELEGATE":
            continue
        stop = {int(t) for t in w.NodeInputs(k)}
        todo = [int(t) for t in w.NodeOutputs(k)]
        seen = set()
        while todo:
            t = todo.pop()
            if t in seen or t in stop or t not in producer:
                continue
            seen.add(t)
            op = producer[t]
            if op not in taken:
                taken.add(op)
                todo.extend(int(x) for x in w.NodeInputs(op) if int(x) >= 0)
    return {k: k in taken for k in originals}


def read_tflite(path) -> bytes:
    """A .tflite's bytes, opened as a regular file (no FIFO, device or symlink), read up to its size."""
    from tpu_export.converter.untrusted import open_regular

    fd, _ = open_regular(os.fspath(path), what="the .tflite")
    with os.fdopen(fd, "rb") as f:
        return f.read()


def _key(op) -> str | None:
    outs = [t for t in op.outputs if t is not None and t.name]
    return outs[0].name if outs else None


def runs_on(tflite_path: str) -> dict:
    """{overlay name: node data} for every delegate (see the module docstring)."""
    from tpu_export.targets.compat import delegates
    from tpu_export.targets.compat.model_ops import read_ops

    data = read_tflite(tflite_path)
    ids = _subgraph_ids(data)
    ops = read_ops(data)
    xnn = _xnnpack_ops(tflite_path)
    out = {}
    for d in DELEGATES:
        dl = delegates()[d]
        graphs: dict = {}
        for op in ops:
            key = _key(op)
            if key is None or op.fp16_weights:
                continue
            res = graphs.setdefault(ids[op.subgraph], {"name": f"runs on: {d}", "results": {}})["results"]
            if d == "cpu":
                on = xnn.get(op.index, False) if op.subgraph == 0 else False
                res[key] = {"value": "XNNPACK" if on else "builtin kernel", "bgColor": _GOOD if on else _MID}
                continue
            reason = dl.reason(op)
            if reason is None:
                res[key] = {"value": dl.accelerator, "bgColor": _GOOD}
            else:
                res[key] = {"value": f"{dl.fallback}: {reason}", "bgColor": _BAD}
        out[f"runs_on.{d}"] = graphs
    return out


def _pack(model) -> bytes:
    import flatbuffers

    b = flatbuffers.Builder(1024)
    b.Finish(model.Pack(b), file_identifier=b"TFL3")
    return bytes(b.Output())


_GRADIENT = [{"stop": 0, "bgColor": "#ffffff"}, {"stop": 1, "bgColor": "#ef5350"}]
PROFILER_SOURCE = "LiteRT op profiler, builtin kernels"
OP_ALONE_SOURCE = "op alone"


def latency(tflite_path: str, inputs: dict | None = None, repeats: int = 20) -> dict:
    """Each op's time on this CPU: {"latency": node data} (microseconds), from LiteRT's op profiler, else op alone.

    Args:
        tflite_path: The .tflite.
        inputs: Signature input name -> array (default: seeded random values of each input's shape).
        repeats: Timed runs per op for the op-alone fallback (the median is kept).

    Returns:
        {"latency": node data}; each graph's name ends with the source of its numbers
        (``PROFILER_SOURCE`` or ``OP_ALONE_SOURCE``).

    Raises:
        ValueError: An ``inputs`` array does not fit its input.
    """
    import warnings

    from .litert_profile import ProfileError

    try:
        return {"latency": profiled_latency(tflite_path, inputs)}
    except ProfileError as e:
        warnings.warn(f"latency overlay: LiteRT's op profiler failed ({e}); timing each op alone instead",
                      RuntimeWarning, stacklevel=2)
        return _op_alone_latency(tflite_path, inputs, repeats)


def profiled_latency(tflite_path: str, inputs: dict | None = None) -> dict:
    """Node data of every signature's ops (and the subgraphs they call) from LiteRT's op profiler, keyed like the
    other overlays (each op's first output tensor name, per graph id); a subgraph shared by several signatures is
    shown as the first signature that runs it.

    Args:
        tflite_path: The .tflite.
        inputs: Signature input name -> array, for every signature with an input of that name (default: seeded
            random floats, zero integers).

    Returns:
        {graph id: node data}, each op's mean microseconds per run of its signature.

    Raises:
        ValueError: An ``inputs`` name is no signature's input, or its array does not fit.
        ProfileError: The profiler cannot run the model or its events do not map exactly onto the model's ops.
    """
    from tpu_export.edge.inspect import read_model

    from .litert_profile import ProfileError, fb_text, profile_model

    data = read_tflite(tflite_path)
    model = read_model(data)
    ids = _subgraph_ids(data)
    sig_inputs = {fb_text(sd.signatureKey): {fb_text(t.name) for t in sd.inputs or []}
                  for sd in model.signatureDefs or []}
    if not sig_inputs:
        raise ProfileError(f"{tflite_path}: has no signature; LiteRT's CompiledModel runs a model by signature")
    unknown = sorted(set(inputs or {}) - set().union(*sig_inputs.values()))
    if unknown:
        raise ValueError(f"inputs: {unknown[0]!r} is no signature's input in {tflite_path}; its inputs are "
                         f"{', '.join(sorted(set().union(*sig_inputs.values())))}")
    out: dict = {}
    for key, names in sig_inputs.items():
        prof = profile_model(tflite_path, model, signature=key,
                             inputs={k: v for k, v in (inputs or {}).items() if k in names})
        for op in prof.ops:
            gid = ids[op.subgraph]
            if gid in out and out[gid]["signature"] != key:
                continue
            g = out.setdefault(gid, {"signature": key, "name": f"latency (us per run, this CPU, {PROFILER_SOURCE})",
                                     "results": {}, "gradient": _GRADIENT})
            sg = model.subgraphs[op.subgraph]
            outs = sg.operators[op.index].outputs
            if outs is None or not len(outs) or outs[0] < 0:
                continue
            g["results"][fb_text(sg.tensors[outs[0]].name or b"")] = {"value": round(op.us, 3)}
    for g in out.values():
        del g["signature"]
    return out


def _op_alone_latency(tflite_path: str, inputs: dict | None = None, repeats: int = 20) -> dict:
    """Each op of the first subgraph alone, on its real inputs: {"latency": node data} (microseconds)."""
    from ai_edge_litert.interpreter import Interpreter

    from tpu_export.edge.inspect import read_model

    from .litert_profile import fb_text

    data = read_tflite(tflite_path)
    model = read_model(data)
    sg = model.subgraphs[0]
    import warnings

    with warnings.catch_warnings():  # its "for debugging only" warning: the ops' real inputs are the point here
        warnings.simplefilter("ignore", UserWarning)
        full = Interpreter(model_path=tflite_path, experimental_preserve_all_tensors=True)
    sigs = full.get_signature_list()
    sig_key = next((k for k in sigs if full._interpreter.GetSubgraphIndexFromSignature(k) == 0), None)  # noqa: SLF001
    if sig_key is None:
        return {"latency": {}}
    runner = full.get_signature_runner(sig_key)
    rng = np.random.default_rng(0)
    feed = {}
    for name, d in runner.get_input_details().items():
        if inputs and name in inputs:
            feed[name] = np.asarray(inputs[name]).astype(d["dtype"])
        elif np.issubdtype(d["dtype"], np.floating):
            feed[name] = rng.standard_normal(d["shape"]).astype(d["dtype"])
        else:
            feed[name] = np.zeros(d["shape"], d["dtype"])
    runner(**feed)
    tensors = sg.tensors
    results = {}
    for op in sg.operators:
        if any(t >= 0 and tensors[t].isVariable for t in op.inputs) or not len(op.outputs):
            continue
        one_op = _one_op_model(model, sg, op)
        if one_op is None:
            continue
        blob, runtime_in = one_op
        try:
            one = Interpreter(model_content=blob, num_threads=1)
            one.allocate_tensors()
            for k, t in enumerate(runtime_in):
                one.set_tensor(k, full.get_tensor(t, 0))
            one.invoke()
            times = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                one.invoke()
                times.append(time.perf_counter() - t0)
        except (RuntimeError, ValueError):  # an op that needs its subgraph (IF, WHILE) or its neighbours
            continue
        name = tensors[op.outputs[0]].name or b""
        name = fb_text(name)
        results[name] = {"value": round(statistics.median(times) * 1e6, 3)}
    gid = _subgraph_ids(data)[0]
    return {"latency": {gid: {"name": f"latency (us, this CPU, {OP_ALONE_SOURCE})", "results": results,
                              "gradient": _GRADIENT}}}


def _one_op_model(model, sg, op):
    """(a .tflite holding ``op`` alone, its runtime inputs' tensor indices in ``sg``): the op's tensors only, the
    runtime inputs first (so input k is tensor k), its constants with their data; None for an op whose constants
    live outside the flatbuffer (the >2 GB form) or that calls subgraphs."""
    import copy

    from tpu_export.edge.builder import schema

    s = schema()
    if op.builtinOptions is not None and any(hasattr(op.builtinOptions, f) for f in
                                             ("thenSubgraphIndex", "condSubgraphIndex", "subgraphIndex")):
        return None
    runtime_in = [int(t) for t in op.inputs if t >= 0 and not _const(sg.tensors[t], model.buffers)]
    used = list(dict.fromkeys(runtime_in + [int(t) for t in list(op.inputs) + list(op.outputs)
                                            + list(op.intermediates if op.intermediates is not None else [])
                                            if t >= 0]))
    remap = {t: i for i, t in enumerate(used)}
    buffers, tensors = [s.BufferT()], []
    for t in used:
        tt = copy.copy(sg.tensors[t])
        b = model.buffers[tt.buffer] if 0 < tt.buffer < len(model.buffers) else None
        if b is not None and (b.offset or 0) > 1:
            return None
        if b is not None and b.data is not None and len(b.data):
            buffers.append(b)
            tt.buffer = len(buffers) - 1
        else:
            tt.buffer = 0
        tensors.append(tt)
    one = copy.copy(op)
    one.inputs = [remap[int(t)] if t >= 0 else -1 for t in op.inputs]
    one.outputs = [remap[int(t)] for t in op.outputs]
    if op.intermediates is not None:
        one.intermediates = [remap[int(t)] for t in op.intermediates if t >= 0]
    g = s.SubGraphT()
    g.tensors, g.operators, g.name = tensors, [one], sg.name
    g.inputs = [remap[t] for t in runtime_in]
    g.outputs = list(one.outputs)
    m = s.ModelT()
    m.version, m.operatorCodes, m.description = model.version, model.operatorCodes, model.description
    m.subgraphs, m.buffers = [g], buffers
    return _pack(m), runtime_in


def _const(t, buffers) -> bool:
    b = buffers[t.buffer] if 0 < t.buffer < len(buffers) else None
    return b is not None and (b.data is not None and len(b.data) > 0 or (b.offset or 0) > 1)


def numeric_overlay(result, graph_id: str = "serving_default") -> dict:
    """Node data of a CompareResult: each node's max relative error against torch eager, keyed by the artifact
    tensor holding it (a .tflite tensor name, or the torch tensor name in the TPU view, whose graph id is
    ``main``, or the signature's name in an artifact with several)."""
    results = {}
    for r in result.rows:
        key = r.artifact_tensor if result.kind == "tflite" else r.tensor_name
        results[key] = {"value": float(r.max_rel) if np.isfinite(r.max_rel) else 1e30,
                        **({"bgColor": _BAD} if r.over else {})}
    if result.kind == "tflite":
        gid = graph_id
    else:
        from tpu_export.tpu_backend.artifact import read_artifact

        from .graphs import tpu_graph_id

        gid = tpu_graph_id(read_artifact(result.artifact, verify=False).signatures, result.signature)
    return {gid: {"name": f"max rel error vs torch eager (tolerance {result.tolerance:g})", "results": results,
                  "thresholds": [{"value": result.tolerance, "bgColor": _GOOD}]}}


def write_overlays(artifact: str, *, names=None, inputs: dict | None = None, signature: str | None = None,
                   target: str | None = None) -> dict:
    """Compute and write the overlays of a .tflite or a TPU artifact beside it; {name: path}.

    Args:
        artifact: A .tflite (``runs_on.*``, ``latency``) or a TPU artifact, .tpuexp folder or .zip
            (``xla_cost.flops``, ``xla_cost.bytes``, ``xla_cost.time``).
        names: The overlays to write (default: every one of the artifact's kind; ``xla_cost.time`` only where
            the target's XLA estimates time, i.e. TPU).
        inputs: Input name -> array for the latency overlay (default: seeded random values).
        signature: A TPU artifact's signature to cost (default: ``serving_default``, else the first by name).
        target: Whose XLA costs a TPU artifact's ops: a TPU target (``tpu-v6e``) or ``cpu`` (default: the
            artifact's first compiled TPU target, else ``cpu``).

    Returns:
        Overlay name -> the path written.

    Raises:
        ValueError: ``artifact`` is neither a .tflite nor a TPU artifact, a name is not an overlay of its kind,
            or ``signature``/``target`` do not fit the artifact.
    """
    from .graphs import artifact_kind

    path = os.fspath(artifact)
    kind = artifact_kind(path)
    if kind == "litertlm":
        raise ValueError(f"{path!r}: overlays are computed for a .tflite or a TPU artifact (a .litertlm's "
                         "sections: extract the .tflite)")
    own = TFLITE_OVERLAYS if kind == "tflite" else TPU_OVERLAYS
    wanted = list(names) if names else list(own)
    bad = [n for n in wanted if n not in own]
    if bad:
        raise ValueError(f"overlay {bad[0]!r} is not written for a {'.tflite' if kind == 'tflite' else 'TPU artifact'}"
                         f"; its overlays are {', '.join(own)} (numeric comes from compare)")
    if kind == "tpu":
        if inputs:
            raise ValueError("inputs= is for a .tflite's latency overlay; a TPU artifact's xla_cost overlays take "
                             "no inputs")
        from .xla_cost import xla_cost

        data = xla_cost(path, signature=signature, target=target)
        if "xla_cost.time" in wanted and "xla_cost.time" not in data:
            if names:
                raise ValueError("overlay 'xla_cost.time': XLA's CPU cost analysis estimates no time; cost on a "
                                 "TPU target (target='tpu-v6e')")
            wanted.remove("xla_cost.time")
        return {n: _write(overlay_path(path, n), data[n]) for n in wanted}
    if signature is not None or target is not None:
        raise ValueError("signature= and target= are for a TPU artifact's xla_cost overlays, not a .tflite")
    data = {}
    if any(n.startswith("runs_on.") for n in wanted):
        data.update(runs_on(path))
    if "latency" in wanted:
        data.update(latency(path, inputs))
    return {n: _write(overlay_path(path, n), data[n]) for n in wanted}
