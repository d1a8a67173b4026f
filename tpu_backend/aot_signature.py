"""One signature's TPU AOT compile, shared by aot.compile_on_devices (in this process) and compile_worker's
child: ``signature_job`` says what the compile needs besides the exported module, as plain JSON (concrete
shapes, shardings, donated inputs); ``compile_signature`` lowers the module for the devices, takes the executable
from the AOT cache or compiles it, and checks it fits the HBM per device. No torch here: the child imports it."""

from __future__ import annotations

import contextlib
import re
import time

from .artifact.report import figures_of
from .platform_specialize import for_platform
from .sharding import named_sharding

__all__ = ["AotError", "HbmOverflowError", "signature_job", "compile_signature"]


class AotError(RuntimeError):
    """The TPU compiler refused the program."""


class HbmOverflowError(AotError):
    """The compiled program needs more HBM per device than the chip has."""

    def __init__(self, msg: str, needed: int | None = None, available: int | None = None):
        super().__init__(msg)
        self.needed, self.available = needed, available


def _concrete_dims(sig, bundle, dim_values) -> dict:
    dims = dict(dim_values or {})
    for spec in sig.inputs:
        for i, d in enumerate(spec.shape):
            if isinstance(d, str) and d not in dims:
                lo = max(1, sig.dim_ranges.get(d, [1])[0])
                sh = (spec.sharding or [None] * len(spec.shape))[i]
                step = bundle.mesh.axis_size(sh) if sh else 1
                dims[d] = -(-lo // step) * step
    return dims


def signature_job(bundle, sig, dim_values=None) -> dict:
    """What compiling one signature needs besides its exported module, as plain JSON: the concrete shapes and
    shardings of its weights and inputs, and the inputs it donates (compile_worker's job file holds these)."""
    from .export import donated_inputs

    dims = _concrete_dims(sig, bundle, dim_values)
    return {
        "name": sig.name,
        "weights": [{"shape": [int(d) for d in bundle.weights[w].shape], "sharding": bundle.weight_shardings.get(w)}
                    for w in sig.weight_names],
        "inputs": [{"shape": [dims[d] if isinstance(d, str) else d for d in s.shape], "sharding": s.sharding}
                   for s in sig.inputs],
        # the inputs the module aliases (KV caches) are donated here too, so the executable updates them in place
        "donate": [1 + i for i in donated_inputs(sig.exported, len(sig.weight_names))],
    }


def compile_signature(exported, job: dict, devices, mesh, hbm, target, topology, cache=(None, None)):
    """(executable bytes, XLA's figures) of one signature (``job``: signature_job's dict) for ``devices``, from
    the AOT cache when ``cache`` = (folder, libtpu topology) has it. Runs here or in compile_worker's child."""
    import jax

    from . import compile_cache

    def sds(shape, dtype, sharding):
        placed = (named_sharding(mesh, sharding or []) if mesh is not None
                  else jax.sharding.SingleDeviceSharding(devices[0]))
        return jax.ShapeDtypeStruct(tuple(shape), dtype, sharding=placed)

    name, n_w = job["name"], len(job["weights"])
    exported = for_platform(exported, devices[0].platform)  # the compiler sees only that platform's program
    w_sds = [sds(w["shape"], a.dtype, w["sharding"]) for w, a in zip(job["weights"], exported.in_avals)]
    in_shapes = [list(i["shape"]) for i in job["inputs"]]
    in_sds = [sds(i["shape"], a.dtype, i["sharding"]) for i, a in zip(job["inputs"], exported.in_avals[n_w:])]
    t0 = time.perf_counter()
    folder, key, hit = cache[0], None, None
    try:
        with _caller_free_locations():
            lowered = jax.jit(exported.call, keep_unused=True, donate_argnums=tuple(job["donate"])).lower(w_sds,
                                                                                                        *in_sds)
        if folder is not None:
            key = compile_cache.cache_key(lowered.as_text(), devices, cache[1])
            hit = compile_cache.read(folder, key)
        compiled = lowered.compile() if hit is None else None
    except Exception as e:  # noqa: BLE001 - the TPU compiler's refusals come as JaxRuntimeError
        msg = str(e)
        if "RESOURCE_EXHAUSTED" in msg or "Ran out of memory" in msg:
            nums = [_bytes(v, u) for v, u in re.findall(r"\(([\d.]+)([KMGT]?)\)", msg)[:2]]
            needed, available = (nums + [None, None])[:2]
            raise HbmOverflowError(
                f"signature {name!r} needs {_gib(needed)} of HBM per device on {target} ({topology}) but "
                f"only {_gib(available)} is available (chip spec: {_gib(hbm)} per device). Fix: shard over more "
                f"chips (mesh + partition_rules), use dtype='bfloat16', or a smaller batch. "
                f"XLA: {msg.splitlines()[0]}",
                needed, available,
            ) from None
        raise AotError(f"signature {name!r}: the {target} compiler failed: {msg.splitlines()[0]}") from e
    seconds = time.perf_counter() - t0
    if hit is not None:  # the executable and XLA's figures of an earlier compile of this very module
        raw, figures = hit
        figures["compiled_seconds_when_stored"] = figures["compile_seconds"]
        figures["compile_seconds"], figures["compile_cache"] = round(seconds, 4), "hit"
        _checked(figures, hbm, name, target, topology)
        return raw, figures
    figures = figures_of(compiled)
    figures["compile_seconds"] = round(seconds, 4)
    figures["input_shapes"] = in_shapes
    mem = figures["memory"]
    needed = mem["argument_bytes"] + mem["output_bytes"] + mem["temp_bytes"] + mem["generated_code_bytes"] \
        - mem["alias_bytes"]
    figures["hbm_needed_bytes_per_device"] = needed
    if job["donate"] and devices[0].platform == "tpu":  # state (an LLM's caches): its HBM traffic for the report
        from .llm.hbm import hbm_traffic_bytes

        figures["hbm_traffic_bytes"] = hbm_traffic_bytes(compiled.as_text())
    _checked(figures, hbm, name, target, topology)
    raw = bytes(compiled.runtime_executable().serialize())
    figures["executable_bytes"] = len(raw)
    if folder is not None:
        try:
            compile_cache.write(folder, key, raw, {**figures, "compile_cache": "stored"})
            figures["compile_cache"] = "miss"
        except OSError as e:  # a full disk or a read-only home costs the next conversion a compile, not this one
            figures["compile_cache"] = f"miss, not stored: {e.strerror or e}"
    return raw, figures


def _caller_free_locations():
    """jax records the Python call stack of a lowering in the module's locations, and libtpu keeps them in the
    executable: the same program compiled from two call sites (this process, compile_worker's child) differed
    in those bytes only. Without the full traceback only the frame here is recorded: the executable is the same
    whoever compiles it. (jax's flag has no public scoped form; thread-local, so compile_many's threads are safe.)"""
    try:
        from jax._src.config import include_full_tracebacks_in_locations
    except ImportError:  # a jax without it: the bytes may carry the caller's stack, nothing else changes
        return contextlib.nullcontext()
    return include_full_tracebacks_in_locations(False)


def _checked(figures, hbm, name, target, topology) -> None:
    """HbmOverflowError unless the program fits the HBM per device."""
    needed, mem = figures["hbm_needed_bytes_per_device"], figures["memory"]
    if hbm is not None and needed > hbm:
        raise HbmOverflowError(
            f"signature {name!r} needs {_gib(needed)} of HBM per device on {target} ({topology}) "
            f"but a device has {_gib(hbm)}: arguments {_gib(mem['argument_bytes'])}, outputs "
            f"{_gib(mem['output_bytes'])}, temporaries {_gib(mem['temp_bytes'])}, code "
            f"{_gib(mem['generated_code_bytes'])}. Fix: shard the weights over more chips (mesh + "
            f"partition_rules), use dtype='bfloat16', or a smaller batch.",
            needed, hbm,
        )


def _gib(b) -> str:
    if b is None:
        return "unknown"
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if b >= size:
            return f"{b / size:.2f} {unit} ({b} bytes)"
    return f"{b} bytes"


def _bytes(v: str, unit: str) -> int:
    return int(float(v) * {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}[unit])
