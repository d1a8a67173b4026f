"""XLA's own cost figures per node of a TPU artifact's StableHLO view (the ``xla_cost.*`` overlays).

XLA reports cost for a whole compiled program only (``cost_analysis()`` of an executable; per-instruction figures
are not exposed to Python, and jaxlib's ``hlo_module_cost_analysis`` needs a client that runs, which a TPU
compile-only client is not). So each StableHLO op of the signature is compiled alone, its operands' types as the
function's parameters, by the compiler the artifact targets: libtpu's compile-only client for the artifact's TPU
generation (one chip), or jaxlib's CPU client for a CPU-only artifact. The executable's ``cost_analysis()`` gives
the op's flops, bytes accessed and, on TPU, XLA's estimated time (``optimal_seconds``). An op costed alone is not
fused with its neighbours: the figures are the op's own, not its share of a fused kernel, and the sum over ops
exceeds the whole program's bytes accessed.

The figures are keyed by Model Explorer's node ids of the view ``explore`` shows for the artifact (without
``--model``): its MLIR adapter numbers the ops of ``main`` in order, an op before the ops of its regions, and
expands the regions of ``main``'s own ops only (the ``platform_dependent`` case holding the TPU and the CPU form of
the program); an op nested deeper is part of its parent's node. A ``case`` on the platform index (jax's
``platform_dependent``) runs one branch on the target: the ops of the other branches get no figures, and a
``case`` node that is not expanded gets the sum of its running branch's ops.
"""

from __future__ import annotations

import os

__all__ = ["xla_cost", "XLA_COST_OVERLAYS"]

XLA_COST_OVERLAYS = ("xla_cost.flops", "xla_cost.bytes", "xla_cost.time")
_GRADIENT = [{"stop": 0, "bgColor": "#ffffff"}, {"stop": 1, "bgColor": "#ef5350"}]


def _pick_signature(art, signature: str | None) -> str:
    if signature is None:
        return "serving_default" if "serving_default" in art.signatures else sorted(art.signatures)[0]
    if signature not in art.signatures:
        raise ValueError(f"{art.path}: no signature {signature!r}; it has {', '.join(sorted(art.signatures))}")
    return signature


def _pick_target(art, target: str | None) -> str:
    """"cpu" or a TPU target name (tpu-v6e) whose compiler costs the ops."""
    platforms = list(art.manifest.get("platforms", []))
    if target is None:
        tpu = [c.target for c in art.compiled if c.platform == "tpu"]
        if tpu:
            return tpu[0]
        if "cpu" in platforms:
            return "cpu"
        raise ValueError(f"{art.path}: exported for {platforms} with no compiled TPU target; pass target= "
                         "(a TPU target such as 'tpu-v6e') to cost its ops")
    if target == "cpu":
        if "cpu" not in platforms:
            raise ValueError(f"target='cpu': {art.path} was exported for {platforms} only")
        return target
    if "tpu" not in platforms:
        raise ValueError(f"target={target!r}: {art.path} was exported for {platforms} only (no TPU form)")
    from tpu_export.tpu_backend.chips import chip_for_target

    return chip_for_target(target).target


def _device(target: str):
    import jax

    if target == "cpu":
        return jax.devices("cpu")[0]
    from tpu_export.tpu_backend.aot import topology_devices
    from tpu_export.tpu_backend.chips import parse_topology

    return topology_devices(parse_topology(target))[0]


