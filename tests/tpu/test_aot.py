"""AOT compilation for real TPU generations on this CPU-only host, through libtpu."""

from __future__ import annotations

import json
import logging

import pytest
import torch

from tests.tpu.artifact_helpers import assert_close_tree, mlp_program, zoo_program
from tpu_export import converter, tpu_backend
from tpu_export.tpu_backend.chips import CHIPS

pytestmark = [pytest.mark.libtpu]

pytest.importorskip("libtpu", reason="AOT compilation for TPU needs libtpu (pip install 'libtpu==0.0.42.*')")

GENERATIONS = [("tpu-v5e", None, "TPU v5 lite"), ("tpu-v6e", "2x2", "TPU v6 lite"), ("tpu-v7x", "2x2x1", "TPU7x")]


@pytest.fixture(scope="module")
def bert_bundle():
    """A BERT encoder (int token ids + attention mask): its TPU compiles take well under a second."""
    model, args, prog = zoo_program("bert")
    bundle = tpu_backend.export_program(prog)
    for target, topology, _ in GENERATIONS:
        bundle.compile_for(target, topology)
    return bundle


@pytest.mark.parametrize("target, topology, kind", GENERATIONS)
def test_report_has_cost_and_memory(bert_bundle, target, topology, kind):
    c = next(c for c in bert_bundle.compiled if c.target == target)
    chip = CHIPS[target]
    assert c.platform == "tpu" and c.device_kind == kind and c.num_devices == 1
    r = c.report
    assert r["chip"]["hbm_bytes_per_chip"] == chip.hbm_bytes_per_chip and r["chip"]["source"].startswith("https://")
    s = r["signatures"]["serving_default"]
    assert s["input_shapes"] == [[1, 16], [1, 16]]
    assert s["compile_seconds"] > 0 and s["executable_bytes"] > 1000
    for key in ("flops", "bytes_accessed"):
        fig = s["cost"][key]
        assert fig["per_device"] > 0 and fig["per_chip"] == fig["per_device"] == fig["whole_program"]
    assert s["cost"]["optimal_seconds"]["value"] > 0 and "whole_program" in s["cost"]["optimal_seconds"]["scope"]
    weight_bytes = sum(t.numel() * t.element_size() for t in bert_bundle.weights.values())
    assert s["memory"]["argument_bytes"]["per_device"] >= weight_bytes + 2 * 16 * 4
    assert s["memory"]["output_bytes"]["per_device"] > 0
    assert s["hbm"]["available_bytes_per_device"] == chip.hbm_bytes_per_device
    assert 0 < s["hbm"]["fraction_used"] < 0.01
    assert 0 < s["implied_utilisation_at_bf16_peak"] < 1
    assert "per_chip" in r["scopes"] and "whole_program" in r["scopes"]


def test_flops_of_an_mlp_match_its_matmuls():
    _, prog = mlp_program()
    bundle = tpu_backend.export_program(prog)
    c = bundle.compile_for("tpu-v6e", dim_values={"batch": 8})
    s = c.report["signatures"]["serving_default"]
    assert s["input_shapes"] == [[8, 16], [8]]
    matmul = 2 * 8 * (16 * 32 + 32 * 8)
    assert matmul <= s["cost"]["flops"]["per_device"] < 2 * matmul


def test_compiled_artifact_round_trip(bert_bundle, tmp_path, caplog):
    model, args, _ = zoo_program("bert")
    path = bert_bundle.save(tmp_path / "bert.tpuexp.zip")
    with caplog.at_level(logging.INFO, logger="tpu_export.tpu_backend.runtime"):
        loaded = tpu_backend.load(path, use_compiled=True)
        out = loaded(*args)
    with torch.no_grad():
        ref = model(*args)
    assert_close_tree(out, ref, 1e-5)
    keys = sorted(c["target"] + "-" + c["topology"] for c in loaded.manifest["compiled"])
    assert keys == ["tpu-v5e-1x1", "tpu-v6e-2x2", "tpu-v7x-2x2x1"]
    # On this CPU host the TPU executables are not usable: it says so once, with the reason.
    msgs = [r.getMessage() for r in caplog.records if "compiling the StableHLO" in r.getMessage()]
    assert len(msgs) == 1 and "tpu-v6e-2x2 is for tpu, this host runs cpu" in msgs[0]
    from tpu_export.tpu_backend.artifact.load import read_artifact

    art = read_artifact(path)
    assert {k: v["signatures"]["serving_default"]["cost"]["flops"] for k, v in art.reports().items()} == \
        {c.key: c.report["signatures"]["serving_default"]["cost"]["flops"] for c in bert_bundle.compiled}


