"""A child process that reports in tagged lines, for work on untrusted bytes that may crash or hang a native
library (jaxlib's StableHLO parser, the LiteRT-LM engine): the parent stays alive and says what happened.

    with TaggedChild([sys.executable, "-c", code, *args], tag="@@mine", stderr=f, cwd=tmp) as child:
        words = child.next(timeout=30)   # the words after the tag of the child's next line; None at its end
    exit_status(child.returncode)        # "killed by SIGSEGV", "exit status 3"

Lines on the child's stdout without the tag (what a library prints) are ignored. The child runs with the
parent's rights: this keeps the parent alive; it is not a sandbox.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import threading

__all__ = ["TaggedChild", "exit_status", "stderr_tail"]


class TaggedChild:
    """``subprocess.Popen(argv, stdout=PIPE, ...)`` whose tagged stdout lines are read on a thread, so that the
    parent waits for each with a timeout. Leaving the ``with`` kills the child if it still runs and reaps it."""

    def __init__(self, argv: list, *, tag: str, stderr, cwd=None, env=None, stdin=subprocess.DEVNULL):
        self.tag = tag
        self.proc = subprocess.Popen(argv, stdin=stdin, stdout=subprocess.PIPE, stderr=stderr, cwd=cwd, env=env)
        self._lines: queue.Queue = queue.Queue()
        self._pump = threading.Thread(target=self._read, daemon=True)
        self._pump.start()

    def _read(self) -> None:
        for raw in self.proc.stdout:
            words = raw.decode("utf-8", "replace").split(maxsplit=3)
            if words[:1] == [self.tag]:
                self._lines.put(words[1:])
        self._lines.put(None)

    def next(self, timeout: float):
        """The words after the tag of the next tagged line (split at most 3 times); None once the child's stdout
        has ended. Raises queue.Empty after ``timeout`` seconds without one."""
        return self._lines.get(timeout=timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()

    def wait(self) -> int:
        return self.proc.wait()

    @property
    def returncode(self):
        return self.proc.returncode

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.kill()
        self.proc.wait()
        self._pump.join(5.0)  # the pipe is at EOF once the child is gone
        self.proc.stdout.close()
        if self.proc.stdin is not None:
            self.proc.stdin.close()


def exit_status(rc: int) -> str:
    """'killed by SIGSEGV' for a death by signal, else 'exit status N'."""
    if rc < 0:
        return f"killed by {signal_name(-rc)}"
    return f"exit status {rc}"


def signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def stderr_tail(err, prefix: str = "") -> str:
    """The last non-empty line of the child's stderr file ``err`` (e.g. glibc's "malloc(): invalid size"), short;
    '' when it wrote none."""
    err.seek(0, os.SEEK_END)
    err.seek(max(0, err.tell() - 4096))
    last = [ln for ln in err.read().decode("utf-8", "replace").splitlines() if ln.strip()][-1:]
    return f"{prefix}{' '.join(last[0].split())[:200]}" if last else ""
