"""The xla_cost overlays: each StableHLO op of a TPU artifact compiled alone by XLA (libtpu's compile-only client for
a TPU target, jaxlib's CPU client for a CPU-only artifact), its flops checked against the analytic count of a
convolution and a matmul, and its node ids checked against the graph Model Explorer's adapter builds."""

from __future__ import annotations

import json
import os
import re
import socket

import pytest
import torch

pytestmark = pytest.mark.slow  # a TPU AOT compile and one XLA compile per op

N, CIN, H, COUT, K, HIDDEN = 2, 3, 8, 8, 3, 16
HO = H - K + 1  # no padding: every tap of the kernel counts


class ConvMatmul(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(CIN, COUT, K)
        self.fc = torch.nn.Linear(COUT * HO * HO, HIDDEN)

    def forward(self, x):
        return self.fc(torch.relu(self.conv(x)).flatten(1))


# 2*M*N*K of each: the convolution as the matmul of its im2col (M = N*Ho*Wo, N = Cout, K = Cin*kh*kw)
CONV_FLOPS = 2 * (N * HO * HO) * COUT * (CIN * K * K)
DOT_FLOPS = 2 * N * HIDDEN * (COUT * HO * HO)


def _convert(out, target):
    import tpu_export

    torch.manual_seed(0)
    return tpu_export.convert(ConvMatmul().eval(), (torch.randn(N, CIN, H, H),), targets=[target],
                              out_dir=str(out))[target]


def _nodes(artifact, tmp_path) -> dict:
    """Model Explorer's nodes of the artifact's view (its MLIR adapter's graph): id -> node."""
    pytest.importorskip("model_explorer", reason="the explore extra: pip install 'tpu-export[explore]'")
    from tpu_export.explore.app import build_view

    view = build_view(artifact, workdir=str(tmp_path / "view"))
    (_, _, graphs), = view.models
    return {n["id"]: n for n in graphs["graphCollections"][0]["graphs"][0]["nodes"]}


def _by_op(per_node: dict, op: str) -> str:
    (nid,) = [k for k, v in per_node.items() if v["ops"] == [op]]
    return nid


@pytest.fixture(scope="module")
def tpu_artifact(tmp_path_factory):
    pytest.importorskip("libtpu", reason="AOT compilation for TPU needs libtpu (pip install 'libtpu==0.0.42.*')")
    return _convert(tmp_path_factory.mktemp("xc_tpu"), "tpu-v6e")


@pytest.mark.libtpu
def test_tpu_artifact_costs_match_the_analytic_flops(tpu_artifact, tmp_path):
    from tpu_export.explore import overlay_path, write_overlays
    from tpu_export.explore.xla_cost import xla_cost
    from tpu_export.tpu_backend.artifact import read_artifact

    res = xla_cost(tpu_artifact)
    per = res["per_node"]
    conv, dot = _by_op(per, "stablehlo.convolution"), _by_op(per, "stablehlo.dot_general")
    assert per[conv]["flops"] == CONV_FLOPS and per[dot]["flops"] == DOT_FLOPS
    assert per[conv]["seconds"] > 0 and per[dot]["seconds"] > 0 and per[conv]["bytes"] > 0
    # costed alone, the ops' flops add up to XLA's own figure for the whole compiled program (report.json): no op
    # is missed or counted twice (bytes do not add up: fusion keeps intermediates out of HBM)
    (report,) = read_artifact(tpu_artifact).reports().values()
    whole = report["signatures"]["serving_default"]["cost"]["flops"]["per_device"]
    assert sum(v["flops"] for v in per.values()) == pytest.approx(whole, rel=1e-6)

    nodes = _nodes(tpu_artifact, tmp_path)
    assert set(per) <= set(nodes)
    # the TPU form of each op sits in jax's platform_dependent case: the node is the case choosing it
    assert "conv_general_dilated" in nodes[conv]["namespace"] and nodes[conv]["label"] == "stablehlo.case"
    assert "dot_general" in nodes[dot]["namespace"]
    for nid, v in per.items():
        assert nodes[nid]["label"] == v["op"]

    written = write_overlays(tpu_artifact)
    assert set(written) == {"xla_cost.flops", "xla_cost.bytes", "xla_cost.time"}
    assert written["xla_cost.flops"] == overlay_path(tpu_artifact, "xla_cost.flops")
    flops = json.load(open(written["xla_cost.flops"]))["main"]["results"]
    assert flops[conv]["value"] == CONV_FLOPS and set(flops) <= set(nodes)
    time_us = json.load(open(written["xla_cost.time"]))["main"]["results"]
    assert time_us[dot]["value"] == pytest.approx(per[dot]["seconds"] * 1e6)


def test_cpu_artifact_costs_and_the_view(tmp_path):
    from tpu_export.cli import main
    from tpu_export.explore import ExploreError, explore, overlay_path, write_overlays
    from tpu_export.explore.xla_cost import xla_cost

    art = _convert(tmp_path / "cpu", "cpu-xla")
    per = xla_cost(art)["per_node"]
    conv, dot = _by_op(per, "stablehlo.convolution"), _by_op(per, "stablehlo.dot_general")
    assert per[conv]["flops"] == CONV_FLOPS and per[dot]["flops"] == DOT_FLOPS
    assert not any("seconds" in v for v in per.values())  # XLA's CPU cost analysis estimates no time
    nodes = _nodes(art, tmp_path)
    assert nodes[conv]["label"] == "stablehlo.convolution" and nodes[dot]["label"] == "stablehlo.dot_general"

    with pytest.raises(ValueError, match="xla_cost.time"):
        write_overlays(art, names=["xla_cost.time"])
    with pytest.raises(ValueError, match=r"target='tpu-v6e': .* exported for \['cpu'\] only"):
        write_overlays(art, target="tpu-v6e")
    with pytest.raises(ValueError, match="'runs_on.gpu' is not written for a TPU artifact"):
        write_overlays(art, names=["runs_on.gpu"])
    assert main(["inspect", art, "--overlays"]) == 0
    assert os.path.isfile(overlay_path(art, "xla_cost.flops"))
    assert not os.path.exists(overlay_path(art, "xla_cost.time"))
    html = explore(art, overlays=["xla_cost.flops"], export_html_path=str(tmp_path / "v.html"))["html"]
    assert f"<td>{float(CONV_FLOPS)}</td>" in open(html).read()
    with pytest.raises(ExploreError, match="model="):
        explore(art, overlays=["xla_cost.flops"], model=ConvMatmul(), sample_args=(torch.randn(N, CIN, H, H),),
                export_html_path=str(tmp_path / "w.html"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _chromium_reason():
    from tpu_export.explore.browser import find_chromium

    return None if find_chromium() else "Chromium is missing (apt-get install -y chromium)"


@pytest.mark.libtpu
@pytest.mark.chromium
@pytest.mark.skipif(_chromium_reason() is not None, reason=str(_chromium_reason()))
def test_model_explorer_loads_the_xla_cost_overlay(tpu_artifact, tmp_path):
    pytest.importorskip("model_explorer", reason="the explore extra: pip install 'tpu-export[explore]'")
    from tpu_export.explore import explore, write_overlays

    path = write_overlays(tpu_artifact, names=["xla_cost.flops"])["xla_cost.flops"]
    total = sum(v["value"] for v in json.load(open(path))["main"]["results"].values())
    png = str(tmp_path / "cost.png")
    out = explore(tpu_artifact, port=_free_port(), overlays=["xla_cost.flops"], png=png)
    assert "XLA flops (tpu-v6e, serving_default" in out["page_text"]  # the overlay, as Model Explorer lists it
    # Model Explorer's own sum over the nodes it matched the overlay's keys to: every key found a node
    assert re.search(rf"Sum\s+{total:.0f}\b", out["page_text"]), out["page_text"][:2000]
    assert open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n" and os.path.getsize(png) > 10_000


@pytest.mark.libtpu
def test_each_signature_of_an_lm_artifact_keys_its_own_graph(tmp_path):
    """A two-signature artifact (prefill_8, decode): the view names each signature's graph after it, so an overlay
    of decode's ops lands on decode's graph only (one shared `main` put it on prefill's)."""
    pytest.importorskip("libtpu", reason="AOT compilation for TPU needs libtpu (pip install 'libtpu==0.0.42.*')")
    pytest.importorskip("transformers")
    from tests.llm_models import save_model_dir
    from tpu_export.cli import main
    from tpu_export.explore import explore, write_overlays
    from tpu_export.tpu_backend.artifact import read_artifact

    out = tmp_path / "lm"
    assert main(["convert-lm", str(save_model_dir("llama", tmp_path / "llama")), "--target", "tpu-v6e",
                 "--prefill", "8", "--cache", "32", "-o", str(out), "--quiet"]) == 0
    art = str(out / "tpu-v6e" / "model.tpuexp")
    path = write_overlays(art, signature="decode", names=["xla_cost.flops"])["xla_cost.flops"]
    (gid, data), = json.load(open(path)).items()
    assert gid == "decode"
    values = [v["value"] for v in data["results"].values()]
    (report,) = read_artifact(art).reports().values()
    whole = report["signatures"]["decode"]["cost"]["flops"]["per_device"]
    assert sum(values) == pytest.approx(whole, rel=0.02)  # XLA simplifies the whole program a little further
    page = open(explore(art, overlays=["xla_cost.flops"], export_html_path=str(tmp_path / "v.html"))["html"]).read()
    sections = {s.split("</h2>")[0].split(" (")[0]: s for s in page.split("<h2>")[1:]}
    filled = {head for head, s in sections.items() if re.search(r"<td>[0-9.]+</td></tr>", s)}
    assert filled == {"decode: decode"}
    got = re.findall(r"<td>([0-9.]+)</td></tr>", sections["decode: decode"])
    assert sorted(map(float, got)) == sorted(values)
