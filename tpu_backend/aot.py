"""AOT compilation of an exported bundle for a TPU generation and slice, on any host.

With libtpu installed, ``jax.experimental.topologies.get_topology_desc("v6e:2x2", "tpu")``
describes a TPU slice as compile-only devices; ``jax.jit(exported.call).lower(...)`` on
ShapeDtypeStructs placed on those devices, then ``.compile()``, runs the real TPU compiler
here, CPU-only as this host is. jax's default backend stays CPU: compile-only devices never
execute anything.

Notes on libtpu on a CPU-only host (measured with jax 0.10.2 / libtpu 0.0.42):

* Any process that initialises jax's backends without ``JAX_PLATFORMS=cpu`` tries the TPU
  plugin, fails to find a chip and falls back to CPU, but keeps ``/tmp/libtpu_lockfile``
  locked until it exits. Another process then cannot create a topology ("Internal error when
  accessing libtpu multi-process lockfile") unless ``ALLOW_MULTIPLE_LIBTPU_LOAD=1`` is set
  before libtpu loads. On a host with no TPU attached we set it (if unset) right before the
  first topology is created: nothing runs on a TPU, so concurrent loads are harmless.
* "v5e:1x1" is refused with the default ``chips_per_host_bounds`` (2x2x1); a one-chip slice
  is described with ``chips_per_host_bounds=(1, 1, 1)``.
* tpu7x exposes each of a chip's two TensorCores as a device (a 2x2x1 slice has 8 devices);
  XLA's per-device figures are then per TensorCore.
* The TPU_WORKER_HOSTNAMES / accelerator-type errors libtpu prints on such hosts are avoided by
  ``host.prepare_cpu_host``, which export, compile and load call before jax's backends start.
"""

from __future__ import annotations

import functools
import os
import threading
from typing import TYPE_CHECKING, Iterable

from .aot_signature import AotError, HbmOverflowError, compile_signature, signature_job
from .artifact.compiled import CompiledSignature, CompiledTarget
from .artifact.report import build_report
from .artifact.versions import runtime_versions
from .chips import ChipSpec, InvalidTopologyError, Topology, parse_topology
from .compile_cache import cache_folder
from .host import prepare_cpu_host, x64_scope

if TYPE_CHECKING:
    from .export import ExportedBundle

__all__ = ["compile_for", "compile_many", "compile_on_devices", "topology_devices", "HbmOverflowError", "AotError",
           "InvalidTopologyError", "prepare_cpu_host", "signature_job", "compile_signature", "finish_target",
           "in_child_by_default", "CHILD_MIN_WEIGHT_BYTES", "placed_devices"]


@functools.lru_cache(maxsize=None)
def _topology(libtpu_name: str, one_chip: bool):
    from jax.experimental import topologies

    prepare_cpu_host()  # a process whose first jax use is this compile: libtpu starts quiet
    kw = {"chips_per_host_bounds": (1, 1, 1)} if one_chip else {}
    return topologies.get_topology_desc(libtpu_name, "tpu", **kw)


def topology_devices(topo: Topology) -> list:
    """Compile-only devices of a TPU slice (libtpu must be installed)."""
    try:
        return list(_topology(topo.libtpu_name, topo.chips == 1).devices)
    except RuntimeError as e:  # JaxRuntimeError subclasses RuntimeError
        msg = str(e)
        if "INVALID_ARGUMENT" in msg:
            raise InvalidTopologyError(
                f"libtpu refused topology {topo.libtpu_name!r}: {msg.splitlines()[0]}; valid topologies for "
                f"{topo.chip.target}: {', '.join(topo.chip.topologies)}"
            ) from None
        if "not installed" in msg or "TPU support" in msg:
            raise AotError(f"AOT compilation for {topo.chip.target} needs libtpu: pip install 'libtpu==0.0.42.*' "
                           f"({msg.splitlines()[0]})") from None
        raise AotError(f"could not describe TPU slice {topo.libtpu_name!r}: {msg.splitlines()[0]}") from None


