"""The TPU AOT compile in a child process (tpu_backend/compile_worker.py): the same executable bytes and
report as the compile in this process, compile_many and the AOT cache through it, one clear error line for a
child that fails (a refusal keeps its type), the time limit, and the option that keeps the compile here."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from tpu_export import converter, tpu_backend

pytestmark = [pytest.mark.subprocess, pytest.mark.libtpu]

pytest.importorskip("libtpu", reason="AOT compilation for TPU needs libtpu (pip install 'libtpu==0.0.42.*')")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _bundle(width=32, mesh=None):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, width), torch.nn.GELU(), torch.nn.Linear(width, 8)).eval()
    kw = {"mesh": mesh, "partition_rules": [(r"0\.weight", ("model", None))]} if mesh else {}
    return tpu_backend.export_program(converter.prepare(model, (torch.randn(4, 16),)), **kw)


def _comparable(report: dict) -> dict:
    """A report without what differs between two compiles of one module: the seconds, the child's own note and
    the executable's size (libtpu's stamp, see _FRESH: checked apart, within a few bytes)."""
    r = json.loads(json.dumps(report))
    r.pop("compile_worker", None)
    for s in r["signatures"].values():
        s.pop("compile_seconds")
        s.pop("executable_bytes")
    return r


# libtpu stamps each executable with how many modules this process compiled before it (a few bytes), so a
# compile is compared byte for byte with the first compile of a fresh process: the child's is always that
_FRESH = """
import hashlib, json, sys, torch, converter, tpu_backend
from tests.test_tpu_compile_worker import _bundle
b = _bundle(**json.loads(sys.argv[1]))
here = b.compile_for("tpu-v6e", "2x2", in_process=True, cache_dir=False)   # this process's first compile
child = b.compile_for("tpu-v6e", "2x2", in_process=False, cache_dir=False)
h = lambda c: hashlib.sha256(c.signatures["serving_default"].executable).hexdigest()
print(json.dumps({"here": h(here), "child": h(child), "n": len(here.signatures["serving_default"].executable),
                  "worker": "compile_worker" in child.report and "compile_worker" not in here.report,
                  "kinds": [here.device_kind, child.device_kind, here.num_devices, child.num_devices]}))
