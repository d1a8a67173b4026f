"""Which core ATen overloads each backend lowers, and which test row exercises each.

Computed, never hand-kept: the op list comes from the installed torch (``torch.Tag.core``), the
support columns from the backends' lowering registries. The "tested by" column and the LiteRT
builtins come from exporting op-test rows and reading the ops in their graphs: ``scan_rows`` takes
the rows as an argument (the test suite holds them, and shipped code never imports it), so
``tpu-export ops`` works from an installed package and shows the backends' columns only.

An op the converter itself decomposes (torch.export's core table still decomposes a few core
overloads, e.g. reflection_pad2d -> index) never reaches a backend: with a row scan it is supported
by both when a row exercises it (it is looked for in the row's graph decomposed with that op kept
whole) and that row passes on both backends (tests/test_op_support.py checks it is xfailed on
neither); without one it is listed as decomposed. An op a shared converter pass rewrites into ops both
backends lower (``PASS_REWRITTEN``: the FFTs, into real matmuls) is treated the same way, looked for in the
row's graph before the passes; without a scan it is listed as lowered. Shape-query ops (sym_size,
sym_numel, ...) appear only in graphs with dynamic shapes, which the op rows do not have; they are tested
by the dynamic-batch model tests instead.

    tpu-export ops                   # print the table (python -m tpu_export.op_support does the same)
    python -m tests.write_ops_doc    # regenerate docs/ops.md from the test suite's op rows
"""

from __future__ import annotations

import dataclasses
import functools
import sys

__all__ = ["inference_core_ops", "excluded_reason", "support_table", "beyond_core_ops", "beyond_core_table",
           "coverage_text", "render_markdown", "converter_decomposed", "scan_rows", "RowScan", "DYNAMIC_ONLY",
           "PASS_REWRITTEN"]

# Ops no static-shape op row can put in a graph, and where they are tested instead.
DYNAMIC_ONLY = {
    "aten.sym_size.int": "dynamic shapes only: tests/test_op_support.py::test_dynamic_only_ops",
    "aten.sym_numel.default": "dynamic shapes only, and torch.export writes numel() as a product of sym_size: "
                              "not seen in a converted graph",
    "aten.scalar_tensor.default": "folded by the converter unless its value is symbolic (dynamic shapes): "
                                  "tests/test_op_support.py::test_dynamic_only_ops",
}

# Core overloads no backend lowers that a shared converter pass rewrites into ops both do, in the forms the pass
# states; any other form stays in the graph and the backend refuses it by name. A row exercises one when its graph
# holds it before the passes.
_DFT = ("rewritten by the converter (converter/passes/lower_complex.py) into real matmuls with constant cos / sin "
        "matrices: transformed dims of static size, the complex values read only by ops that pass has a rule for "
        "(.real / .imag, complex products and sums, shape ops, another transform)")
PASS_REWRITTEN = {"aten._fft_r2c.default": _DFT, "aten._fft_c2r.default": _DFT}

# The exclusion rule, in one place: what is not an inference op of a deployed model.
#  - in-place (name ends in "_") and out= overloads: functionalization removes them before us;
#  - backward ops: training only;
#  - training-only forward ops: dropout's training form and batch norm without running stats;
#  - random sampling: a deployed graph has no RNG state to match torch's stream, so it cannot be
#    compared against eager (and neither runtime promises torch's generator).
_TRAINING_ONLY = {"native_dropout.default": "training-only (dropout is removed in eval)",
                  "_native_batch_norm_legit.no_stats": "training-only (batch norm without running stats)",
                  "_native_batch_norm_legit.default": "training-only (updates running stats)"}
_RANDOM = {"rand", "randn", "randperm", "bernoulli", "normal", "uniform", "multinomial", "randint"}


def excluded_reason(packet: str, overload: str, schema) -> str | None:
    key = f"{packet}.{overload}"
    if key in _TRAINING_ONLY:
        return _TRAINING_ONLY[key]
    if overload.startswith("out") or "out" in overload.split("_"):
        return "out= variant"
    if packet.endswith("_") or schema.is_mutable:
        return "in-place"
    if "backward" in packet:
        return "backward (training only)"
    if packet in _RANDOM:
        return "random sampling (no reference to compare against)"
    return None


