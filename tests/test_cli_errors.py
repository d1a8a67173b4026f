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
