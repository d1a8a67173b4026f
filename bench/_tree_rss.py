"""The peak RSS of a process tree, polled: a bench worker and the children it starts (the TPU compile worker of
tpu_backend/compile_worker.py), which the worker's own VmHWM does not count."""

from __future__ import annotations

import os
import subprocess
import tempfile
import time

__all__ = ["descendants", "run_polled", "tree_rss"]


def descendants(root: int) -> list[int]:
    """``root`` and every process below it, parents before children (from /proc; a process that ends meanwhile is
    left out)."""
    parent = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    parent[int(d)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    tree, frontier = [root], [root]
    while frontier:
        frontier = [c for c, pp in parent.items() if pp in frontier and c not in tree]
        tree += frontier
    return tree


def tree_rss(root: int) -> tuple[int, list[tuple[int, int]]]:
    """Summed VmRSS of ``root`` and every descendant (bytes), and (pid, rss) of each. A sum of RSS counts
    pages two processes share (libraries, one mmapped file) twice: an upper bound of the tree's memory."""
    tree = descendants(root)
    each = []
    for p in tree:
        try:
            with open(f"/proc/{p}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        each.append((p, int(line.split()[1]) * 1024))
                        break
        except OSError:
            continue
    return sum(r for _, r in each), each


def run_polled(argv, env, *, interval: float = 0.1, trace: str | None = None):
    """Run a worker; poll its process tree's summed RSS every ``interval`` s. Returns (CompletedProcess,
    peak tree RSS in bytes). The worker's own VmHWM (exact, not polled) is in its JSON; the tree's peak
    covers the children it starts (a compile worker), which VmHWM does not. ``trace``: a TSV of
    seconds, tree RSS and process count."""
    t0 = time.perf_counter()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        p = subprocess.Popen(argv, stdout=out, stderr=err, text=True, env=env)
        peak, rows = 0, []
        while p.poll() is None:
            total, each = tree_rss(p.pid)
            peak = max(peak, total)
            if trace:
                rows.append(f"{time.perf_counter() - t0:.1f}\t{total / 2**30:.3f}\t{len(each)}")
            time.sleep(interval)
        out.seek(0)
        err.seek(0)
        r = subprocess.CompletedProcess(argv, p.returncode, out.read(), err.read())
    if trace:
        with open(trace, "w") as f:
            f.write("seconds\ttree_rss_gb\tprocesses\n" + "\n".join(rows) + "\n")
    return r, peak
