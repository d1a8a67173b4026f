"""The tpu-export command: help, targets, and one-line errors with non-zero exit codes."""

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


def test_console_script_entry_point_runs():
    r = subprocess.run([sys.executable, "-m", "tpu_export.cli", "targets"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "tpu-v7x" in r.stdout
