"""A library user on a TPU-less host: the first export / TPU compile prepares libtpu, so nothing of
libtpu's start-up errors reaches stderr (only the CLI and the test suite prepared it before)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.subprocess, pytest.mark.libtpu, pytest.mark.slow]

pytest.importorskip("libtpu", reason="AOT compilation for TPU needs libtpu (pip install 'libtpu==0.0.42.*')")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_USER = """
import torch, converter, tpu_backend
m = torch.nn.Linear(4, 3).eval()
x = torch.randn(2, 4)
b = tpu_backend.export_program(converter.prepare(m, (x,)))
c = b.compile_for("tpu-v6e")
got = b(x)
print("ok", c.device_kind, float((got - m(x)).abs().max()))
"""


def test_python_api_compile_prints_no_libtpu_errors():
    from tpu_export.tpu_backend.host import tpu_attached

    if tpu_attached():
        pytest.skip("a TPU host: libtpu finds its chips and is not prepared")
    # a fresh process as a user starts it: none of the variables the suite's conftest set
    env = {k: v for k, v in os.environ.items()
           if k not in ("ALLOW_MULTIPLE_LIBTPU_LOAD", "TPU_WORKER_HOSTNAMES", "TPU_ACCELERATOR_TYPE", "JAX_PLATFORMS")}
    env["PYTHONPATH"] = ROOT
    r = subprocess.run([sys.executable, "-c", _USER], capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    out = r.stdout.split()
    assert out[:4] == ["ok", "TPU", "v6", "lite"] and float(out[4]) < 1e-5
    bad = [ln for ln in r.stderr.splitlines()
           if ln.startswith("E0000") or "TPU_WORKER_HOSTNAMES" in ln or "TPU_ACCELERATOR_TYPE" in ln]
    assert not bad, "\n".join(bad)
