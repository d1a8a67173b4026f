"""Every ONNX op row (tests/onnx/onnx_rows.py) through onnxruntime and through both of our outputs: the
.tflite in the LiteRT interpreter and the TPU backend's function on PJRT CPU. rel err <= 1e-5 unless a
row says why; integer and boolean outputs exactly. One model per family and opset (one capture each)."""

from __future__ import annotations

import pytest

from tests.onnx.harness import compare, run_ort, run_ours
from tests.onnx.onnx_rows import ROWS, groups

_GROUPS = groups()


@pytest.mark.parametrize("key", sorted(_GROUPS))
def test_onnx_rows(key):
    rows = _GROUPS[key]
    want, model = run_ort(rows, rows[0].opset)
    edge, tpu = run_ours(model, rows)
    bad = compare(rows, want, edge, "edge") + compare(rows, want, tpu, "tpu")
    assert not bad, "\n".join(bad)


def test_every_imported_op_has_a_row():
    """Each op of the table (but the ones the contrib list and creation rows cover by name) has a row."""
    from tpu_export.converter.onnx import onnx_ops

    have = {(r.domain, r.op) for r in ROWS}
    missing = sorted(f"{e.domain or 'ai.onnx'}::{e.op_type}" for e in onnx_ops().entries()
                     if (e.domain, e.op_type) not in have and e.op_type not in _NO_ROW)
    assert not missing, f"ops without a test row: {missing}"


# ops whose rows live elsewhere or that need a form a row cannot give
_NO_ROW = {
    "Constant": "a node with no inputs: folded at build time; every torch-exported model has some",
    "BitShift": "unsigned integers only in onnxruntime; neither backend takes uint32/uint64 tensors",
}
