"""explore(): the views Model Explorer is given (a .tflite as is; a TPU artifact's StableHLO with torch names), the
overlays, the self-contained HTML, and Model Explorer itself in headless Chromium (node count, overlay, screenshot).
"""

from __future__ import annotations

import json
import os
import re
import socket

import pytest

from tests.test_compare import build

pytest.importorskip("model_explorer", reason="the explore extra: pip install 'tpu-export[explore]'")
pytestmark = pytest.mark.slow  # the module's artifacts take ~5 s to convert

CONV_LINE = "y = torch.relu(self.conv(x))"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    import tpu_export

    model, args = build()
    return tpu_export.convert(model, args, targets=["cpu", "cpu-xla"], out_dir=str(tmp_path_factory.mktemp("ex")))


def _tflite_ops(path) -> int:
    from tpu_export.edge.inspect import op_histogram

    return sum(op_histogram(open(path, "rb").read()).values())


def _mlir_ops(text: str) -> int:
    """Ops of the main function: lines defining a value with a stablehlo op (no nested regions in these models)."""
    return len(re.findall(r"^\s+%[\w.]+(?::\d+)? = stablehlo\.", text, re.M))


def test_tpu_view_names_torch_parameters_and_source_lines(artifacts, tmp_path):
    from tpu_export.explore.app import build_view

    view = build_view(artifacts["cpu-xla"], workdir=str(tmp_path / "plain"))
    text = open(view.files[0]).read()
    for name in ("conv.weight.hwio", "conv.bias", "fc.weight.io", "fc.bias", "x"):  # stored names: docs/tpu.md
        assert f'loc("{name}")' in text
    assert "weights_list[" not in text and "xs[0]" not in text
    model, args = build()
    dbg = build_view(artifacts["cpu-xla"], model=model, sample_args=args, workdir=str(tmp_path / "debug"))
    text = open(dbg.files[0]).read()
    assert 'loc("conv.weight")' in text
    (name, _, graphs), = dbg.models
    nodes = graphs["graphCollections"][0]["graphs"][0]["nodes"]
    conv = [n for n in nodes if n["label"] == "stablehlo.convolution"]
    assert len(conv) == 1 and conv[0]["namespace"].startswith("conv/convolution/")
    attrs = {a["key"]: a["value"] for a in conv[0]["attrs"]}
    assert attrs["torch_node"] == "convolution_default" or attrs["torch_node"].startswith("convolution")
    path, line = attrs["source"].rsplit(":", 1)
    assert os.path.basename(path) == "test_compare.py"
    assert open(path).read().splitlines()[int(line) - 1].strip() == CONV_LINE
    assert len([n for n in nodes if n["id"][0].isdigit()]) == _mlir_ops(text) + 1  # + the Outputs node


def test_overlays_agree_with_the_compatibility_report(artifacts):
    from tpu_export.explore import write_overlays
    from tpu_export.targets.compat import compatibility

    tfl = artifacts["cpu"]
    written = write_overlays(tfl)
    assert set(written) == {"runs_on.cpu", "runs_on.gpu", "runs_on.coreml", "runs_on.metal", "runs_on.tflm",
                            "latency"}
    n_ops = _tflite_ops(tfl)
    data = open(tfl, "rb").read()
    for d, target in (("gpu", "android"), ("coreml", "ios")):
        res = json.load(open(written[f"runs_on.{d}"]))["serving_default"]["results"]
        assert len(res) == n_ops
        rep = compatibility(data, target, delegate=d)
        assert sum(not v["value"].startswith("CPU") for v in res.values()) == rep.accelerated_count
    cpu = json.load(open(written["runs_on.cpu"]))["serving_default"]["results"]
    assert set(v["value"] for v in cpu.values()) <= {"XNNPACK", "builtin kernel"}
    assert cpu["conv/convolution"]["value"] == "XNNPACK"  # XNNPACK takes a float CONV_2D
    lat = json.load(open(written["latency"]))["serving_default"]["results"]
    assert len(lat) == n_ops and all(v["value"] > 0 for v in lat.values())


def test_export_html_is_self_contained(artifacts, tmp_path):
    from tpu_export.explore import explore, write_overlays

    write_overlays(artifacts["cpu"], names=["runs_on.gpu"])
    out = explore(artifacts["cpu"], overlays=["runs_on.gpu"], export_html_path=str(tmp_path / "v.html"))
    page = open(out["html"]).read()
    assert "<svg" in page and "http://" not in page.replace("http://www.w3.org/2000/svg", "")
    assert page.count("class='node'") == _tflite_ops(artifacts["cpu"]) + 2  # + GraphInputs, GraphOutputs
    assert "GPU (LiteRT GPU delegate)" in page


def test_explore_refuses_a_missing_overlay(artifacts):
    from tpu_export.cli import main

    assert main(["explore", artifacts["cpu"], "--overlay", "no_such", "--export-html", os.devnull]) == 2


def _chromium_reason():
    from tpu_export.explore.browser import find_chromium

    return None if find_chromium() else "Chromium is missing (apt-get install -y chromium)"


