"""The CLI's failures are one line on stderr: torch's graph dumps, log lines and tracebacks never
reach the user (run as a real process, so torch's own stderr handlers and prints are in play)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from tpu_export.cli import main

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_FACTORIES = textwrap.dedent('''
    import torch


    class Branchy(torch.nn.Module):
        def forward(self, x):
            if x.sum() > 0:  # data-dependent control flow
                return x * 2
            return x - 1


    class InPlace(torch.nn.Module):
        def forward(self, x):
            x.add_(1)
            return x * 2


    def branchy():
        return Branchy().eval(), (torch.randn(3),)


    def in_place():
        return InPlace().eval(), (torch.randn(3),)


    def in_place_training():
        return InPlace(), (torch.randn(3),)
''')


def _cli(tmp_path, *args) -> subprocess.CompletedProcess:
    (tmp_path / "factories.py").write_text(_FACTORIES)
    env = dict(os.environ, PYTHONPATH=_REPO)
    env.pop("TORCH_LOGS", None)
    env.pop("TPU_EXPORT_DEBUG", None)
    return subprocess.run([sys.executable, "-m", "tpu_export.cli", *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.subprocess
def test_data_dependent_control_flow_is_one_line_in_a_real_process(tmp_path):
    r = _cli(tmp_path, "convert", "factories:branchy", "--target", "android", "-o", "out", "--quiet")
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 1 and len(lines) == 1, r.stderr  # torch prints a ~40-line partial graph here
    line = lines[0]
    assert line.startswith("tpu-export: error: torch.export failed on Branchy")
    assert "factories.py" in line and "if x.sum() > 0" in line and "Fix: use torch.cond" in line
    assert r.stdout == "" and not (tmp_path / "out").exists()


@pytest.mark.subprocess
def test_corrupt_pt2_is_one_line_in_a_real_process(tmp_path):
    m = torch.nn.Linear(3, 2).eval()
    torch.export.save(torch.export.export(m, (torch.randn(1, 3),)), str(tmp_path / "m.pt2"))
    data = (tmp_path / "m.pt2").read_bytes()
    (tmp_path / "bad.pt2").write_bytes(data[: len(data) - 300])  # the zip's directory is gone
    r = _cli(tmp_path, "convert", "bad.pt2", "--target", "android", "-o", "out", "--quiet")
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 1 and len(lines) == 1, r.stderr
    assert lines[0].startswith("tpu-export: error: bad.pt2: not a torch.export .pt2 archive") and "Fix:" in lines[0]


@pytest.mark.parametrize("factory, first_line", [
    ("in_place", "tpu-export: error: "),
    ("in_place_training", "tpu-export: warning: InPlace is in training mode"),  # one line too, then the error
])
def test_in_place_input_mutation_names_the_input_the_line_and_the_fix(tmp_path, capfd, factory, first_line):
    (tmp_path / "factories.py").write_text(_FACTORIES)
    sys.path.insert(0, str(tmp_path))
    try:
        rc = main(["convert", f"factories:{factory}", "--target", "android", "-o", str(tmp_path / "out"), "--quiet"])
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("factories", None)
    lines = capfd.readouterr().err.strip().splitlines()
    assert rc == 1 and lines[0].startswith(first_line), lines
    assert len(lines) == (1 if factory == "in_place" else 2), lines
    err = lines[-1]
    assert "modifies its input 'x' in place" in err and "x.add_(1)" in err and "factories.py" in err
    assert "Fix: work on a copy (x = x.clone() first) or return the new value" in err


# A model module that takes long to import: the command line's mistakes must be found before it is imported.
_SLOW_MODEL = textwrap.dedent('''
    import pathlib
    import time

    pathlib.Path(__file__).with_name("IMPORTED").write_text("the model module was imported")
    time.sleep(5)


    def build():
        import torch

        return torch.nn.Linear(4, 2).eval(), (torch.randn(1, 4),)
''')


@pytest.fixture
def slow_model(tmp_path, monkeypatch):
    """A factory module in tmp_path (the CLI imports MODEL from the working folder) that leaves IMPORTED beside it
    when imported; the path of that marker."""
    (tmp_path / "slow_model.py").write_text(_SLOW_MODEL)
    monkeypatch.chdir(tmp_path)
    yield tmp_path / "IMPORTED"
    sys.modules.pop("slow_model", None)
    while str(tmp_path) in sys.path:
        sys.path.remove(str(tmp_path))


def _refused(capsys, *argv, code=2) -> str:
    import time

    t0 = time.perf_counter()
    rc = main(["convert", "slow_model:build", *argv, "-o", "out", "--quiet"])
    took = time.perf_counter() - t0
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert rc == code and len(lines) == 1 and lines[0].startswith("tpu-export: error: "), err
    assert took < 1.0, f"{took:.2f} s: the mistake was not found before the model was imported"
    return lines[0]


def test_a_typo_of_a_target_fails_at_once_without_importing_the_model(slow_model, capsys):
    err = _refused(capsys, "--target", "tpu-v6f")
    assert "--target tpu-v6f: unknown target 'tpu-v6f'" in err and "did you mean tpu-v6e?" in err
    assert "android" in err  # the known targets
    assert not slow_model.exists() and not os.path.exists("out")


def test_a_typo_of_a_key_gets_the_closest_key(slow_model, capsys):
    err = _refused(capsys, "--target", "android:channel_lastt_io=on")
    assert "--target android:channel_lastt_io=on: unknown key 'channel_lastt_io'" in err
    assert "did you mean channel-last?" in err
    err = _refused(capsys, "--target", "android:channel_last_io=on")  # the Python name points to the CLI's
    assert "did you mean channel-last?" in err and "channel_last_io=" not in err.split(";")[-1]
    err = _refused(capsys, "--target", "iot:ram_kib=256")
    assert "did you mean ram-kib?" in err
    assert not slow_model.exists()


def test_a_key_of_another_target_names_who_takes_it(slow_model, capsys):
    err = _refused(capsys, "--target", "android:topology=2x2")
    assert "android does not take topology (a key of tpu-v5e, tpu-v6e, tpu-v5p, tpu-v7x)" in err
    assert "android takes quantize, calibration, strict, channel-last" in err
    err = _refused(capsys, "--target", "android", "--topology", "2x2", code=1)
    assert "--topology 2x2: no target of this call (android) takes it" in err
    assert not slow_model.exists()


def test_quantize_schemes_are_checked_by_their_cli_names(slow_model, capsys):
    err = _refused(capsys, "--target", "android", "--quantize", "int8")
    assert "--quantize int8: int8 is ambiguous" in err and "static_int8" in err and "weight_only_int8" in err
    err = _refused(capsys, "--target", "android:quantize=float16")
    assert "--target android:quantize=float16: unknown scheme 'float16'" in err and "did you mean fp16?" in err
    err = _refused(capsys, "--target", "android", "--quantize", "dynamic_int9")
    assert "did you mean dynamic_int8?" in err
    err = _refused(capsys, "--target", "android", "--target", "tpu-v6e", "--quantize", "dynamic_int8", code=1)
    assert "tpu-v6e (TPU/XLA) quantizes weight_only_int8 only" in err and "--target NAME:quantize=SCHEME" in err
    assert not slow_model.exists()


def test_static_int8_without_calibration_names_the_flag_not_the_python_name(slow_model, capsys):
    for argv in (["--target", "android", "--quantize", "static_int8"], ["--target", "iot"]):
        err = _refused(capsys, *argv, code=1)
        assert "needs calibration samples: add --calibration FILE.npz" in err, err
        assert "calibration_data" not in err and "quant_config" not in err
    import numpy as np

    np.savez("cal.npz", x=np.zeros((2, 1, 4), np.float32))
    err = _refused(capsys, "--target", "android", "--calibration", "cal.npz", code=1)
    assert "--calibration cal.npz: calibration samples are for quantize static_int8" in err
    assert not slow_model.exists()


def test_the_64_bit_warning_names_the_cli_flag(tmp_path, capfd):
    """convert narrows int64 inputs to int32 with a warning; on the CLI it names --enable-x64, not enable_x64=True."""

    class Lookup(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.e = torch.nn.Embedding(10, 4)

        def forward(self, ids):
            return self.e(ids).sum(-1)

    pt2 = tmp_path / "lookup.pt2"
    torch.export.save(torch.export.export(Lookup().eval(), (torch.tensor([[1, 2, 3]]),)), str(pt2))
    assert main(["convert", str(pt2), "--target", "cpu", "-o", str(tmp_path / "out"), "--quiet"]) == 0
    err = capfd.readouterr().err
    assert "tpu-export: warning: signature 'serving_default': 64-bit inputs ['ids'] become 32-bit" in err, err
    assert "Pass --enable-x64 to keep 64-bit" in err and "enable_x64=True" not in err


@pytest.mark.subprocess
def test_a_typo_of_a_target_in_a_real_process_is_one_line_and_imports_nothing(tmp_path):
    (tmp_path / "slow_model.py").write_text(_SLOW_MODEL)
    r = _cli(tmp_path, "convert", "slow_model:build", "--target", "tpu-v6f", "-o", "out")
    assert r.returncode == 2 and r.stdout == "", r.stderr
    assert r.stderr.startswith("tpu-export: error: --target tpu-v6f: unknown target") and r.stderr.count("\n") == 1
    assert "did you mean tpu-v6e?" in r.stderr
    assert not (tmp_path / "IMPORTED").exists() and not (tmp_path / "out").exists()
