"""The AOT cache (tpu_backend/compile_cache.py): a repeated compile of the same program for the same
slice is a hit that returns the very executable and XLA's figures, in a fraction of the time; any
change to the program or the slice is a miss; a damaged entry is compiled afresh."""

from __future__ import annotations

import os

import pytest
import torch

from tpu_export import converter, tpu_backend

pytestmark = [pytest.mark.libtpu]

pytest.importorskip("libtpu", reason="AOT compilation for TPU needs libtpu (pip install 'libtpu==0.0.42.*')")


def _bundle(width=32):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, width), torch.nn.GELU(), torch.nn.Linear(width, 8)).eval()
    return tpu_backend.export_program(converter.prepare(model, (torch.randn(2, 16),)))


def _sig(c):
    return c.signatures["serving_default"], c.report["signatures"]["serving_default"]


def test_second_compile_is_a_cache_hit(tmp_path):
    first, rep1 = _sig(_bundle().compile_for("tpu-v6e", "2x2", cache_dir=tmp_path))
    again, rep2 = _sig(_bundle().compile_for("tpu-v6e", "2x2", cache_dir=tmp_path))  # a fresh export, same program
    assert rep1["compile_cache"] == "miss" and rep2["compile_cache"] == "hit"
    assert again.executable == first.executable and len(first.executable) > 1000
    assert rep2["compiled_seconds_when_stored"] == rep1["compile_seconds"]
    assert rep2["compile_seconds"] < rep1["compile_seconds"]
    for k in ("cost", "memory", "hbm", "roofline", "executable_bytes", "input_shapes"):
        assert rep2[k] == rep1[k], k
    entries = sorted(os.path.relpath(os.path.join(d, f), tmp_path) for d, _, fs in os.walk(tmp_path) for f in fs)
    assert len(entries) == 2 and entries[0].endswith(".exe") and entries[1].endswith(".json")


def test_a_changed_program_or_slice_is_a_miss(tmp_path):
    _bundle().compile_for("tpu-v6e", "2x2", cache_dir=tmp_path)
    assert _sig(_bundle(width=48).compile_for("tpu-v6e", "2x2", cache_dir=tmp_path))[1]["compile_cache"] == "miss"
    assert _sig(_bundle().compile_for("tpu-v6e", None, cache_dir=tmp_path))[1]["compile_cache"] == "miss"
    assert _sig(_bundle().compile_for("tpu-v5e", None, cache_dir=tmp_path))[1]["compile_cache"] == "miss"
    # no cache asked for: nothing recorded
    assert "compile_cache" not in _sig(_bundle().compile_for("tpu-v6e", "2x2", cache_dir=False))[1]


def test_a_damaged_entry_is_compiled_afresh(tmp_path):
    first, _ = _sig(_bundle().compile_for("tpu-v6e", cache_dir=tmp_path))
    exe = next(os.path.join(d, f) for d, _, fs in os.walk(tmp_path) for f in fs if f.endswith(".exe"))
    with open(exe, "r+b") as f:
        f.truncate(100)
    again, rep = _sig(_bundle().compile_for("tpu-v6e", cache_dir=tmp_path))
    # two compiles of one module differ in a few bytes (libtpu stamps each): the entry is the new one, whole
    assert rep["compile_cache"] == "miss" and abs(len(again.executable) - len(first.executable)) < 1000
    with open(exe, "rb") as f:
        assert f.read() == again.executable


def test_the_environment_variable_turns_it_on(tmp_path, monkeypatch):
    monkeypatch.setenv("TPU_EXPORT_AOT_CACHE", str(tmp_path))
    _bundle().compile_for("tpu-v6e")
    assert _sig(_bundle().compile_for("tpu-v6e"))[1]["compile_cache"] == "hit"


def test_generations_compile_in_parallel():
    """compile_many: three generations in threads give what one compile_for after another gives."""
    gens = [("tpu-v5e", None), ("tpu-v6e", "2x2"), ("tpu-v7x", "2x2x1")]
    b = _bundle()
    got = tpu_backend.compile_many(b, gens, cache_dir=False)
    assert [c.target for c in got] == [t for t, _ in gens] and len(b.compiled) == 3
    for c, (t, topo) in zip(got, gens):
        want = _sig(_bundle().compile_for(t, topo, cache_dir=False))[1]
        have = _sig(c)[1]
        assert have["cost"]["flops"] == want["cost"]["flops"] and have["memory"] == want["memory"]
        assert c.device_kind == {"tpu-v5e": "TPU v5 lite", "tpu-v6e": "TPU v6 lite", "tpu-v7x": "TPU7x"}[t]
