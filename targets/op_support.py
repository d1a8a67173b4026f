"""Which core ATen overloads each backend lowers, and which test row exercises each.

Computed, never hand-kept: the op list comes from the installed torch (``torch.Tag.core``), the
support columns from the backends' lowering registries, the test column from exporting every
row of ``tests/op_rows.py`` and reading the ops in its graph.

    python -m targets.op_support            # print the table (same as `tpu-export ops`)
    python -m targets.op_support --write    # regenerate docs/ops.md
"""

from __future__ import annotations

import functools
import os
import sys

__all__ = ["inference_core_ops", "excluded_reason", "support_table", "coverage_text", "render_markdown"]

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
    if packet.endswith("_") or schema.is_mutable:
        return "in-place"
    if overload.startswith("out") or "out" in overload.split("_"):
        return "out= variant"
    if "backward" in packet:
        return "backward (training only)"
    if key in _TRAINING_ONLY:
        return _TRAINING_ONLY[key]
    if packet in _RANDOM:
        return "random sampling (no reference to compare against)"
    return None


@functools.lru_cache(maxsize=None)
def core_ops():
    """[(name, OpOverload, exclusion reason or None)] for every core ATen overload of this torch."""
    import torch

    rows = []
    for packet in dir(torch.ops.aten):
        try:
            pk = getattr(torch.ops.aten, packet)
        except (AttributeError, RuntimeError):
            continue
        if not hasattr(pk, "overloads"):
            continue
        for ov in pk.overloads():
            op = getattr(pk, ov)
            if torch.Tag.core in op.tags:
                rows.append((f"aten.{packet}.{ov}", op, excluded_reason(packet, ov, op._schema)))
    return sorted(rows, key=lambda r: r[0])


def inference_core_ops():
    return [(n, op) for n, op, why in core_ops() if why is None]


def _registries():
    from edge import EDGE  # the filled tables: importing them registers every lowering
    from tpu_backend.lowering import JAX_LOWERINGS

    return {"tpu": JAX_LOWERINGS, "edge": EDGE}


@functools.lru_cache(maxsize=None)
def tested_by() -> dict:
    """op name -> ids of the op-test rows whose converted graph contains that op."""
    import warnings

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from tests.op_rows import ROWS, OpModule, row_inputs

    import converter
    from converter.registry import op_name

    found: dict[str, list[str]] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for row in ROWS:
            try:
                prog = converter.prepare(OpModule(row), row_inputs(row))
            except Exception:  # noqa: BLE001 - a row that fails to capture tests nothing
                continue
            for sig in prog.signatures.values():
                for n in sig.graph.nodes:
                    if n.op == "call_function":
                        found.setdefault(op_name(n.target), []).append(row.id)
    return found


def support_table():
    regs = _registries()
    tested = tested_by()
    notes = {}
    try:
        from edge.op_notes import EDGE_NOTES

        notes.update(EDGE_NOTES)
    except ImportError:
        pass
    table = []
    for name, op in inference_core_ops():
        table.append({
            "op": name,
            "tpu": op in regs["tpu"],
            "edge": op in regs["edge"],
            "tested": sorted(set(tested.get(name, [])))[:3],
            "note": notes.get(name, ""),
        })
    return table


def _pct(table, key):
    return 100.0 * sum(r[key] for r in table) / len(table)


def coverage_text() -> str:
    table = support_table()
    lines = [f"{'core ATen overload':42s} {'tpu':4s} {'edge':5s} tested"]
    for r in table:
        lines.append(f"{r['op']:42s} {'yes' if r['tpu'] else 'no':4s} {'yes' if r['edge'] else 'no':5s} "
                     f"{', '.join(r['tested']) or '-'}")
    lines.append(f"\n{len(table)} inference core ATen overloads (torch.Tag.core; excluded: "
                 f"{sum(1 for *_, w in core_ops() if w)} in-place/out/backward/training-only/random)")
    lines.append(f"tpu backend lowers {_pct(table, 'tpu'):.1f}%, edge backend lowers {_pct(table, 'edge'):.1f}%")
    return "\n".join(lines)


def render_markdown() -> str:
    import torch

    table = support_table()
    out = [
        "# Core ATen op support",
        "",
        f"Generated by `python -m targets.op_support --write` against torch {torch.__version__.split('+')[0]}; "
        "checked for being current by `tests/test_op_support.py`. Do not edit by hand.",
        "",
        f"- Inference core ATen overloads: {len(table)}",
        f"- TPU backend (JAX/StableHLO): {sum(r['tpu'] for r in table)} lowered ({_pct(table, 'tpu'):.1f}%)",
        f"- Edge backend (LiteRT builtins): {sum(r['edge'] for r in table)} lowered ({_pct(table, 'edge'):.1f}%)",
        "",
        "Excluded (the rule is in `targets/op_support.py: excluded_reason`):",
        "",
    ]
    for name, _, why in core_ops():
        if why:
            out.append(f"- `{name}`: {why}")
    out += ["", "| overload | TPU | edge | tested by (op-test rows) | notes |", "|---|---|---|---|---|"]
    for r in table:
        out.append(f"| `{r['op']}` | {'yes' if r['tpu'] else 'no'} | {'yes' if r['edge'] else 'no'} | "
                   f"{', '.join(r['tested']) or '-'} | {r['note']} |")
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--write" in argv:
        path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "ops.md")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path + ".tmp", "w") as f:
            f.write(render_markdown())
        os.replace(path + ".tmp", path)
        print(f"wrote {path}")
    else:
        print(coverage_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