@functools.lru_cache(maxsize=None)
def core_ops():
    """[(name, OpOverload, exclusion reason or None)] for every core ATen overload of this torch."""
    import torch

    from tpu_export.converter._torch_compat import op_schema, registered_op_names

    # every registered aten schema (dir(torch.ops.aten) lists only the packets touched so far,
    # which differs from process to process)
    packets = {n[len("aten::"):].split(".")[0] for n in registered_op_names() if n.startswith("aten::")}
    rows = []
    for packet in sorted(packets | set(dir(torch.ops.aten))):
        try:
            pk = getattr(torch.ops.aten, packet)
        except (AttributeError, RuntimeError):
            continue
        if not hasattr(pk, "overloads"):
            continue
        for ov in pk.overloads():
            op = getattr(pk, ov)
            if torch.Tag.core in op.tags:
                rows.append((f"aten.{packet}.{ov}", op, excluded_reason(packet, ov, op_schema(op))))
    return sorted(rows, key=lambda r: r[0])


def inference_core_ops():
    return [(n, op) for n, op, why in core_ops() if why is None]


def _registries():
    """backend -> set of ATen overloads it lowers."""
    from tpu_export.converter._torch_compat import is_op_overload
    from tpu_export.edge import EDGE  # the filled tables: importing them registers every lowering
    from tpu_export.edge.lower import SYM_OPS  # shape queries the edge driver evaluates itself
    from tpu_export.tpu_backend.lowering import JAX_LOWERINGS

    edge = set(EDGE.targets()) | {op for op in SYM_OPS if is_op_overload(op)}
    return {"tpu": set(JAX_LOWERINGS.targets()), "edge": edge}


@functools.lru_cache(maxsize=None)
def converter_decomposed() -> frozenset:
    """Names of the inference core overloads the converter's own decomposition table removes."""
    from tpu_export.converter.decompositions import decomposition_table

    table = decomposition_table()
    return frozenset(n for n, op in inference_core_ops() if op in table)


def _row_ops(module, args, keep_core) -> tuple[set, tuple]:
    """Ops of a row's converted graph, plus the converter-decomposed core ops it holds; and
    the LiteRT builtins the edge backend writes for that graph (empty if it does not lower it).

    Decomposition runs once, with ``keep_core`` kept whole; those few nodes are then decomposed
    in place from the same table (what ``converter.prepare`` would have produced) before the
    shared passes run."""
    from tpu_export.converter.capture import _as_tuple, capture, forward_params
    from tpu_export.converter.decompositions import KEEP_WHOLE, decompose, decompose_nodes
    from tpu_export.converter.passes import run_shared_passes
    from tpu_export.converter.program import program_from_exported
    from tpu_export.converter.registry import op_name

    kept = decompose(capture(module, args), KEEP_WHOLE | keep_core, in_place=True)
    ops = {op_name(n.target) for n in kept.graph.nodes
           if n.op == "call_function" and (n.target in keep_core or op_name(n.target) in PASS_REWRITTEN)}
    info = {"args": _as_tuple(args), "kwargs": {}, "dynamic_shapes": None, "forward_params": forward_params(module)}
    prog = program_from_exported({"serving_default": (kept, info)})
    for sig in prog.signatures.values():
        decompose_nodes(sig.graph_module, keep_core)
    prog = run_shared_passes(prog)
    ops |= {op_name(n.target) for sig in prog.signatures.values() for n in sig.graph.nodes if n.op == "call_function"}
    return ops, _edge_builtins(prog)


def _edge_builtins(prog) -> tuple:
    """Names of the LiteRT builtins the edge backend emits for ``prog`` (lowering only: no file)."""
    from tpu_export.converter.support import unsupported_ops
    from tpu_export.edge.builder import ModelBuilder, builtin_names
    from tpu_export.edge.convert import is_supported
    from tpu_export.edge.lower import lower_signature

    if unsupported_ops(prog, is_supported):
        return ()
    names = builtin_names()
    model = ModelBuilder()
    try:
        import torch

        with torch.no_grad():
            for sig in prog.signatures.values():
                lower_signature(model, prog, sig)
    except Exception:  # noqa: BLE001 - the op test reports it; the table just shows no builtins
        return ()
    return tuple(sorted({names[code] for code, _ in model._opcode_versions}))


@dataclasses.dataclass(frozen=True)
class RowScan:
    """What exporting the op-test rows shows: op name -> ids of the rows whose converted graph holds it
    (``tested``), and op name -> the LiteRT builtins edge writes for it, read from the first row (by id)
    whose graph holds that op alone (``builtins``)."""

    tested: dict
    builtins: dict