def test_tpu7x_figures_are_per_tensorcore():
    _, prog = mlp_program()
    c = tpu_backend.export_program(prog).compile_for("tpu-v7x", dim_values={"batch": 2})
    r = c.report
    assert r["chip"]["devices_per_chip"] == 2 and r["devices_used"] == 1 and r["chips_used"] == 1
    assert r["chip"]["hbm_bytes_per_device"] * 2 == r["chip"]["hbm_bytes_per_chip"] == 192 * 2**30
    assert "TensorCore on tpu7x" in r["scopes"]


def test_hbm_overflow_reports_needed_and_available():
    _, prog = mlp_program()
    bundle = tpu_backend.export_program(prog)
    with pytest.raises(tpu_backend.HbmOverflowError) as ei:
        bundle.compile_for("tpu-v5e", dim_values={"batch": 8}, hbm_bytes=4096)
    e = ei.value
    assert e.available == 4096 and e.needed > 4096
    assert f"needs {e.needed / 1024:.2f} KiB ({e.needed} bytes) of HBM per device" in str(e)
    assert "4.00 KiB (4096 bytes)" in str(e) and "arguments" in str(e)


def test_hbm_overflow_found_by_the_tpu_compiler():
    """An unbounded batch compiled at 2**28 rows: 56 GiB of temporaries on a 16 GiB v5e."""
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8)).eval()
    prog = converter.prepare(model, (torch.randn(4, 16),), dynamic_shapes=({0: torch.export.Dim("batch")},))
    bundle = tpu_backend.export_program(prog)
    with pytest.raises(tpu_backend.HbmOverflowError, match=r"needs 56\.00 GiB .* only 15\.75 GiB") as ei:
        bundle.compile_for("tpu-v5e", dim_values={"batch": 2**28})
    assert ei.value.needed > ei.value.available > 15 * 2**30
    assert not bundle.compiled


@pytest.mark.parametrize("target, topology, message", [
    ("tpu-v6e", "3x3", r"invalid topology '3x3' for tpu-v6e; valid topologies: 1x1, 2x2, 2x4, 4x4"),
    ("tpu-v5e", "2x2x2", r"invalid topology '2x2x2' for tpu-v5e"),
    ("tpu-v5p", "2x3x4", r"valid topologies: 2x2x1, 2x2x2.*\(or any AxBxC with sides 1, 2 or multiples of 4\)"),
    ("tpu-v9", None, r"unknown TPU target 'tpu-v9'; valid targets: tpu-v5e, tpu-v6e, tpu-v5p, tpu-v7x"),
])
def test_invalid_topology_lists_the_valid_ones(target, topology, message):
    _, prog = mlp_program()
    bundle = tpu_backend.export_program(prog)
    with pytest.raises(tpu_backend.InvalidTopologyError, match=message):
        bundle.compile_for(target, topology)


def test_topology_names():
    from tpu_export.tpu_backend.chips import parse_topology

    assert parse_topology("tpu-v6e", "v6e:2x2").libtpu_name == "v6e:2x2"
    assert parse_topology("v7x", "2x2").libtpu_name == "tpu7x:2x2x1"
    assert parse_topology("tpu-v7x", "2x2x1").devices == 8
    assert parse_topology("tpu-v5p", "4x4x8").chips == 128


def test_bundle_without_tpu_platform_is_refused():
    _, prog = mlp_program()
    bundle = tpu_backend.export_program(prog, platforms=("cpu",))
    with pytest.raises(tpu_backend.AotError, match="needs platforms including 'tpu'"):
        bundle.compile_for("tpu-v6e")


def test_report_json_is_plain_data(bert_bundle):
    for c in bert_bundle.compiled:
        assert json.loads(json.dumps(c.report)) == c.report