def compile_for(bundle: ExportedBundle, target: str, topology: str | None = None, *,
                dim_values: dict[str, int] | None = None, hbm_bytes: int | None = None,
                signatures: Iterable[str] | None = None, cache_dir: str | os.PathLike[str] | bool | None = None,
                in_process: bool | None = None, timeout_s: float | None = None) -> CompiledTarget:
    """AOT-compile every signature of an exported bundle for a TPU chip and slice (``bundle.compile_for`` calls
    this).

    The real TPU compiler (libtpu) runs here, on any host: no TPU needs to be attached. The executables and
    their cost and memory report (``report.json`` in the saved artifact) are recorded in the bundle, so the
    next ``save`` writes them; a program that does not fit the chip's HBM fails here rather than on the TPU.
    Compiled executables are cached by default (see ``cache_dir``).

    Args:
        bundle: What ``tpu_backend.export_program`` returned (exported with ``"tpu"`` among its platforms).
        target: The chip: ``"tpu-v5e"``, ``"tpu-v6e"``, ``"tpu-v5p"`` or ``"tpu-v7x"``.
        topology: The slice shape, e.g. ``"2x2"``; None: one chip.
        dim_values: Sizes for the dynamic dims during the compile (default: the smallest size in range that
            splits over the data axis).
        hbm_bytes: The HBM per device to check the program against, instead of the chip's.
        signatures: The signatures to compile (default: all of them).
        cache_dir: A folder of compiled executables to reuse and fill. None (default): ``$TPU_EXPORT_AOT_CACHE``,
            else the user's cache folder (``~/.cache/tpu-export/aot``); False or ``"none"``: no cache.
        in_process: True: compile in this process; False: in a child process, so that libtpu's compile memory
            goes back to the OS when it exits; None (default): a child for a bundle of 384 MiB or more of
            weights on a host with no TPU attached.
        timeout_s: The child process's time limit in seconds (default: the worker's own).

    Returns:
        The compiled target: its ``target``, ``topology``, ``device_kind``, per-signature executables and
        ``report`` (also appended to ``bundle.compiled``).

    Raises:
        tpu_export.tpu_backend.InvalidTopologyError: ``target`` is not a TPU chip, or ``topology`` is not a slice
            of it (a ValueError; the message lists the valid ones).
        tpu_export.tpu_backend.AotError: The bundle was not exported for ``"tpu"``, libtpu is not installed, or
            the compile failed.
        tpu_export.tpu_backend.HbmOverflowError: The program does not fit the chip's HBM (an AotError).

    Examples:
        >>> import torch
        >>> from tpu_export import converter, tpu_backend
        >>> m = torch.nn.Linear(4, 2).eval()
        >>> bundle = tpu_backend.export_program(converter.prepare(m, (torch.ones(1, 4),)))
        >>> compiled = bundle.compile_for("tpu-v6e", cache_dir=False)    # libtpu: no TPU needed
        >>> compiled.target, compiled.topology, compiled.device_kind
        ('tpu-v6e', '1x1', 'TPU v6 lite')
        >>> bundle.compile_for("tpu-v6e", "3x7")
        Traceback (most recent call last):
        ...
        tpu_export.tpu_backend.chips.InvalidTopologyError: invalid topology '3x7' for tpu-v6e; ...
    """
    prepare_cpu_host()  # before jax's backends start, if this is the process's first jax use
    topo = parse_topology(target, topology)
    if "tpu" not in bundle.platforms:
        raise AotError(f"the bundle was exported for {list(bundle.platforms)}; AOT for {topo.chip.target} needs "
                       "platforms including 'tpu'")
    if in_process is None:
        in_process = not in_child_by_default(bundle)
    if not in_process:
        from .compile_worker import compile_in_child

        return compile_in_child(bundle, topo, dim_values=dim_values, hbm_bytes=hbm_bytes, signatures=signatures,
                                cache_dir=cache_dir, timeout_s=timeout_s)
    devices = topology_devices(topo)
    return compile_on_devices(bundle, devices, target=topo.chip.target, topology=topo.shape, chip=topo.chip,
                              dim_values=dim_values, hbm_bytes=hbm_bytes, signatures=signatures,
                              libtpu_topology=topo.libtpu_name, cache_dir=cache_dir)


_RECORD = threading.Lock()

# Where a child pays for itself (in_child_by_default). Below it the weights the save reads after the compile weigh
# less than the child's own jax + libtpu, so a child raises the process tree's peak: bench/large.py --modes
# tpu_in_process,tpu_child (2026-11-30): 0.25 GiB of weights 1.28 -> 1.33 GB, 0.40 GiB 1.51 -> 1.41 GB, 1.81 GiB
# 3.08 -> 2.57 GB; crossing near 0.3 GiB, set a little above it since a child also costs ~2-5 s of start-up
CHILD_MIN_WEIGHT_BYTES = 384 * 2**20


def in_child_by_default(bundle) -> bool:
    """compile_for's default: a child process for a bundle of CHILD_MIN_WEIGHT_BYTES or more of weights on a host
    with no TPU attached. A child costs its own jax + libtpu start (~3 s) and holds its own copy of them while
    it compiles: worth it only where the weights, read after the compile, would otherwise sit on top of
    libtpu's compile memory. On a TPU host the chips belong to this process's libtpu: compile here."""
    from .host import tpu_attached

    if tpu_attached():
        return False
    return sum(w.element_size() * w.numel() for w in bundle.weights.values()) >= CHILD_MIN_WEIGHT_BYTES


