"""The TPU target's compile-time surface: --precision (a float32 matmul's MXU passes), --no-aot (the portable
artifact without executables), the AOT cache on by default in the user's cache folder (--cache-dir none: off),
and a heartbeat while libtpu compiles."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch

from tests.numerics import rel_err
from tpu_export import converter, tpu_backend
from tpu_export.cli import main
from tpu_export.demo_models import small_cnn
from tpu_export.targets.options import OptionsError, options_for
from tpu_export.tpu_backend.compile_cache import cache_folder, default_folder

_PREC = re.compile(r"precision (HIGHEST|HIGH|DEFAULT)>")


def _first(out):
    return np.asarray(out[0] if isinstance(out, (list, tuple)) else out)


def _prog():
    model, args = small_cnn()
    return model, args, converter.prepare(model, args)


@pytest.mark.parametrize("precision,want", [("highest", "HIGHEST"), ("high", "HIGH"), ("default", None)])
def test_precision_sets_every_float32_conv_and_matmul(precision, want):
    """The module asks the TPU for that many passes on every conv and matmul; XLA:CPU computes float32
    whatever is asked, so the artifact's CPU numbers match torch eager at each precision."""
    model, args, prog = _prog()
    b = tpu_backend.export_program(prog, precision=precision)
    found = set(_PREC.findall(b.signatures["serving_default"].exported.mlir_module()))
    assert found == ({want} if want else set()) or (want is None and found <= {"DEFAULT"})
    with torch.no_grad():
        ref = model(*args)
    assert rel_err(_first(b(*[a.numpy() for a in args])), ref) <= 1e-5  # float32 on CPU: a few ulps


def test_precision_leaves_bfloat16_alone():
    _, _, prog = _prog()
    texts = {p: tpu_backend.export_program(prog, dtype="bfloat16", precision=p).signatures["serving_default"]
             .exported.mlir_module() for p in ("highest", "default")}
    assert not _PREC.findall(texts["highest"]) and texts["highest"] == texts["default"]


def test_a_precision_we_do_not_have_is_refused_by_name():
    _, _, prog = _prog()
    with pytest.raises(ValueError, match="precision must be one of highest, high, default, got 'fast'"):
        tpu_backend.export_program(prog, precision="fast")
    with pytest.raises(OptionsError, match="option precision must be 'highest', 'high' or 'default'"):
        options_for("tpu-v6e", {"precision": "fast"})


def test_cli_precision_and_no_aot_write_the_portable_artifact(tmp_path, capsys):
    """--no-aot: StableHLO only, no executables (seconds, and no libtpu needed); the artifact loads and runs
    here on PJRT CPU with torch's numbers; --precision is recorded in summary.json."""
    out = tmp_path / "o"
    assert main(["convert", "tpu_export.demo_models:small_cnn", "--target", "tpu-v6e", "--no-aot",
                 "--precision", "default", "-o", str(out)]) == 0
    assert "aot off: writing StableHLO only" in capsys.readouterr().err
    art = out / "tpu-v6e" / "model.tpuexp"
    assert art.is_dir() and not list(art.rglob("compiled/*"))
    info = json.loads((out / "summary.json").read_text())["targets"]["tpu-v6e"]
    assert info["precision"] == "default" and "aot" not in info
    model, args = small_cnn()
    with torch.no_grad():
        ref = model(*args)
    got = tpu_backend.load(str(art))(*[a.numpy() for a in args])
    assert rel_err(_first(got), ref) <= 1e-5


def test_per_target_keys_take_precision_and_aot(tmp_path):
    out = tmp_path / "o"
    assert main(["convert", "tpu_export.demo_models:small_cnn", "--target", "tpu-v6e:precision=high,aot=off",
                 "-o", str(out), "--quiet"]) == 0
    info = json.loads((out / "summary.json").read_text())["targets"]["tpu-v6e"]
    assert info["precision"] == "high" and "aot" not in info


def test_the_cache_is_on_by_default_in_the_users_cache_folder(tmp_path, monkeypatch):
    monkeypatch.delenv("TPU_EXPORT_AOT_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_folder() == default_folder() == str(tmp_path / "xdg" / "tpu-export" / "aot")
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_folder() == str(tmp_path / "home" / ".cache" / "tpu-export" / "aot")
    for off in ("none", "NONE"):
        monkeypatch.setenv("TPU_EXPORT_AOT_CACHE", off)
        assert cache_folder() is None
    assert cache_folder("none") is None and cache_folder(False) is None
    assert cache_folder(tmp_path / "c") == str(tmp_path / "c")


def _report(out):
    (report,) = list(out.glob("tpu-v6e/model.tpuexp/compiled/*/report.json"))
    return json.loads(report.read_text())["signatures"]["serving_default"]


@pytest.mark.libtpu
def test_a_second_conversion_hits_the_default_cache_and_none_turns_it_off(tmp_path, monkeypatch, capsys):
    pytest.importorskip("libtpu")
    monkeypatch.delenv("TPU_EXPORT_AOT_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setattr("tpu_export.converter.progress.HEARTBEAT_S", 0.2)
    argv = ["convert", "tpu_export.demo_models:small_cnn", "--target", "tpu-v6e", "--topology", "1x1"]
    assert main(argv + ["-o", str(tmp_path / "a")]) == 0
    err = capsys.readouterr().err
    assert re.search(r"tpu-v6e: AOT-compiling for 1x1 with libtpu: done in [\d.]+ s", err), err
    assert _report(tmp_path / "a")["compile_cache"] == "miss"
    assert list((tmp_path / "xdg" / "tpu-export" / "aot").rglob("*.exe"))
    assert main(argv + ["-o", str(tmp_path / "b"), "--quiet"]) == 0
    assert _report(tmp_path / "b")["compile_cache"] == "hit"
    assert main(argv + ["-o", str(tmp_path / "c"), "--quiet", "--cache-dir", "none"]) == 0
    assert "compile_cache" not in _report(tmp_path / "c")
    assert len(list((tmp_path / "xdg").rglob("*.exe"))) == 1


@pytest.mark.libtpu
def test_the_compile_reports_a_heartbeat(tmp_path, monkeypatch, capsys):
    pytest.importorskip("libtpu")
    monkeypatch.setattr("tpu_export.converter.progress.HEARTBEAT_S", 0.05)
    assert main(["convert", "tpu_export.demo_models:small_cnn", "--target", "tpu-v6e", "--topology", "1x1",
                 "-o", str(tmp_path / "o")]) == 0
    beats = re.findall(r"tpu-v6e: AOT-compiling for 1x1 with libtpu: (\d+) s", capsys.readouterr().err)
    assert len(beats) >= 2  # a ~1 s compile at a 0.05 s beat