@pytest.mark.chromium
@pytest.mark.slow
@pytest.mark.skipif(_chromium_reason() is not None, reason=str(_chromium_reason()))
def test_model_explorer_shows_the_tflite_with_an_overlay(artifacts, tmp_path):
    from tpu_export.explore import explore, write_overlays

    write_overlays(artifacts["cpu"], names=["runs_on.coreml"])
    png = str(tmp_path / "tflite.png")
    out = explore(artifacts["cpu"], port=_free_port(), overlays=["runs_on.coreml"], png=png)
    assert out["op_node_count"] == _tflite_ops(artifacts["cpu"]) + 2  # + GraphInputs, GraphOutputs
    assert "runs on: coreml" in out["page_text"]  # the overlay, loaded by Model Explorer
    head = open(png, "rb").read(8)
    assert head == b"\x89PNG\r\n\x1a\n" and os.path.getsize(png) > 10_000


@pytest.mark.chromium
@pytest.mark.slow
@pytest.mark.skipif(_chromium_reason() is not None, reason=str(_chromium_reason()))
def test_model_explorer_shows_the_tpu_artifact_with_torch_names(artifacts, tmp_path):
    from tpu_export.explore import compare, explore, numeric_overlay, overlay_path

    model, args = build()
    res = compare(model, artifacts["cpu-xla"], args)
    with open(overlay_path(artifacts["cpu-xla"], "numeric"), "w") as f:
        json.dump(numeric_overlay(res), f)
    png = str(tmp_path / "tpu.png")
    out = explore(artifacts["cpu-xla"], port=_free_port(), model=model, sample_args=args, png=png,
                  overlays=["numeric"])
    assert "max rel error vs torch eager" in out["page_text"]
    text = open(out["files"][0]).read()
    n_args = len(set(re.findall(r"%arg(\d+): ", text)))
    assert out["op_node_count"] == n_args + _mlir_ops(text) + 1  # arguments, ops, Outputs
    assert open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n" and os.path.getsize(png) > 10_000


def test_cli_inspect_overlays_then_explore_html(artifacts, tmp_path, capsys):
    from tpu_export.cli import main
    from tpu_export.explore import overlay_path

    tfl = artifacts["cpu"]
    assert main(["inspect", tfl, "--overlays"]) == 0
    err = capsys.readouterr().err
    for name in ("runs_on.gpu", "latency"):
        assert overlay_path(tfl, name) in err and os.path.isfile(overlay_path(tfl, name))
    html = str(tmp_path / "tpu.html")
    assert main(["explore", artifacts["cpu-xla"], "--export-html", html]) == 0
    page = open(html).read()
    assert "conv.bias" in page and "<svg" in page
    assert main(["inspect", artifacts["cpu-xla"], "--overlays"]) == 0  # XLA's per-op cost (test_explore_xla_cost)
    assert overlay_path(artifacts["cpu-xla"], "xla_cost.flops") in capsys.readouterr().err


def _litertlm_signature_ops(path) -> dict:
    """Signature -> op count of its subgraph, read from the .tflite section inside the .litertlm bundle."""
    from ai_edge_litert import schema_py_generated as s

    from tpu_export.edge.litertlm import read_litertlm

    (sec,) = [x for x in read_litertlm(path)["sections"] if x["type"] == "TFLiteModel"]
    with open(path, "rb") as f:
        f.seek(sec["begin"])
        m = s.Model.GetRootAs(f.read(sec["end"] - sec["begin"]), 0)
    return {m.SignatureDefs(i).SignatureKey().decode(): m.Subgraphs(m.SignatureDefs(i).SubgraphIndex())
            .OperatorsLength() for i in range(m.SignatureDefsLength())}


@pytest.mark.chromium
@pytest.mark.slow
@pytest.mark.skipif(_chromium_reason() is not None, reason=str(_chromium_reason()))
def test_model_explorer_shows_a_litertlm(tmp_path):
    pytest.importorskip("transformers")
    from tests.llm_models import save_model_dir
    from tpu_export.explore import explore
    from tpu_export.litert_torch.generative import export_hf

    path = export_hf.export(model=str(save_model_dir("llama", tmp_path / "llama")), output_dir=str(tmp_path / "lm"),
                            prefill_lengths=[8], cache_length=32, quantization_recipe="none")
    ops = _litertlm_signature_ops(path)
    assert set(ops) == {"prefill_8", "decode"}
    png = str(tmp_path / "lm.png")
    out = explore(path, port=_free_port(), png=png)
    # the graph Model Explorer opened, as its graph selector names it ("[1] decode  125 nodes")
    shown = re.search(r"\[\d+\]\s+(\w+)\s+(\d+) nodes", out["page_text"])
    assert shown is not None and shown.group(1) in ops
    assert out["op_node_count"] == int(shown.group(2)) == ops[shown.group(1)] + 2  # + GraphInputs, GraphOutputs
    assert open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n" and os.path.getsize(png) > 10_000
