"""The op table (tests.op_rows.ROWS) through the edge backend, checked against torch eager.

Each row is exported (weights as module buffers, as in real models), lowered to LiteRT
builtins, run in the LiteRT interpreter (XNNPACK) and compared with the row's tolerance.
Rows the backend does not lower yet are strict xfails listed below with the reason.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from tests.edge._util import assert_close
from tests.op_rows import ROWS, OpModule, row_inputs

# row id -> why the edge backend does not lower it (yet)
_NO_INT_BITWISE = "LiteRT has no integer bitwise AND/OR/NOT or left-shift builtin"
_INT8_QUANT = "LiteRT's int8/uint8 kernels assume quantized tensors: plain int8/uint8 gives wrong results"
XFAIL: dict[str, str] = {
    "bitwise_and": _NO_INT_BITWISE,
    "bitwise_and_scalar": _NO_INT_BITWISE,
    "bitwise_or": _NO_INT_BITWISE,
    "bitwise_not": _NO_INT_BITWISE,
    "bitwise_left_shift": _NO_INT_BITWISE,
    "dt_i8_relu": _INT8_QUANT,
    "dt_i8_abs": "LiteRT ABS refuses a non-quantized int8 input (fails to prepare)",
}


def _params():
    for r in ROWS:
        marks = [pytest.mark.xfail(reason=XFAIL[r.id], strict=True)] if r.id in XFAIL else []
        yield pytest.param(r, id=r.id, marks=marks)


@pytest.mark.parametrize("row", list(_params()))
def test_op_row(row):
    import litert_torch

    module = OpModule(row, weights_as_params=True).eval()
    inputs = row_inputs(row, weights_as_params=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = litert_torch.convert(module, inputs)
    got = model(*inputs)
    with torch.no_grad():
        want = row.fn(*row.args, **row.kwargs)
    if isinstance(want, (tuple, list)):
        want = tuple(want)
    assert_close(got, want, row.rtol, row.atol, exact=row.kind != "float", what=row.id)
