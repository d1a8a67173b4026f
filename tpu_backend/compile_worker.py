"""The TPU AOT compile in a child process of its own, so libtpu's compile memory goes back to the OS when it
exits instead of staying under whatever the converting process reads next (its weights, at the save).

    python -m tpu_export.tpu_backend.compile_worker JOB_DIR

``compile_in_child`` (the parent side; aot.compile_for calls it) writes JOB_DIR: each signature's jax.export
serialization (``<i>.jaxexport``, StableHLO bytes) and ``job.json`` (target, topology, mesh, x64, HBM per
device, AOT cache folder, each signature's concrete shapes, shardings and donated inputs: aot.signature_job).
The child describes the slice, compiles each signature (aot.compile_signature, the in-process compile's own
code, the AOT cache included) and writes ``<i>.exe`` (the serialized executable) and ``<i>.json`` (XLA's
figures), then ``result.json`` (the devices' platform, kind and count); every file through converter.atomic,
so a reader never sees half of one. No pickle crosses: bytes and JSON only. A refusal (HBM overflow, bad
topology, compiler error) is ``error.json`` plus one line on stderr; the parent raises the same error type.
Anything else (a crash, a kill, the timeout) is one AotError naming the signature, the target and the
child's last stderr line.

The child imports jax, libtpu and this package's torch-free modules (no torch): ~3 s of start-up on a 2-core
host, paid once per compile_for call (bench/large.py --modes tpu measures the whole tree's peak RSS).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from types import SimpleNamespace

__all__ = ["compile_in_child", "main", "DEFAULT_TIMEOUT_S", "FORMAT"]

DEFAULT_TIMEOUT_S = 3600.0  # a real-size model compiles in minutes; an hour means the child is stuck
FORMAT = 1
_ERRORS = ("AotError", "HbmOverflowError", "InvalidTopologyError")


def compile_in_child(bundle, topo, *, dim_values=None, hbm_bytes=None, signatures=None, cache_dir=None,
                     timeout_s: float | None = None):
    """aot.compile_for's work for ``topo`` (chips.Topology) done by ``python -m tpu_export.tpu_backend.compile_worker``;
    returns the CompiledTarget, recorded in ``bundle`` as an in-process compile's would be."""
    from tpu_export.converter.atomic import write_file

    from . import aot
    from .compile_cache import cache_folder

    chip = topo.chip
    hbm = hbm_bytes if hbm_bytes is not None else chip.hbm_bytes_per_device
    names = list(signatures) if signatures is not None else list(bundle.signatures)
    jobs = [aot.signature_job(bundle, bundle.signatures[n], dim_values) for n in names]
    folder = cache_folder(cache_dir)
    timeout = DEFAULT_TIMEOUT_S if timeout_s is None else float(timeout_s)
    with tempfile.TemporaryDirectory(prefix="tpu-export-aot-") as work:
        for i, n in enumerate(names):
            write_file(os.path.join(work, f"{i}.jaxexport"), bundle.signatures[n].serialize())
        job = {"format": FORMAT, "target": chip.target, "topology": topo.shape,
               "mesh": bundle.mesh.to_json() if bundle.mesh is not None else None,
               "enable_x64": bool(bundle.enable_x64), "hbm_bytes": hbm,
               "cache_dir": os.path.abspath(folder) if folder is not None else None, "signatures": jobs}
        write_file(os.path.join(work, "job.json"), json.dumps(job).encode())
        t0 = time.perf_counter()
        stderr, rc = _run(work, timeout)
        wall = time.perf_counter() - t0
        done = [os.path.isfile(os.path.join(work, f"{i}.json")) for i in range(len(names))]
        current = names[done.index(False)] if False in done else names[-1]
        if rc != 0 or not os.path.isfile(os.path.join(work, "result.json")):
            _raise(work, rc, stderr, current, chip.target, topo.shape, timeout)
        compiled, per_sig = {}, {}
        for i, (n, j) in enumerate(zip(names, jobs)):
            with open(os.path.join(work, f"{i}.exe"), "rb") as f:
                raw = f.read()
            with open(os.path.join(work, f"{i}.json"), encoding="utf-8") as f:
                per_sig[n] = json.load(f)
            compiled[n] = aot._record(j, raw, per_sig[n])
        with open(os.path.join(work, "result.json"), encoding="utf-8") as f:
            result = json.load(f)
    # the parent never held the compile-only devices: stand-ins with what the report and the record read
    devices = [SimpleNamespace(platform=result["platform"], device_kind=result["device_kind"])] * result["devices"]
    target = aot.finish_target(bundle, compiled, per_sig, target=chip.target, topology=topo.shape, chip=chip,
                               devices=devices, libtpu_topology=topo.libtpu_name, hbm=hbm)
    target.report["compile_worker"] = {
        "what": "compiled in a child process (python -m tpu_export.tpu_backend.compile_worker): its wall time "
                "(start-up, jax + libtpu import, compile, write) and its own peak RSS",
        "wall_seconds": round(wall, 2), "peak_rss_bytes": result.get("peak_rss_bytes")}
    return target


