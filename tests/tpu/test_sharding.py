"""SPMD artifacts: a data x model mesh with tensor-parallel Linear layers, run for real on 4
simulated CPU devices (in a subprocess, so other tests keep their single device) and
AOT-compiled for a v6e 2x2 slice."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.tpu.artifact_helpers import mlp_program
from tpu_export import tpu_backend

pytestmark = [pytest.mark.subprocess]

MESH = {"data": 2, "model": 2}
RULES = [
    (r".*fc1\.weight", ("model", None)),  # column-parallel: output features split
    (r".*fc1\.bias", ("model",)),
    (r".*fc2\.weight", (None, "model")),  # row-parallel: input features split
]
ROOT = Path(__file__).resolve().parents[2]


def _child(out_dir: str) -> None:
    """Runs with XLA_FLAGS=--xla_force_host_platform_device_count=4; writes results.json."""
    import jax

    from tests.tpu.artifact_helpers import assert_close_tree, mlp_inputs, rel_err

    assert len(jax.devices()) == 4, jax.devices()
    model, prog = mlp_program()
    plain = tpu_backend.export_program(prog)
    sharded = tpu_backend.export_program(prog, mesh=MESH, partition_rules=RULES)
    res = {}
    for batch in (4, 6):
        args, kwargs = mlp_inputs(batch, seed=batch)
        ref = model(*args, **kwargs)
        out, base = sharded(*args, **kwargs), plain(*args, **kwargs)
        assert_close_tree(out, ref, 1e-5)
        res[f"vs_unsharded_{batch}"] = rel_err(out["logits"], base["logits"])
    try:
        args, kwargs = mlp_inputs(3)
        sharded(*args, **kwargs)
    except ValueError as e:
        res["odd_batch_error"] = str(e)

    path = sharded.save(Path(out_dir) / "mlp_spmd.tpuexp")
    loaded = tpu_backend.load(path)
    args, kwargs = mlp_inputs(8, seed=8)
    out = loaded(*args, **kwargs)
    assert_close_tree(out, model(*args, **kwargs), 1e-5)
    res["loaded_vs_unsharded"] = rel_err(out["logits"], plain(*args, **kwargs)["logits"])

    # The stored-executable path on the 4-device mesh (a CPU compile stands in for a TPU one; only
    # an in-memory bundle runs a CPU executable: from a file, only TPU ones are ever loaded).
    tpu_backend.compile_on_devices(sharded, jax.devices(), target="cpu", topology="4dev", dim_values={"batch": 8})
    stored = sharded.to_program()
    out = stored(*args, **kwargs)
    assert stored.uses_stored_executable()
    assert_close_tree(out, model(*args, **kwargs), 1e-5)

    # AOT for a v6e 2x2 slice: per-device figures of the SPMD program vs the unsharded one.
    sharded.compiled.clear()
    c = sharded.compile_for("tpu-v6e", "2x2", dim_values={"batch": 8})
    u = plain.compile_for("tpu-v6e", dim_values={"batch": 8})
    res["aot"] = {"sharded": c.report, "unsharded": u.report}
    aot_path = sharded.save(Path(out_dir) / "mlp_spmd_v6e.tpuexp.zip")
    res["aot_manifest"] = tpu_backend.read_artifact(aot_path).manifest
    res["paths"] = [str(path), aot_path]
    tmp = Path(out_dir) / "results.json.tmp"
    tmp.write_text(json.dumps(res))
    tmp.rename(Path(out_dir) / "results.json")  # readers never see a partial file


@pytest.fixture(scope="module")
def child_results(tmp_path_factory):
    """Run ``_child`` once per test session: under pytest-xdist the workers share one run
    (the first to take the lock runs it, the others wait for its results)."""
    pytest.importorskip("libtpu")
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent  # this session's directory, common to its workers
    out = shared / "spmd_child"
    try:
        os.close(os.open(shared / "spmd_child.lock", os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        for _ in range(1200):
            if (out / "results.json").exists() or (out / "error.txt").exists():
                break
            time.sleep(0.5)
    else:
        out.mkdir()
        env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu",
                   PYTHONPATH=str(ROOT))
        code = f"from tests.tpu.test_sharding import _child; _child({str(out)!r})"
        proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=600)
        if proc.returncode != 0:
            (out / "error.txt").write_text(proc.stderr[-4000:])
    if (out / "error.txt").exists():
        pytest.fail("the 4-device child process failed:\n" + (out / "error.txt").read_text())
    return json.loads((out / "results.json").read_text())


def test_sharded_matches_unsharded_on_4_cpu_devices(child_results):
    assert child_results["vs_unsharded_4"] <= 1e-6 and child_results["vs_unsharded_6"] <= 1e-6
    assert child_results["loaded_vs_unsharded"] <= 1e-6
    assert "dim 0 is 3, which does not split over mesh axis 'data' (2 devices)" in child_results["odd_batch_error"]


def test_manifest_records_the_mesh_and_shardings(child_results):
    m = child_results["aot_manifest"]
    assert m["mesh"] == {"axis_names": ["data", "model"], "shape": [2, 2]}
    w = m["weights"]["tensors"]
    assert w["fc1.weight"]["sharding"] == ["model", None]
    assert w["fc1.bias"]["sharding"] == ["model"]
    assert w["fc2.weight"]["sharding"] == [None, "model"]
    assert w["fc2.bias"]["sharding"] == [None]
    sig = m["signatures"]["serving_default"]
    assert [i["sharding"] for i in sig["inputs"]] == [["data", None], ["data"]]
    assert sig["inputs"][0]["jax_shape"] == ["2*batch_per_data", 16]
    assert sig["outputs"][0]["sharding"] == ["data", None]
    assert m["partition_rules"]["weights"][0] == [r".*fc1\.weight", ["model", None]]


@pytest.mark.libtpu
def test_sharded_aot_for_v6e_2x2(child_results):
    sharded = child_results["aot"]["sharded"]
    plain = child_results["aot"]["unsharded"]
    assert sharded["devices_used"] == 4 and sharded["chips_used"] == 4 and sharded["libtpu_topology"] == "v6e:2x2"
    assert sharded["mesh"] == {"axis_names": ["data", "model"], "shape": [2, 2]}
    s, u = sharded["signatures"]["serving_default"], plain["signatures"]["serving_default"]
    assert s["input_shapes"] == u["input_shapes"] == [[8, 16], [8]]
    f = s["cost"]["flops"]
    assert f["whole_program"] == 4 * f["per_device"] and f["per_chip"] == f["per_device"]
    # Each device does a quarter of the matmuls (batch split in 2, hidden split in 2).
    assert f["per_device"] < 0.5 * u["cost"]["flops"]["per_device"]
    arg = s["memory"]["argument_bytes"]
    assert arg["per_device"] < u["memory"]["argument_bytes"]["per_device"]
    keys = [c["target"] + "-" + c["topology"] for c in child_results["aot_manifest"]["compiled"]]
    assert keys == ["tpu-v6e-2x2"]


def test_sharded_artifact_on_one_device_says_how_many_it_needs(child_results):
    with pytest.raises(tpu_backend.ShardingError, match=r"data=2xmodel=2 mesh \(4 devices\); only 1 device"):
        tpu_backend.load(child_results["paths"][0])


@pytest.mark.parametrize("mesh, rules, message", [
    (MESH, [(r"fc1\.weight", ("tensor", None))], r"axis 'tensor' is not in the mesh data=2xmodel=2"),
    ({"model": 3}, [(r"fc2\.weight", ("model", None))],
     r"weight 'fc2.weight' \(rule 'fc2\\\\.weight'\): dim 0 of size 8 does not divide over \('model',\) \(3 devices\)"),
    (MESH, [(r"fc1\.weight", ("model", None, None))], "has 3 entries but the tensor has rank 2"),
    (MESH, [(r"fc1\.weight", ("model", "model"))], "axis 'model' is used twice"),
])
def test_bad_partition_rules(mesh, rules, message):
    _, prog = mlp_program()
    with pytest.raises(tpu_backend.ShardingError, match=message):
        tpu_backend.export_program(prog, mesh=mesh, partition_rules=rules)


def test_rules_need_a_mesh():
    _, prog = mlp_program()
    with pytest.raises(tpu_backend.ExportError, match="partition_rules need a mesh"):
        tpu_backend.export_program(prog, partition_rules=RULES)
