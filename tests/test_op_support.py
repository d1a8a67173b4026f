"""The op-support table (tpu_export/op_support.py): docs/ops.md is current, both backends lower at
least 90% of the inference core ATen overloads, and every op marked lowered is exercised by an
op-test row that the backend's op test does not xfail.

One test: the table exports every row of tests/op_rows.py once (the expensive part), and every
check reads that same table.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from tests.numerics import rel_err
from tests.write_ops_doc import DOCS, expected_doc, op_row_scan, torch_minor
from tpu_export import op_support

FLOOR = 90.0


def _xfails() -> dict:
    from tests.edge.test_ops import XFAIL as EDGE_XFAIL
    from tests.tpu.test_ops import XFAIL as TPU_XFAIL

    return {"edge": set(EDGE_XFAIL), "tpu": set(TPU_XFAIL)}


def test_exclusion_rule_is_stated_and_applied():
    reasons = {why for *_, why in op_support.core_ops() if why}
    assert reasons, "no overload excluded: the rule in excluded_reason did not run"
    names = {n for n, _ in op_support.inference_core_ops()}
    assert "aten.add.Tensor" in names and "aten.add_.Tensor" not in names
    assert not any(n.split(".")[1].endswith("_") for n in names), "an in-place overload was kept"


@pytest.mark.slow
def test_support_table_current_covered_and_tested():
    scan = op_row_scan()
    table = op_support.support_table(scan)

    # docs/ops.md is the rendering of this very table (on another torch minor release: the reference table with the
    # rows the doc records for this release)
    with open(DOCS) as f:
        current = f.read()
    assert current == expected_doc(scan, current), (
        f"docs/ops.md is stale for torch {torch_minor()}: run `python -m tests.write_ops_doc`")

    # coverage floors
    for backend in ("tpu", "edge"):
        pct = 100.0 * sum(r[backend] for r in table) / len(table)
        assert pct >= FLOOR, f"{backend} lowers {pct:.1f}% of {len(table)} core overloads (< {FLOOR}%)"

    # every op marked lowered has a row that runs (is not xfailed) on that backend
    tested = scan.tested
    xfail = _xfails()
    missing = []
    for r in table:
        if r["op"] in op_support.DYNAMIC_ONLY:
            continue
        for backend in ("tpu", "edge"):
            if r[backend] and not [rid for rid in tested.get(r["op"], []) if rid not in xfail[backend]]:
                missing.append(f"{r['op']} ({backend})")
    assert not missing, f"lowered but exercised by no passing op row: {missing}"


@pytest.mark.subprocess
def test_ops_command_needs_no_test_suite():
    """`tpu-export ops` from an install (no tests/ folder): the backends' columns, decomposed ops marked."""
    code = ("import sys; sys.modules['tests'] = None  # any import of the test suite fails\n"
            "from tpu_export.cli import main; sys.exit(main(['ops']))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    lines = {line.split()[0]: line.split()[1:3] for line in r.stdout.splitlines() if line.startswith("aten.")}
    assert lines["aten.add.Tensor"] == ["yes", "yes"] and lines["aten.var.dim"] == ["dec", "dec"]
    # an overload beyond core ATen that reaches the backends whole has its row too
    assert lines["aten.unfold.default"] == ["yes", "yes"] and lines["aten.linear.default"] == ["yes", "yes"]
    assert "backend lowers" in r.stdout


# DYNAMIC_ONLY ops seen for real: a dynamic batch puts them in the graph; both backends run it
# at two batch sizes and match torch.
_DYNAMIC_CASES = {
    "aten.sym_size.int": lambda x: x.view(x.shape[0], -1) * 2.0,
    "aten.scalar_tensor.default": lambda x: x * torch.scalar_tensor(x.shape[0]),
}


class _Fn(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


@pytest.mark.parametrize("op", sorted(_DYNAMIC_CASES))
def test_dynamic_only_ops(op):
    import jax
    from ai_edge_litert.interpreter import Interpreter
    from jax import export as jax_export

    from tpu_export import converter
    from tpu_export.converter.registry import op_name
    from tpu_export.edge.convert import convert_program
    from tpu_export.tpu_backend.lowering import lower_signature

    fn = _DYNAMIC_CASES[op]
    batch = torch.export.Dim("batch", min=2, max=64)
    prog = converter.prepare(_Fn(fn).eval(), (torch.randn(3, 2, 4),), dynamic_shapes=({0: batch},))
    sig = prog.signature(None)
    assert op in {op_name(n.target) for n in sig.graph.nodes if n.op == "call_function"}

    lowered = lower_signature(prog)
    w_avals, in_avals = lowered.abstract_args()
    exported = jax_export.export(jax.jit(lowered.fn), platforms=["cpu"])(w_avals, *in_avals)
    runner = Interpreter(model_content=convert_program(prog)).get_signature_runner()
    for n in (3, 6):
        x = torch.randn(n, 2, 4, generator=torch.Generator().manual_seed(n))
        want = fn(x)
        (tpu_out,) = exported.call(lowered.weight_arrays(prog), x.numpy())
        (edge_out,) = runner(**{sig.inputs[0].name: x.numpy()}).values()
        for backend, got in (("tpu", tpu_out), ("edge", edge_out)):
            assert tuple(got.shape) == tuple(want.shape), (backend, got.shape)
            assert rel_err(got, want) <= 1e-5, f"{op} on {backend} at batch {n}"