def scan_rows(rows, build) -> RowScan:
    """Export every row (``build(row)`` -> (module, sample args); a row has an ``id``) and read its ops."""
    import warnings

    keep_core = frozenset(op for n, op in inference_core_ops() if n in converter_decomposed())
    names = converter_decomposed() | frozenset(PASS_REWRITTEN)  # ops that never reach a backend
    found: dict[str, list[str]] = {}
    solo: dict[str, list] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for row in rows:
            try:
                ops, builtins = _row_ops(*build(row), keep_core)
            except Exception:  # noqa: BLE001 - a row that fails to capture tests nothing
                continue
            for name in ops:
                found.setdefault(name, []).append(row.id)
            alone = ops - {"_operator.getitem"}
            if len(alone & names) == 1:  # a converter-decomposed or -rewritten op: the builtins of its rewrite
                alone = alone & names
            if len(alone) == 1 and builtins:
                solo.setdefault(next(iter(alone)), []).append((row.id, builtins))
    return RowScan(found, {name: min(rows)[1] for name, rows in solo.items()})


def support_table(scan: RowScan | None = None) -> list[dict]:
    """One dict per inference core overload: op, tpu, edge (True/False; None for an op the converter
    decomposes when no ``scan`` says whether a row exercises it), tested (row ids), litert, note."""
    regs = _registries()
    tested = scan.tested if scan is not None else {}
    builtins = scan.builtins if scan is not None else {}
    notes = {}
    try:
        from tpu_export.edge.op_notes import EDGE_NOTES

        notes.update(EDGE_NOTES)
    except ImportError:
        pass
    decomposed = converter_decomposed()
    table = []
    for name, op in inference_core_ops():
        rows = sorted(set(tested.get(name, [])))
        note = notes.get(name, "")
        if name in decomposed and name not in DYNAMIC_ONLY:
            # never reaches a backend: supported where a row exercises it (the op tests run it on both)
            tpu = edge = bool(rows) if scan is not None else None
            note = "; ".join(x for x in ("decomposed by the converter (torch.export core table) before lowering", note)
                             if x)
        elif name in PASS_REWRITTEN:  # supported where a row exercises it, as a decomposed op
            tpu = edge = bool(rows) if scan is not None else True
            note = "; ".join(x for x in (PASS_REWRITTEN[name], note) if x)
        else:
            tpu, edge = op in regs["tpu"], op in regs["edge"]
        if name in DYNAMIC_ONLY:
            note = "; ".join(x for x in (note, DYNAMIC_ONLY[name]) if x)
        table.append(_row(name, tpu, edge, rows, builtins, note))
    return table


@functools.lru_cache(maxsize=None)
def beyond_core_ops():
    """[(name, OpOverload)] of the ATen overloads outside torch's core set that a backend lowers: the ones the
    converter keeps whole (converter.decompositions.KEEP_WHOLE) and those torch.export leaves as they are."""
    from tpu_export.converter.decompositions import decomposition_table
    from tpu_export.converter.registry import op_name

    core = {op for _, op, _ in core_ops()}
    decomposed = decomposition_table()  # what torch.export's table rewrites into core ops, less KEEP_WHOLE
    regs = _registries()
    ops = {op for op in regs["tpu"] | regs["edge"]
           if op not in core and op not in decomposed and getattr(op, "namespace", None) == "aten"}
    return sorted(((op_name(op), op) for op in ops), key=lambda r: r[0])


def beyond_core_table(scan: RowScan | None = None) -> list[dict]:
    """support_table's rows for beyond_core_ops()."""
    from tpu_export.edge.op_notes import EDGE_NOTES

    regs = _registries()
    tested = scan.tested if scan is not None else {}
    builtins = scan.builtins if scan is not None else {}
    table = []
    for name, op in beyond_core_ops():
        rows = sorted(set(tested.get(name, [])))
        tpu, edge = op in regs["tpu"], op in regs["edge"]
        note = EDGE_NOTES.get(name) or ("" if tpu and edge else "not lowered there: refused by name at conversion")
        table.append(_row(name, tpu, edge, rows, builtins, note))
    return table


