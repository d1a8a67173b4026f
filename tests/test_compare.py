"""compare(): every intermediate tensor of an artifact against torch eager, on the real runtimes (the LiteRT
interpreter; jax's CPU backend for the TPU artifact's debug export), and a planted wrong lowering named by node and
source line."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from tests.numerics import rel_err

pytestmark = pytest.mark.slow

TOL = 1e-4  # float32 on both sides: 1e-7 measured per node; a wrong op is off by > 1e-1


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.fc = torch.nn.Linear(4 * 6 * 6, 5)

    def forward(self, x):
        y = torch.relu(self.conv(x))
        y = torch.sigmoid(y) * y  # the node the tests below plant a wrong lowering at
        return self.fc(y.flatten(1))


SIGMOID_LINE = "y = torch.sigmoid(y) * y"


def build():
    """The CLI's MODEL factory: (module, sample args)."""
    torch.manual_seed(0)
    return Net().eval(), (torch.randn(1, 3, 6, 6),)


def _convert(out, target):
    import tpu_export

    model, args = build()
    return tpu_export.convert(model, args, targets=target, out_dir=str(out))[target]


@pytest.fixture(scope="module")
def tflite(tmp_path_factory):
    return _convert(tmp_path_factory.mktemp("cmp"), "cpu")


def _plant(monkeypatch, registry):
    # sigmoid lowered as tanh: a lowering wrong at exactly one node
    from torch.ops import aten

    monkeypatch.setitem(registry._table, aten.sigmoid.default, registry.get(aten.tanh.default))


def test_tflite_matches_torch_layer_by_layer(tflite):
    from tpu_export.explore import compare

    model, args = build()
    res = compare(model, tflite, args, tolerance=TOL)
    assert res.first_divergence is None, res.table()
    ops = {r.op for r in res.rows}
    assert {"aten.relu.default", "aten.sigmoid.default", "aten.mul.Tensor"} <= ops, res.table()
    assert all(r.max_rel <= TOL for r in res.rows)
    # the artifact's output against the module itself (not the captured graph): the interpreter, run directly
    from ai_edge_litert.interpreter import Interpreter

    got = Interpreter(model_path=tflite).get_signature_runner()(x=args[0].numpy())["output_0"]
    with torch.no_grad():
        want = model(*args).numpy()
    assert rel_err(got, want) <= TOL
    assert res.outputs["output_0"]["max_rel"] <= TOL


def test_tflite_planted_divergence_is_named(tmp_path, monkeypatch):
    from tpu_export.edge.registry import EDGE
    from tpu_export.explore import compare

    with monkeypatch.context() as m:
        _plant(m, EDGE)
        bad = _convert(tmp_path, "cpu")
    model, args = build()
    res = compare(model, bad, args, tolerance=TOL)
    first = res.first_divergence
    assert first is not None and first.node == "sigmoid", res.table()
    assert first.op == "aten.sigmoid.default"
    assert "test_compare.py" in first.source and SIGMOID_LINE in first.source
    assert first.max_rel > 0.1
    # the nodes before it are still right
    before = res.rows[: res.rows.index(first)]
    assert before and all(not r.over for r in before)
    assert "first node past" in res.table() and "sigmoid" in res.table()


def test_tpu_planted_divergence_is_named(tmp_path, monkeypatch):
    from tpu_export.explore import compare
    from tpu_export.tpu_backend.lowering.registry import JAX_LOWERINGS

    good = _convert(tmp_path / "good", "cpu-xla")
    model, args = build()
    res = compare(model, good, args, tolerance=TOL)
    assert res.first_divergence is None, res.table()
    assert res.outputs["output_0"]["max_rel"] <= TOL
    with monkeypatch.context() as m:
        _plant(m, JAX_LOWERINGS)
        bad = _convert(tmp_path / "bad", "cpu-xla")
        res = compare(model, bad, args, tolerance=TOL)
    first = res.first_divergence
    assert first is not None and first.node == "sigmoid", res.table()
    assert SIGMOID_LINE in first.source
    assert res.outputs["output_0"]["max_rel"] > TOL  # the artifact itself carries the wrong lowering


def test_cli_compare_json_and_numeric_overlay(tflite, capsys):
    from tpu_export.cli import main
    from tpu_export.explore import overlay_path

    assert main(["compare", "tests.test_compare:build", tflite, "--json", "--overlays",
                 "--tolerance", str(TOL)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["first_divergence"] is None and out["kind"] == "tflite"
    assert any(r["node"] == "sigmoid" for r in out["rows"])
    overlay = json.load(open(overlay_path(tflite, "numeric")))
    results = overlay["serving_default"]["results"]
    assert "sigmoid" in results and np.isfinite(results["sigmoid"]["value"])


def test_cli_compare_refuses_a_bad_tolerance(tflite, capsys):
    from tpu_export.cli import main

    assert main(["compare", "tests.test_compare:build", tflite, "--tolerance", "0"]) == 2
    assert "--tolerance" in capsys.readouterr().err
