"""``probe``: a snippet run in a child Python, for the hostile-input tests whose failure mode is a hang or an
unbounded read.

``probe`` runs a snippet in a child Python under an address-space limit and a wall-clock timeout, so that a
regression that hangs (a FIFO opened for reading waits for a writer) or reads without end (``/dev/zero``) fails the
test instead of hanging the suite or exhausting the machine. The child reports the exception it got, its peak
resident memory (VmHWM) and the seconds the snippet took.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

__all__ = ["probe"]

_CHILD = r"""
import json, resource, sys, time
resource.setrlimit(resource.RLIMIT_AS, ({limit}, {limit}))
out = {{"error": None, "message": None}}
g = {{"__name__": "__probe__"}}
t0 = time.perf_counter()
try:
    exec(compile(sys.stdin.read(), "<probe>", "exec"), g)
except BaseException as e:
    out["error"], out["message"] = type(e).__name__, str(e)
out["seconds"] = time.perf_counter() - g.get("_probe_t0", t0)
with open("/proc/self/status") as f:
    out["hwm_mb"] = next(int(l.split()[1]) for l in f if l.startswith("VmHWM:")) / 1024
print("PROBE " + json.dumps(out))
"""


def probe(code: str, *, timeout: float = 120, mem_limit_gb: float = 6, setup: str = "") -> dict:
    """Run ``setup`` then ``code`` in a child (RLIMIT_AS ``mem_limit_gb``); {"error", "message", "seconds" (of
    ``code`` alone), "hwm_mb"}. A child that outlives ``timeout`` raises subprocess.TimeoutExpired."""
    limit = int(mem_limit_gb * (1 << 30))
    script = f"{textwrap.dedent(setup)}\n_probe_t0 = __import__('time').perf_counter()\n{textwrap.dedent(code)}\n"
    env = {**os.environ, "MALLOC_ARENA_MAX": "2", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
    p = subprocess.run([sys.executable, "-c", _CHILD.format(limit=limit)], input=script, text=True,
                       capture_output=True, timeout=timeout, env=env)
    line = next((ln for ln in p.stdout.splitlines() if ln.startswith("PROBE ")), None)
    assert line is not None, f"the probe died (rc {p.returncode}): {p.stderr[-2000:]}"
    return json.loads(line[len("PROBE "):])