def _row(name, tpu, edge, rows, builtins, note) -> dict:
    """One row of the support tables: the op, whether each backend lowers it, the op-test rows that exercise it
    (the first three, and how many), the LiteRT builtins edge writes for it, and the note."""
    return {"op": name, "tpu": tpu, "edge": edge, "tested": rows[:3], "n_rows": len(rows),
            "litert": builtins.get(name, ()) if edge else (), "note": note}


def _pct(table, key):
    return 100.0 * sum(bool(r[key]) for r in table) / len(table)


def _yes(v) -> str:
    return "dec" if v is None else "yes" if v else "no"


def coverage_text(scan: RowScan | None = None) -> str:
    """The table as text; without ``scan`` (an installed package has no op rows) the tested column is
    left out and converter-decomposed ops show "dec" (docs/ops.md says which of them convert)."""
    table = support_table(scan)
    head = f"{'core ATen overload':42s} {'tpu':4s} {'edge':5s}"
    lines = [head + (" tested" if scan is not None else "")]
    for r in table:
        extra = f"  (LiteRT: {' '.join(r['litert'])})" if r["litert"] else ""
        extra += f"  [{r['note']}]" if r["note"] else ""
        tested = f" {', '.join(r['tested']) or '-'}" if scan is not None else ""
        lines.append(f"{r['op']:42s} {_yes(r['tpu']):4s} {_yes(r['edge']):5s}{tested}{extra}")
    lines.append(f"\n{len(table)} inference core ATen overloads (torch.Tag.core; excluded: "
                 f"{sum(1 for *_, w in core_ops() if w)} in-place/out/backward/training-only/random)")
    dec = sum(r["tpu"] is None for r in table)
    lines.append(f"tpu backend lowers {_pct(table, 'tpu'):.1f}%, edge backend lowers {_pct(table, 'edge'):.1f}%"
                 + (f" (not counting {dec} ops the converter decomposes before lowering: see docs/ops.md)"
                    if dec else ""))
    lines += ["", f"{'ATen overload beyond core':42s} {'tpu':4s} {'edge':5s}"]
    for r in beyond_core_table(scan):
        lines.append(f"{r['op']:42s} {_yes(r['tpu']):4s} {_yes(r['edge']):5s}")
    return "\n".join(lines)


def render_markdown(scan: RowScan) -> str:
    """docs/ops.md: the table with the rows' "tested by" column and LiteRT builtins."""
    import torch

    table = support_table(scan)
    out = [
        "# Core ATen op support",
        "",
        f"Generated by `python -m tests.write_ops_doc` against torch {torch.__version__.split('+')[0]}; "
        "checked for being current by `tests/test_op_support.py`. Do not edit by hand.",
        "",
        f"- Inference core ATen overloads: {len(table)}",
        f"- TPU backend (JAX/StableHLO): {sum(r['tpu'] for r in table)} lowered ({_pct(table, 'tpu'):.1f}%)",
        f"- Edge backend (LiteRT builtins): {sum(r['edge'] for r in table)} lowered ({_pct(table, 'edge'):.1f}%)",
        "",
        "Excluded (the rule is in `tpu_export/op_support.py: excluded_reason`):",
        "",
    ]
    for name, _, why in core_ops():
        if why:
            out.append(f"- `{name}`: {why}")
    out += ["", "Edge LiteRT builtins: those written for the first op-test row (by id) whose graph holds that op "
            "alone (for an op the converter decomposes: the only such op), including any TRANSPOSE/RESHAPE at "
            "that row's NCHW boundary.",
            "", "| overload | TPU | edge | edge LiteRT builtins | tested by (op-test rows) | notes |",
            "|---|---|---|---|---|---|"]
    beyond = beyond_core_table(scan)
    for r in table + [None] + beyond:
        if r is None:
            out += ["", "## Beyond core ATen", "",
                    "ATen overloads outside torch's core set that reach a backend whole: the ones the converter keeps "
                    "whole because each maps onto a fused builtin or kernel, and those torch.export leaves as they "
                    "are. An overload missing from both tables is decomposed into core ops before lowering.",
                    "", "| overload | TPU | edge | edge LiteRT builtins | tested by (op-test rows) | notes |",
                    "|---|---|---|---|---|---|"]
            continue
        out.append(f"| `{r['op']}` | {'yes' if r['tpu'] else 'no'} | {'yes' if r['edge'] else 'no'} | "
                   f"{', '.join(r['litert'])} | {', '.join(r['tested']) or '-'} | {r['note']} |")
    return "\n".join(out) + "\n"


def main() -> int:
    print(coverage_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