class _Walk:
    """Model Explorer's node ids of ``main``'s ops, and the ops the target runs."""

    def __init__(self, main, platform_index: int | None):
        self.known: list = []  # (value, int): values whose integer content is known (the platform index chain)
        # (node id, op, runs on the target, an expanded case: its branches' ops are nodes of their own)
        self.nodes: list = []
        block = main.regions[0].blocks[0]
        if platform_index is not None and len(block.arguments):
            self.known.append((block.arguments[0], platform_index))
        self.counter = 0
        for op in block.operations:
            self._visit(op.operation, depth=0, running=True)

    def value_of(self, v):
        for k, n in self.known:
            if k == v:
                return n
        return None

    def _learn(self, op) -> None:
        """Record the integer a constant or a case on a known index yields (jax's platform index chain)."""
        import numpy as np

        if op.name == "stablehlo.constant" and len(op.results) == 1:
            try:
                arr = np.array(op.attributes["value"])
            except (ValueError, TypeError, RuntimeError):
                return
            if arr.size == 1 and np.issubdtype(arr.dtype, np.integer):
                self.known.append((op.results[0], int(arr.reshape(()))))
            return
        branch = self.branch(op)
        if branch is None:
            return
        ops = list(op.regions[branch].blocks[0].operations)
        if len(ops) == 1 and ops[0].operation.name == "stablehlo.return":
            for r, v in zip(op.results, ops[0].operation.operands):
                n = self.value_of(v)
                if n is not None:
                    self.known.append((r, n))

    def branch(self, op) -> int | None:
        """The region a ``case`` takes, where its index is known (out of range: the last, as stablehlo says)."""
        if op.name != "stablehlo.case" or not len(op.operands):
            return None
        n = self.value_of(op.operands[0])
        if n is None:
            return None
        return n if 0 <= n < len(op.regions) else len(op.regions) - 1

    def _visit(self, op, depth: int, running: bool) -> None:
        nid = str(self.counter)
        self.counter += 1
        expanded = depth == 0 and len(op.regions) > 0
        self.nodes.append((nid, op, running, expanded and op.name == "stablehlo.case"))
        self._learn(op)
        if not expanded:
            return
        taken = self.branch(op)
        case = op.name == "stablehlo.case"
        for k, region in enumerate(op.regions):
            for block in region.blocks:
                for inner in block.operations:
                    # a case's branches run as themselves; another op's body (a reduce's reducer, a while's
                    # condition) is costed with the op
                    self._visit(inner.operation, depth + 1, running and case and (taken is None or taken == k))


def _nested(op):
    """Every op inside ``op``'s regions, at any depth."""
    for region in op.regions:
        for block in region.blocks:
            for inner in block.operations:
                yield inner.operation
                yield from _nested(inner.operation)


def _captures(op) -> bool:
    """``op`` has a region that uses a value defined outside ``op`` (it cannot be compiled alone)."""
    if not len(op.regions):
        return False
    inside: set = set()
    for region in op.regions:
        for block in region.blocks:
            inside.update(block.arguments)
    for inner in _nested(op):
        inside.update(inner.results)
        for region in inner.regions:
            for block in region.blocks:
                inside.update(block.arguments)
    return any(v not in inside for inner in _nested(op) for v in inner.operands)


def _alone(op, callees: list):
    """A module whose ``main`` is ``op`` alone: its operands' types as parameters, its results returned."""
    from jax._src.lib.mlir import ir
    from jax._src.lib.mlir.dialects import func

    module = ir.Module.create()
    with ir.InsertionPoint(module.body):
        if any(o.name == "func.call" for o in [op, *_nested(op)]):  # the private functions it calls, beside it
            for f in callees:
                f.clone()
        ftype = ir.FunctionType.get([v.type for v in op.operands], [r.type for r in op.results])
        main = func.FuncOp("main", ftype)
        main.attributes["sym_visibility"] = ir.StringAttr.get("public")
        entry = main.add_entry_block()
        with ir.InsertionPoint(entry):
            one = op.clone()
            for k, arg in enumerate(entry.arguments):
                one.operands[k] = arg
            func.ReturnOp(list(one.results))
    module.operation.attributes["sym_name"] = ir.StringAttr.get("op_alone")
    module.operation.attributes["mhlo.num_partitions"] = ir.IntegerAttr.get(ir.IntegerType.get_signless(32), 1)
    module.operation.attributes["mhlo.num_replicas"] = ir.IntegerAttr.get(ir.IntegerType.get_signless(32), 1)
    return module


_FREE = {"stablehlo.constant", "func.return", "stablehlo.return", "stablehlo.optimization_barrier"}


def _static(op) -> bool:
    """Every operand and result of ``op`` has a static shape (a shape-polymorphic export's ops do not)."""
    from jax._src.lib.mlir import ir

    for v in list(op.operands) + list(op.results):
        try:
            t = ir.ShapedType(v.type)
        except ValueError:  # a token or a tuple: no shape to check
            continue
        if not t.has_rank or not t.has_static_shape:
            return False
    return True


