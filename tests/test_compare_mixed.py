"""Accuracy-driven mixed precision: dynamic int8 except the ops the output is most sensitive to, checked on the
LiteRT interpreter against torch eager (the module itself), and the float ops read back from the written file."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from tests.numerics import rel_err

pytestmark = pytest.mark.slow

MAX_REL_ERR = 1e-2


class Outlier(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(64, 128)
        self.b = torch.nn.Linear(128, 128)
        self.c = torch.nn.Linear(128, 16)
        with torch.no_grad():
            self.b.weight[:, 0] *= 50  # one outlier input column: int8 per output channel loses the rest of b

    def forward(self, x):
        return self.c(torch.tanh(self.b(torch.relu(self.a(x)))))


def build():
    torch.manual_seed(0)
    return Outlier().eval(), (torch.randn(4, 64),)


@pytest.fixture(scope="module")
def float_tflite(tmp_path_factory):
    import tpu_export

    model, args = build()
    return tpu_export.convert(model, args, targets="cpu", out_dir=str(tmp_path_factory.mktemp("mp")))["cpu"]


def _fc_weight_dtypes(path) -> dict:
    from tpu_export.targets.compat.model_ops import read_ops

    return {op.outputs[0].name: [t.dtype for t in op.inputs if t is not None and t.is_const][0]
            for op in read_ops(open(path, "rb").read()) if op.name == "FULLY_CONNECTED"}


def test_mixed_precision_keeps_the_sensitive_ops_float(float_tflite, tmp_path):
    from ai_edge_litert.interpreter import Interpreter

    from tpu_export.explore import mixed_precision

    model, args = build()
    out = str(tmp_path / "mixed.tflite")
    _, rep = mixed_precision(model, float_tflite, args, max_rel_err=MAX_REL_ERR, out=out)
    assert rep.rel_err["quantized"] > MAX_REL_ERR  # all int8 misses the bound: the search had work to do
    assert rep.float_ops and rep.quantized_ops
    assert rep.float_ops[0][0] == "b/linear"  # the outlier layer is the most sensitive
    # the written file, read back: the float ops have float32 weights, the others int8
    dtypes = _fc_weight_dtypes(out)
    assert {n: dtypes[n] for n, _, _ in rep.float_ops} == {n: "float32" for n, _, _ in rep.float_ops}
    assert {n: dtypes[n] for n, _, _ in rep.quantized_ops} == {n: "int8" for n, _, _ in rep.quantized_ops}
    # its output against the module itself, run here in the interpreter
    got = Interpreter(model_path=out).get_signature_runner()(x=args[0].numpy())["output_0"]
    with torch.no_grad():
        want = model(*args).numpy()
    assert rel_err(got, want) <= MAX_REL_ERR
    assert rep.bytes["quantized"] < rep.bytes["mixed"] < rep.bytes["float"]
    assert all(v > 0 for v in rep.latency_us.values())


def test_cli_mixed_precision(float_tflite, tmp_path, capsys):
    from tpu_export.cli import main

    out = str(tmp_path / "m.tflite")
    assert main(["compare", "tests.test_compare_mixed:build", float_tflite, "--quantize", "dynamic_int8",
                 "--max-rel-err", str(MAX_REL_ERR), "-o", out, "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["rel_err"]["mixed"] <= MAX_REL_ERR and [n for n, _, _ in rep["float_ops"]][0] == "b/linear"
    assert np.isfinite(rep["latency_us"]["mixed"])
    assert main(["compare", "tests.test_compare_mixed:build", float_tflite, "--quantize", "dynamic_int8"]) == 2
    assert "go together" in capsys.readouterr().err