"""


def test_child_compile_is_the_in_process_compile_byte_for_byte():
    mesh = {"data": 2, "model": 2}  # the shardings cross in job.json; a one-device program is the simpler case
    r = subprocess.run([sys.executable, "-c", _FRESH, json.dumps({"mesh": mesh})], capture_output=True, text=True,
                       cwd=ROOT, timeout=300, env=dict(os.environ, PYTHONPATH=ROOT))
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["here"] == got["child"] and got["n"] > 10_000 and got["worker"]
    assert got["kinds"] == ["TPU v6 lite", "TPU v6 lite", 4, 4]


def test_child_report_equals_in_process_and_the_artifact_runs(tmp_path):
    b = _bundle()
    here = b.compile_for("tpu-v5e", in_process=True, cache_dir=False)
    child = b.compile_for("tpu-v5e", in_process=False, cache_dir=False)
    assert _comparable(child.report) == _comparable(here.report)
    assert child.report["signatures"]["serving_default"]["cost"]["flops"]["per_device"] > 2 * 4 * 16 * 32
    w = child.report["compile_worker"]
    assert w["wall_seconds"] > 0 and w["peak_rss_bytes"] > 100 * 2**20
    assert [c.key for c in b.compiled] == ["tpu-v5e-1x1"]  # the child's result replaced the in-process one
    # two compiles of one module differ only in libtpu's stamp (see _FRESH)
    assert abs(len(child.signatures["serving_default"].executable)
               - len(here.signatures["serving_default"].executable)) < 64
    path = b.save(tmp_path / "m.tpuexp")
    x = torch.randn(4, 16)
    loaded = tpu_backend.load(path)
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8)).eval()
    with torch.no_grad():
        torch.testing.assert_close(torch.as_tensor(loaded(x)), ref(x), rtol=1e-5, atol=1e-6)


def test_compile_many_and_the_cache_through_children(tmp_path):
    gens = [("tpu-v5e", None), ("tpu-v6e", "2x2")]
    b = _bundle()
    got = tpu_backend.compile_many(b, gens, in_process=False, cache_dir=tmp_path)
    assert [c.target for c in got] == ["tpu-v5e", "tpu-v6e"] and len(b.compiled) == 2
    assert all(c.report["signatures"]["serving_default"]["compile_cache"] == "miss" for c in got)
    # the children stored entries under the keys this process computes: an in-process compile hits them
    for c, (t, topo) in zip(got, gens):
        again = _bundle().compile_for(t, topo, in_process=True, cache_dir=tmp_path)
        rep = again.report["signatures"]["serving_default"]
        assert rep["compile_cache"] == "hit"
        assert again.signatures["serving_default"].executable == c.signatures["serving_default"].executable
        assert _comparable(again.report)["signatures"]["serving_default"]["cost"] == \
            _comparable(c.report)["signatures"]["serving_default"]["cost"]


def test_a_broken_module_is_one_error_line_naming_signature_target_and_child(monkeypatch):
    b = _bundle()
    sig = b.signatures["serving_default"]
    monkeypatch.setattr(type(sig), "serialize", lambda self: b"not a jax export")
    with pytest.raises(tpu_backend.AotError) as e:
        b.compile_for("tpu-v6e", in_process=False, cache_dir=False)
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith("signature 'serving_default': the tpu-v6e (1x1) compile worker (python -m "
                          "tpu_export.tpu_backend.compile_worker) failed with exit status 1; its last stderr line: ")
    assert len(msg) < 1000 and b.compiled == []


def test_a_refusal_in_the_child_keeps_its_type():
    b = _bundle()
    with pytest.raises(tpu_backend.HbmOverflowError, match=r"^signature 'serving_default' needs .* on tpu-v6e \(1x1\) "
                       r"but a device has 1000 bytes") as e:
        b.compile_for("tpu-v6e", hbm_bytes=1000, in_process=False, cache_dir=False)
    assert e.value.available == 1000 and e.value.needed > 4 * 16 * 4


def test_the_time_limit():
    with pytest.raises(tpu_backend.AotError, match=r"^signature 'serving_default': the tpu-v6e \(1x1\) compile "
                       r"worker did not finish in 0.05 s and was stopped \(compile_for\(timeout_s=\.\.\.\)"):
        _bundle().compile_for("tpu-v6e", in_process=False, timeout_s=0.05, cache_dir=False)


def test_the_option_keeps_the_compile_in_this_process(tmp_path):
    from tpu_export.targets.checks import package
    from tpu_export.targets.options import OptionsError

    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU()).eval()
    prog = converter.prepare(m, (torch.randn(2, 8),))
    for in_process, worker in ((True, False), (False, True), (None, False)):  # None: a tiny model stays here
        out = package("tpu-v6e", prog, str(tmp_path / str(in_process)), aot=True, aot_in_process=in_process,
                      say=lambda s: None)
        (report,) = tpu_backend.read_artifact(out["model.tpuexp"]).reports().values()
        assert ("compile_worker" in report) is worker
        assert report["signatures"]["serving_default"]["cost"]["flops"]["per_device"] > 2 * 2 * 8 * 4
    with pytest.raises(OptionsError, match=r"option aot_in_process must be True \(compile in this process\), False"):
        package("tpu-v6e", prog, str(tmp_path / "bad"), aot=True, aot_in_process="child", say=lambda s: None)


def test_an_llm_with_donated_caches_compiles_in_the_child_as_here():
    """decode with its KV caches donated (aliased inputs): the child's report, its LLM section (bytes per token
    from the compiled HLO's HBM traffic) included, is the in-process one."""
    transformers = pytest.importorskip("transformers")
    from tpu_export.converter.llm import prepare_lm
    from tpu_export.tpu_backend.llm import export_lm

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    prog, spec = prepare_lm(transformers.LlamaForCausalLM(cfg).eval(), prefill_lengths=(16,), cache_len=64)
    bundle, _ = export_lm(prog, spec, platforms=("tpu", "cpu"), signatures=["decode"])
    here = bundle.compile_for("tpu-v6e", in_process=True, cache_dir=False)
    child = bundle.compile_for("tpu-v6e", in_process=False, cache_dir=False)
    assert list(child.signatures) == ["decode"]
    assert _comparable(child.report) == _comparable(here.report)
    sizes = [len(c.signatures["decode"].executable) for c in (here, child)]
    assert abs(sizes[0] - sizes[1]) < 64 and sizes[1] == child.report["signatures"]["decode"]["executable_bytes"]
    dec = child.report["llm"]["decode"]["hbm_estimate"]
    assert dec["bytes_per_step"] >= 4 * 2 * 64 * 16 * 4  # at least the 4 float32 caches of [1, 2, 64, 16], read