def _cost(op, walk: _Walk, device, callees: list, memo: dict) -> dict | None:
    """XLA's figures of ``op`` compiled alone for ``device`` ({"flops", "bytes", "seconds"?}), or None."""
    from jax._src import compiler
    from jax._src.lib import xla_client as xc

    if op.name in _FREE:
        return None
    branch = walk.branch(op)
    if branch is not None:  # a platform case: the ops of the branch the target runs
        total: dict = {}
        for block in op.regions[branch].blocks:
            for inner in block.operations:
                c = _cost(inner.operation, walk, device, callees, memo)
                for k, v in (c or {}).items():
                    total[k] = total.get(k, []) + v if k == "ops" else total.get(k, 0.0) + v
        return total or None
    if not _static(op) or _captures(op):
        return None
    module = _alone(op, callees)
    if not module.operation.verify():
        return None
    key = str(module)
    if key in memo:
        return memo[key]
    opts = compiler.get_compile_options(num_replicas=1, num_partitions=1)
    try:
        exe = compiler.backend_compile_and_load(device.client, module, xc.DeviceList((device,)), opts, [])
    except Exception:  # noqa: BLE001 - an op XLA refuses alone (a custom call needing its context): no figures
        memo[key] = None
        return None
    ca = exe.cost_analysis()
    ca = ca[0] if isinstance(ca, list) else ca
    out = {"ops": [op.name], "flops": float(ca.get("flops", 0.0)), "bytes": float(ca.get("bytes accessed", 0.0)),
           "transcendentals": float(ca.get("transcendentals", 0.0))}
    if "optimal_seconds" in ca and ca["optimal_seconds"] >= 0:
        out["seconds"] = float(ca["optimal_seconds"])
    memo[key] = out
    return out


def xla_cost(artifact, *, signature: str | None = None, target: str | None = None) -> dict:
    """Each node's XLA cost in a TPU artifact's view: {overlay name: Model Explorer node data}.

    Args:
        artifact: A TPU artifact (.tpuexp folder or .zip).
        signature: The signature to cost (default: ``serving_default``, else the first by name).
        target: Whose compiler costs the ops: a TPU target (``tpu-v6e``; one chip) or ``cpu`` (default: the
            artifact's first compiled TPU target, else ``cpu`` for a CPU-only artifact).

    Returns:
        {"xla_cost.flops": ..., "xla_cost.bytes": ..., "xla_cost.time": ...} (``xla_cost.time``, XLA's estimated
        microseconds, on TPU only: XLA's CPU cost analysis has no time estimate), each keyed by graph id (``main``;
        the signature's name in an artifact with several, as the view names it) and node id, plus
        ``"per_node"``: node id -> {"op": the node's op, "ops": the ops costed for it (a case node: its running
        branch's), "flops", "bytes", "transcendentals", "seconds"?}.

    Raises:
        ValueError: ``signature`` is not in the artifact, or ``target`` is not a platform it was exported for.
    """
    from jax._src.interpreters import mlir
    from jax._src.lib.mlir import ir

    from tpu_export.tpu_backend.artifact import read_artifact
    from tpu_export.tpu_backend.host import prepare_cpu_host

    prepare_cpu_host()
    path = os.fspath(artifact)
    art = read_artifact(path)
    sig = _pick_signature(art, signature)
    target = _pick_target(art, target)
    exported = art.signatures[sig].exported
    platforms = tuple(exported.platforms)
    platform = "cpu" if target == "cpu" else "tpu"
    device = _device(target)
    per_node: dict = {}
    with mlir.make_ir_context(), ir.Location.unknown():
        module = ir.Module.parse(exported.mlir_module())
        funcs = [op.operation for op in module.body.operations]
        main = next(f for f in funcs if "sym_name" in f.attributes and f.attributes["sym_name"].value == "main")
        callees = [f for f in funcs if f is not main and f != main]
        walk = _Walk(main, platforms.index(platform) if len(platforms) > 1 else None)
        memo: dict = {}
        for nid, op, running, expanded in walk.nodes:
            if not running or expanded:  # an expanded case's figures are on its branches' nodes
                continue
            c = _cost(op, walk, device, callees, memo)
            if c is not None:
                per_node[nid] = {"op": op.name, **c}
    from .graphs import tpu_graph_id

    gid = tpu_graph_id(art.signatures, sig)
    where = f"{target}, {sig}, each op compiled alone: no fusion"
    out = {
        "xla_cost.flops": {gid: {"name": f"XLA flops ({where})", "gradient": _GRADIENT,
                                    "results": {k: {"value": v["flops"]} for k, v in per_node.items()}}},
        "xla_cost.bytes": {gid: {"name": f"XLA bytes accessed ({where})", "gradient": _GRADIENT,
                                    "results": {k: {"value": v["bytes"]} for k, v in per_node.items()}}},
    }
    if any("seconds" in v for v in per_node.values()):
        out["xla_cost.time"] = {gid: {"name": f"XLA estimated time, us ({where})", "gradient": _GRADIENT,
                                         "results": {k: {"value": v["seconds"] * 1e6} for k, v in per_node.items()
                                                     if "seconds" in v}}}
    out["per_node"] = per_node
    return out
