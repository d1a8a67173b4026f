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


def test_convert_with_max_rel_err_meets_the_bound_where_plain_int8_does_not(tmp_path):
    """`convert --quantize dynamic_int8 --max-rel-err E`: the plain int8 file misses E against torch eager, the
    mixed one meets it on the LiteRT interpreter, and summary.json names the ops kept float."""
    from ai_edge_litert.interpreter import Interpreter

    from tpu_export.cli import main

    model, args = build()
    with torch.no_grad():
        want = model(*args).numpy()

    def err(path) -> float:
        run = Interpreter(model_path=str(path)).get_signature_runner()
        (name,) = run.get_input_details()
        return rel_err(next(iter(run(**{name: args[0].numpy()}).values())), want)

    spec = "tests.test_compare_mixed:build"
    assert main(["convert", spec, "--target", "cpu", "--quantize", "dynamic_int8", "-o", str(tmp_path / "q"),
                 "--quiet"]) == 0
    assert err(tmp_path / "q" / "cpu" / "cpu.tflite") > MAX_REL_ERR
    assert main(["convert", spec, "--target", "cpu", "--quantize", "dynamic_int8", "--max-rel-err",
                 str(MAX_REL_ERR), "-o", str(tmp_path / "m"), "--quiet"]) == 0
    assert err(tmp_path / "m" / "cpu" / "cpu.tflite") <= MAX_REL_ERR
    report = json.loads((tmp_path / "m" / "summary.json").read_text())["targets"]["cpu"]["mixed_precision"]
    assert report["float_ops"] and report["rel_err"]["mixed"] <= MAX_REL_ERR < report["rel_err"]["quantized"]
    assert set(_fc_weight_dtypes(tmp_path / "m" / "cpu" / "cpu.tflite").values()) == {"float32", "int8"}


def test_max_rel_err_needs_a_weight_scheme(capsys, tmp_path):
    import tpu_export
    from tpu_export.cli import main

    assert main(["convert", "tests.test_compare_mixed:build", "--target", "cpu", "--max-rel-err", "0.01",
                 "-o", str(tmp_path / "o")]) == 2  # a usage error
    assert "give --quantize dynamic_int8" in capsys.readouterr().err
    model, args = build()
    with pytest.raises(ValueError, match="max_rel_err: target cpu with quant_config 'fp16'"):
        tpu_export.convert(model, args, targets="cpu", out_dir=tmp_path / "p", quant_config="fp16", max_rel_err=0.01)
    assert not (tmp_path / "o").exists() and not (tmp_path / "p").exists()