def _run(work: str, timeout: float) -> tuple[str, int | None]:
    """(the child's stderr, its exit status; None when it ran past ``timeout`` and was killed)."""
    # the child imports the same packages as this process, wherever they came from (the folder holding
    # the tpu_export package this module was imported from: a site-packages, or a checkout's root)
    root = os.path.dirname(os.path.dirname(os.path.abspath(sys.modules["tpu_export"].__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, *filter(None, [os.environ.get("PYTHONPATH")])]))
    with open(os.path.join(work, "stderr.txt"), "w+b") as err:
        try:
            rc = subprocess.run([sys.executable, "-m", "tpu_export.tpu_backend.compile_worker", work],
                                stdin=subprocess.DEVNULL, stdout=err, stderr=err, env=env, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            rc = None
        err.seek(0)
        return err.read().decode("utf-8", "replace"), rc


def _raise(work, rc, stderr, signature, target, topology, timeout):
    from .aot import AotError, HbmOverflowError
    from .chips import InvalidTopologyError

    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    last = lines[-1] if lines else "(nothing on stderr)"
    if rc is None:
        raise AotError(f"signature {signature!r}: the {target} ({topology}) compile worker did not finish in "
                       f"{timeout:g} s and was stopped (compile_for(timeout_s=...) raises the limit); its last "
                       f"stderr line: {last}")
    try:
        with open(os.path.join(work, "error.json"), encoding="utf-8") as f:
            err = json.load(f)
    except (OSError, ValueError):
        err = None
    if err is not None and err.get("type") in _ERRORS:  # a refusal: the same error as in-process
        msg = err["message"]
        if err["type"] == "HbmOverflowError":
            raise HbmOverflowError(msg, err.get("needed"), err.get("available"))
        raise (InvalidTopologyError if err["type"] == "InvalidTopologyError" else AotError)(msg)
    from tpu_export.converter.child_process import exit_status

    how = f"was {exit_status(rc)}" if rc < 0 else f"failed with {exit_status(rc)}"  # SIGKILL: out of memory?
    raise AotError(f"signature {signature!r}: the {target} ({topology}) compile worker (python -m "
                   f"tpu_export.tpu_backend.compile_worker) {how}; its last stderr line: {last}")


def main(argv=None) -> int:
    """The child: compile JOB_DIR's signatures, write their executables and figures (see the module doc)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m tpu_export.tpu_backend.compile_worker JOB_DIR", file=sys.stderr)
        return 2
    work = args[0]
    from tpu_export.converter.atomic import write_file

    try:
        return _compile(work, write_file)
    except Exception as e:  # noqa: BLE001 - one line for the parent, typed where it is a refusal
        line = " ".join((str(e) or type(e).__name__).split())
        payload = {"type": type(e).__name__, "message": line, "needed": getattr(e, "needed", None),
                   "available": getattr(e, "available", None)}
        with contextlib.suppress(OSError):
            write_file(os.path.join(work, "error.json"), json.dumps(payload).encode())
        print(f"{type(e).__name__}: {line}", file=sys.stderr)
        return 1


def _compile(work: str, write_file) -> int:
    from .host import prepare_cpu_host, x64_scope

    prepare_cpu_host()  # before jax's backends start
    with open(os.path.join(work, "job.json"), encoding="utf-8") as f:
        job = json.load(f)
    if job.get("format") != FORMAT:
        raise ValueError(f"{work}/job.json: format {job.get('format')!r}, this worker reads {FORMAT}")
    import jax

    from . import aot
    from .chips import parse_topology
    from .compile_cache import cache_folder
    from .sharding import MeshSpec

    topo = parse_topology(job["target"], job["topology"])
    mesh_spec = MeshSpec.from_json(job["mesh"]) if job["mesh"] is not None else None
    mesh, used = aot.placed_devices(mesh_spec, aot.topology_devices(topo), topo.chip.target, topo.shape)
    folder = cache_folder(job["cache_dir"] if job["cache_dir"] is not None else False)
    for i, sj in enumerate(job["signatures"]):
        with open(os.path.join(work, f"{i}.jaxexport"), "rb") as f:
            exported = jax.export.deserialize(bytearray(f.read()))
        with x64_scope(job["enable_x64"]):
            raw, figures = aot.compile_signature(exported, sj, used, mesh, job["hbm_bytes"], topo.chip.target,
                                                 topo.shape, (folder, topo.libtpu_name))
        write_file(os.path.join(work, f"{i}.exe"), raw)
        write_file(os.path.join(work, f"{i}.json"), json.dumps(figures).encode())  # last: marks it done
    result = {"platform": used[0].platform, "device_kind": used[0].device_kind, "devices": len(used),
              "peak_rss_bytes": _peak_rss()}
    write_file(os.path.join(work, "result.json"), json.dumps(result).encode())
    return 0


def _peak_rss() -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


if __name__ == "__main__":
    sys.exit(main())
