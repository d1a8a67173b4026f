"""How the benches run one measurement in a fresh process: the worker prints its result as a JSON line, the last
such line of its stdout is the result; a worker that printed none gives ``{"error": <its last stderr line>}``."""

from __future__ import annotations

import json
import os
import subprocess

__all__ = ["run_json"]


def run_json(argv: list, *, timeout: float, cwd: str | None = None, err_chars: int = 200,
             extra_env: dict | None = None) -> dict:
    env = dict(os.environ, PYTHONWARNINGS="ignore", TF_CPP_MIN_LOG_LEVEL="3", **(extra_env or {}))
    r = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout, cwd=cwd)
    for line in reversed(r.stdout.strip().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    if r.returncode < 0:  # killed: its last stderr line is whatever it printed before, often a warning
        return {"error": f"killed by signal {-r.returncode}" + (" (out of memory?)" if r.returncode == -9 else "")}
    return {"error": (r.stderr.strip().splitlines() or ["?"])[-1][:err_chars]}
