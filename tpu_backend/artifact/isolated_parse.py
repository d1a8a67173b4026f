"""Parse an artifact's jax exports in a child process first (opt-in: ``read_artifact(isolate=True)``).

jaxlib's MLIR bytecode reader is not hardened against hostile bytes: an author who re-signs an
artifact can make it crash the process (SIGSEGV, or SIGABRT on a corrupted heap) or loop forever.
Here a child (``sys.executable``, importing only ``jax.export``) runs the same parse the loader
runs, on the very bytes the parent read and hash-checked (written to a private temp dir: the
child never opens the artifact), under a timeout. A death by signal, a timeout or an error
becomes an ``ArtifactCorruptError`` naming the artifact and the export; only then does the
parent parse in-process. This keeps the parent alive; it is not a sandbox: the child runs with
the parent's rights.
"""

from __future__ import annotations

import os
import queue
import sys
import tempfile

from tpu_export.converter.child_process import TaggedChild, exit_status, stderr_tail

from .errors import ArtifactCorruptError, ArtifactError

__all__ = ["DEFAULT_TIMEOUT", "parse_exports_isolated"]

DEFAULT_TIMEOUT = 30.0  # per export; a ViT/BERT-sized module parses in ~10 ms
_START_TIMEOUT = 300.0  # the child's `import jax` (~1-2 s, far longer on a loaded machine) is not the file's fault
_TAG = "@@tpu-export-parse"  # lines of ours; anything else a library prints on stdout is ignored

# Mirrors load._read_export's parse. Reports "ok i" per export so the parent knows which one
# it was parsing when the child died or stalled.
_CHILD = f"""
import sys
from jax import export
print("{_TAG} ready", flush=True)
for i, name in enumerate(sys.argv[1:]):
    with open(name, "rb") as f:
        data = f.read()
    try:
        export.deserialize(bytearray(data)).mlir_module()
    except Exception as e:
        print("{_TAG} err", i, type(e).__name__ + ": " + " ".join(str(e).split())[:300], flush=True)
        sys.exit(3)
    print("{_TAG} ok", i, flush=True)
"""


def parse_exports_isolated(path: str, exports: list[tuple[str, bytes]], timeout: float = DEFAULT_TIMEOUT) -> None:
    """Raise ``ArtifactCorruptError`` unless every ``(rel, bytes)`` export parses in a child
    process within ``timeout`` seconds each."""
    if not timeout > 0:
        raise ValueError(f"isolate_timeout must be a positive number of seconds, got {timeout!r}")
    if not exports:
        return
    with tempfile.TemporaryDirectory(prefix="tpu-export-parse-") as tmp:  # mode 0700
        names = []
        for i, (_, data) in enumerate(exports):
            names.append(os.path.join(tmp, f"{i}.jaxexport"))
            with open(names[-1], "wb") as f:
                f.write(data)
        with open(os.path.join(tmp, "stderr"), "w+b") as err:
            # JAX_PLATFORMS=cpu: the parse needs no device, and the child must never claim the TPU
            # the parent holds or is about to open. cwd=tmp: nothing importable there.
            try:
                child = TaggedChild([sys.executable, "-c", _CHILD, *names], tag=_TAG, stderr=err, cwd=tmp,
                                    env=dict(os.environ, JAX_PLATFORMS="cpu"))
            except OSError as e:  # no usable sys.executable (an embedded interpreter)
                raise ArtifactError(f"{path}: cannot start the isolated StableHLO parser ({sys.executable!r}: "
                                    f"{e.strerror or e}); load without isolate") from None
            with child:
                _watch(child, path, exports, timeout, err)


def _watch(child, path, exports, timeout, err):
    started = False
    for i in range(-1, len(exports)):  # -1: the child's start-up
        limit = timeout if started else _START_TIMEOUT
        try:
            msg = child.next(limit)
        except queue.Empty:
            child.kill()
            if not started:
                raise ArtifactError(f"{path}: the isolated StableHLO parser ({sys.executable}) did not start within "
                                    f"{limit:g} s; load without isolate, or retry on a less loaded machine") from None
            raise ArtifactCorruptError(f"{path}: {exports[i][0]}: parsing its StableHLO did not finish within "
                                       f"{limit:g} s in an isolated child process (killed): corrupted or hostile; "
                                       "do not load it in-process") from None
        if msg is None:  # the child is gone without reporting this step
            rc = child.wait()
            if not started:
                raise ArtifactError(f"{path}: the isolated StableHLO parser ({sys.executable}) failed to start "
                                    f"({exit_status(rc)}: {stderr_tail(err)}); load without isolate, or fix the "
                                    "environment")
            raise ArtifactCorruptError(f"{path}: {exports[i][0]}: its StableHLO crashed the parser in an isolated "
                                       f"child process ({exit_status(rc)}{stderr_tail(err, ': ')}): corrupted or "
                                       "hostile; do not load it in-process")
        if msg[0] == "err":
            raise ArtifactCorruptError(f"{path}: {exports[int(msg[1])][0]}: not a readable jax export "
                                       f"({msg[2] if len(msg) > 2 else 'no message'})")
        started = True
