"""The tpu-export command: help, targets, and one-line errors with non-zero exit codes."""

import os
import subprocess
import sys

import pytest

from tpu_export.cli import main


def test_help_lists_commands_and_examples(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for cmd in ("convert", "run", "inspect", "demo", "targets", "ops"):
        assert cmd in out
    assert "examples:" in out and "--target tpu-v6e" in out


def test_targets_lists_every_target(capsys):
    assert main(["targets"]) == 0
    out = capsys.readouterr().out
    for t in ("tpu-v5e", "tpu-v6e", "tpu-v5p", "tpu-v7x", "android", "ios", "web", "iot", "cpu", "cuda", "cpu-xla"):
        assert t in out


def test_unknown_target_is_a_one_line_error(capsys, tmp_path):
    rc = main(["convert", "tpu_export.demo_models:small_cnn", "--target", "tpu-v9", "-o", str(tmp_path / "o"),
               "--quiet"])
    err = capsys.readouterr().err
    assert rc != 0
    assert err.startswith("tpu-export: error: unknown target 'tpu-v9'") and "tpu-v6e" in err
    assert not (tmp_path / "o").exists()  # nothing written


def test_bad_model_spec(capsys, tmp_path):
    rc = main(["convert", "no_such_module_xyz:f", "--target", "android", "-o", str(tmp_path / "o")])
    assert rc == 2
    assert "cannot load 'no_such_module_xyz:f'" in capsys.readouterr().err


@pytest.mark.subprocess
def test_console_script_entry_point_runs():
    r = subprocess.run([sys.executable, "-m", "tpu_export.cli", "targets"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "tpu-v7x" in r.stdout


@pytest.mark.subprocess
def test_console_script_skips_the_exit_collections_and_callers_keep_theirs():
    # The console script (main() with no argv) freezes what the command made so that the interpreter's shutdown
    # does not collect it; main([...]) from a caller's own process leaves its collector alone.
    code = (
        "import gc, sys; from tpu_export.cli import main; sys.argv = ['tpu-export', 'targets']; "
        "c1 = main(['targets']); f1 = gc.get_freeze_count(); c2 = main(); "
        "print('FREEZE', c1, f1, c2, gc.get_freeze_count() > 0, file=sys.stderr)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "FREEZE 0 0 0 True" in r.stderr


def _compile_cache(out):
    import json

    (report,) = list(out.glob("tpu-v6e/model.tpuexp/compiled/*/report.json"))
    return json.loads(report.read_text())["signatures"]["serving_default"]["compile_cache"]


@pytest.mark.libtpu
def test_cache_dir_makes_a_second_conversion_a_hit(tmp_path, monkeypatch):
    """--cache-dir DIR is the AOT compile cache: the second conversion of the same model reuses the first's
    executable (report.json says hit), and the variable it sets does not outlive the command."""
    monkeypatch.delenv("TPU_EXPORT_AOT_CACHE", raising=False)
    argv = ["convert", "tpu_export.demo_models:small_cnn", "--target", "tpu-v6e", "--topology", "1x1",
            "--cache-dir", str(tmp_path / "cache"), "--quiet"]
    assert main(argv + ["-o", str(tmp_path / "a")]) == 0
    assert _compile_cache(tmp_path / "a") == "miss" and any((tmp_path / "cache").rglob("*.exe"))
    assert main(argv + ["-o", str(tmp_path / "b")]) == 0
    assert _compile_cache(tmp_path / "b") == "hit"
    assert "TPU_EXPORT_AOT_CACHE" not in os.environ


def test_cache_dir_that_is_a_file_is_a_one_line_error(tmp_path, capsys):
    f = tmp_path / "f"
    f.write_text("")
    rc = main(["convert", "tpu_export.demo_models:small_cnn", "--target", "tpu-v6e", "--cache-dir", str(f),
               "-o", str(tmp_path / "o"), "--quiet"])
    assert rc == 2 and "--cache-dir" in capsys.readouterr().err and not (tmp_path / "o").exists()