def compile_many(bundle, targets, *, max_workers: int | None = None, **kw) -> list[CompiledTarget]:
    """``compile_for`` for several ``(target, topology)`` pairs at once, in threads (libtpu's compile
    runs outside the GIL): the wall time of the slowest instead of the sum, where the host has the
    cores. ``max_workers`` defaults to the host's CPU count. Results in ``targets``' order; the first
    failure is raised after the others finish."""
    from concurrent.futures import ThreadPoolExecutor

    prepare_cpu_host()
    pairs = [(t, None) if isinstance(t, str) else tuple(t) for t in targets]
    in_process = kw.get("in_process")
    if in_process is None:
        kw["in_process"] = in_process = not in_child_by_default(bundle)
    for t, topo in pairs:  # describe every slice first: libtpu's topology set-up is not for threads
        if in_process:  # (each child describes its own)
            topology_devices(parse_topology(t, topo))
    workers = max(1, min(len(pairs), max_workers or os.cpu_count() or 1))
    with ThreadPoolExecutor(workers, thread_name_prefix="tpu-aot") as ex:
        futures = [ex.submit(compile_for, bundle, t, topo, **kw) for t, topo in pairs]
        return [f.result() for f in futures]


def compile_on_devices(bundle, devices: list, *, target: str, topology: str, chip: ChipSpec | None = None,
                       dim_values=None, hbm_bytes=None, signatures=None, libtpu_topology=None,
                       cache_dir=None) -> CompiledTarget:
    """Compile for the given devices: compile-only TPU devices of a topology, or devices jax
    already runs (e.g. the local CPU, or an attached TPU)."""

    mesh, used = placed_devices(bundle.mesh, devices, target, topology)
    hbm = hbm_bytes if hbm_bytes is not None else (chip.hbm_bytes_per_device if chip else None)
    names = list(signatures) if signatures is not None else list(bundle.signatures)

    compiled, per_sig = {}, {}
    for name in names:
        sig = bundle.signatures[name]
        job = signature_job(bundle, sig, dim_values)
        with x64_scope(bundle.enable_x64):
            raw, figures = compile_signature(sig.exported, job, used, mesh, hbm, target, topology,
                                             (cache_folder(cache_dir), libtpu_topology))
        compiled[name], per_sig[name] = _record(job, raw, figures), figures
    return finish_target(bundle, compiled, per_sig, target=target, topology=topology, chip=chip, devices=used,
                         libtpu_topology=libtpu_topology, hbm=hbm)


def placed_devices(mesh_spec, devices: list, target: str, topology: str):
    """(the jax Mesh or None, the devices the program runs on) for a bundle's mesh over ``devices``."""
    n = mesh_spec.size if mesh_spec is not None else 1
    if n > len(devices):
        raise AotError(f"the program is sharded over {n} devices ({mesh_spec.describe()}); "
                       f"{target} {topology} has {len(devices)}")
    mesh = mesh_spec.concrete(devices) if mesh_spec is not None else None
    return mesh, (list(mesh.devices.flat) if mesh is not None else devices[:1])


def _record(job: dict, raw: bytes, figures: dict) -> CompiledSignature:
    shapes = [list(w["shape"]) for w in job["weights"]] + [list(i["shape"]) for i in job["inputs"]]
    return CompiledSignature(raw, shapes, figures["compile_seconds"])


def finish_target(bundle, compiled: dict, per_sig: dict, *, target, topology, chip, devices, libtpu_topology,
                  hbm) -> CompiledTarget:
    """The CompiledTarget of compiled signatures (with the report), recorded in ``bundle``. ``devices``: the
    devices used, or stand-ins with their ``platform`` and ``device_kind`` (a child compiled them)."""
    report = build_report(target, topology, libtpu_topology, chip, devices, bundle.mesh, per_sig, hbm)
    from .llm.report import lm_report

    llm = lm_report(bundle, report, chip, per_sig)  # an LLM (decode + KV cache state): bytes per token, MFU
    if llm is not None:
        report["llm"] = llm
    result = CompiledTarget(target, topology, devices[0].platform, devices[0].device_kind, len(devices),
                            {k: v for k, v in runtime_versions().items() if k != "tpu_export"}, compiled, report)
    with _RECORD:  # compile_many's threads record into one bundle
        bundle.compiled = [c for c in bundle.compiled if c.key != result.key] + [result]
    return result
