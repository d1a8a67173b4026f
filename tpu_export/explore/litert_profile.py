"""Per-op latency of a .tflite from LiteRT's op profiler, on this CPU, each event tied to the model op it timed.

The model is compiled by LiteRT's CompiledModel API for the CPU with the ``builtin`` kernel mode: no delegate
(XNNPACK) replaces partitions of the graph, so every node the interpreter runs is one of the model's ops, and the
profiler tags each operator event with that op's name, its index in its subgraph and the subgraph's index. Under the
default (XNNPACK) mode the profiler instead lists XNNPACK's own operators, numbered inside each delegated partition,
with fused and split operators (an explicit PAD folded into the next convolution, an ADD with a fused RELU run as an
add and a clamp), so those events cannot be tied to model ops exactly; the figures here are therefore the times of
LiteRT's builtin (optimized, non-delegated) kernels, one thread.

Every event is checked against the model: an operator event whose subgraph or op index is outside the model, or
whose tag is not that op's name, or any delegate event, refuses the whole profile rather than mislabel an op.

The Python API of ai-edge-litert has no profiler, so the C API of the ``libLiteRt.so`` shipped in its package is
called through ctypes (the functions of litert/c/litert_profiler.h, litert_compiled_model.h, litert_model.h).
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import os
import sys
import time

import numpy as np

__all__ = ["OpTime", "OpProfile", "ProfileError", "profile_ops", "profile_model", "fb_text"]

# LiteRtProfilerEventType (litert/c/litert_profiler_event.h)
_DEFAULT, _OPERATOR, _DELEGATE_OPERATOR, _DELEGATE_PROFILED_OPERATOR = 1, 2, 4, 8
# CompiledModel's profiler buffer holds this many events (litert/runtime/compiled_model.cc); past it, events are lost
_MAX_EVENTS = 512 * 1024
# TFLite TensorType -> numpy dtype (tflite/schema/schema.fbs)
_DTYPES = {0: np.float32, 1: np.float16, 2: np.int32, 3: np.uint8, 4: np.int64, 6: np.bool_, 7: np.int16,
           9: np.int8, 10: np.float64, 12: np.uint64, 15: np.uint32, 16: np.uint16}


class ProfileError(RuntimeError):
    """LiteRT's profiler could not run the model, or its events do not map exactly onto the model's ops."""


@dataclasses.dataclass(frozen=True)
class OpTime:
    """One model op's time in a profiled signature run.

    Attributes:
        subgraph: The op's subgraph index in the .tflite.
        index: The op's index in that subgraph (its position in the subgraph's operator list).
        op: The op's name as the profiler tagged it (the builtin name, or a custom op's custom code).
        us: Mean microseconds per signature run, summed over the op's invocations in a run.
        calls: Mean invocations per run (1 for a top-level op; a loop body's ops run once per iteration).
    """

    subgraph: int
    index: int
    op: str
    us: float
    calls: float


@dataclasses.dataclass(frozen=True)
class OpProfile:
    """LiteRT's op profile of one signature.

    Attributes:
        signature: The signature key.
        subgraph: The signature's subgraph index.
        runs: Profiled runs (after one warm-up run).
        invoke_us: Mean microseconds of the interpreter's whole invoke, as the profiler timed it.
        run_us: Mean wall microseconds of each profiled ``LiteRtRunCompiledModel`` call, timed here.
        ops: One entry per op that ran, ordered by (subgraph, index).
    """

    signature: str
    subgraph: int
    runs: int
    invoke_us: float
    run_us: float
    ops: tuple

    def top_level_us(self) -> float:
        """Sum of the signature's own subgraph's op times (ops of called subgraphs are inside their caller's)."""
        return float(sum(o.us for o in self.ops if o.subgraph == self.subgraph))


class _Mem(ctypes.Structure):
    _fields_ = [("total_allocated_bytes", ctypes.c_size_t), ("in_use_allocated_bytes", ctypes.c_size_t),
                ("private_footprint_bytes", ctypes.c_size_t)]


class _Event(ctypes.Structure):  # ProfiledEventData
    _fields_ = [("tag", ctypes.c_char_p), ("event_type", ctypes.c_int), ("start_timestamp_us", ctypes.c_uint64),
                ("elapsed_time_us", ctypes.c_uint64), ("begin_mem_usage", _Mem), ("end_mem_usage", _Mem),
                ("event_metadata1", ctypes.c_uint64), ("event_metadata2", ctypes.c_uint64),
                ("event_source", ctypes.c_int)]


def _library():
    import ai_edge_litert

    path = os.path.join(os.path.dirname(ai_edge_litert.__file__), "libLiteRt.so")
    if not os.path.exists(path):
        raise ProfileError(f"{path}: not found; LiteRT's op profiler needs the libLiteRt.so that ai-edge-litert ships "
                           "on Linux")
    lib = ctypes.CDLL(path)
    for name in ("LiteRtCompiledModelGetProfiler", "LiteRtGetProfilerEvents", "LiteRtStartProfiler"):
        if not hasattr(lib, name):
            raise ProfileError(f"{path}: has no {name}; install an ai-edge-litert whose libLiteRt.so exports "
                               "the profiler C API")
    lib.LiteRtDestroyTensorBuffer.restype = None
    lib.LiteRtDestroyCompiledModel.restype = None
    lib.LiteRtDestroyOptions.restype = None
    lib.LiteRtDestroyModel.restype = None
    lib.LiteRtDestroyEnvironment.restype = None
    return lib


def fb_text(b) -> str:
    """A flatbuffer string field (bytes from the object API) as str."""
    return b.decode() if isinstance(b, bytes) else b


def _op_names(model) -> list:
    """subgraph -> [each op's profiler tag]: the builtin name, or a custom op's custom code."""
    from tpu_export.edge.builder import builtin_names

    names = builtin_names()
    codes = []
    for c in model.operatorCodes:
        code = max(c.builtinCode, c.deprecatedBuiltinCode)
        custom = fb_text(c.customCode)
        codes.append(custom if names[code] == "CUSTOM" and custom else names[code])
    return [[codes[op.opcodeIndex] for op in (sg.operators or [])] for sg in model.subgraphs]


def _feed(dtype, nbytes: int, name: str, given, rng) -> bytes:
    """The bytes of input ``name``: the caller's array, else seeded random values (zeros for integers)."""
    itemsize = np.dtype(dtype).itemsize
    if given is not None:
        arr = np.ascontiguousarray(np.asarray(given).astype(dtype))
        if arr.nbytes != nbytes:
            raise ValueError(f"inputs[{name!r}]: {arr.nbytes} bytes of {np.dtype(dtype).name}, the compiled model's "
                             f"buffer holds {nbytes}; pass an array of the input's shape")
        return arr.tobytes()
    n = nbytes // itemsize
    if np.issubdtype(dtype, np.floating):
        return rng.standard_normal(n).astype(dtype).tobytes()
    return np.zeros(n, dtype).tobytes()


def profile_ops(tflite_path: str, *, signature: str | None = None, inputs: dict | None = None,
                min_time_s: float = 0.5, max_runs: int = 200) -> OpProfile:
    """Profile one signature of a .tflite with LiteRT's op profiler (builtin CPU kernels, one thread).

    Args:
        tflite_path: The .tflite.
        signature: The signature key to run (default: the signature of subgraph 0, else the first).
        inputs: Input name -> array (default: seeded standard-normal floats, zero integers).
        min_time_s: Profile for about this long (at least 3 runs, at most ``max_runs``).
        max_runs: The most profiled runs.

    Returns:
        The OpProfile: each op's mean time per run, keyed by (subgraph, op index).

    Raises:
        ValueError: ``signature`` is not in the model, or an ``inputs`` array does not fit its input.
        ProfileError: The model has no signature, LiteRT fails to load, compile or run it, or an event does not
            map onto a model op.
    """
    from tpu_export.edge.inspect import read_model

    from .overlays import read_tflite

    path = os.fspath(tflite_path)
    return profile_model(path, read_model(read_tflite(path)), signature=signature, inputs=inputs,
                         min_time_s=min_time_s, max_runs=max_runs)


def profile_model(tflite_path: str, model, *, signature: str | None = None, inputs: dict | None = None,
                  min_time_s: float = 0.5, max_runs: int = 200) -> OpProfile:
    """profile_ops for a caller that has read the file already: ``model`` is its parsed flatbuffer
    (``tpu_export.edge.inspect.read_model``), so a caller profiling several signatures reads and parses it once.
    Arguments, result and errors as profile_ops'."""
    path = os.fspath(tflite_path)
    tags = _op_names(model)
    sigs = {fb_text(sd.signatureKey): sd.subgraphIndex for sd in (model.signatureDefs or [])}
    if not sigs:
        raise ProfileError(f"{path}: has no signature; LiteRT's CompiledModel runs a model by signature")
    if signature is None:
        signature = next((k for k, g in sigs.items() if g == 0), next(iter(sigs)))
    if signature not in sigs:
        raise ValueError(f"signature={signature!r}: not in {path}; its signatures are {', '.join(sigs)}")
    sd = next(sd for sd in model.signatureDefs if fb_text(sd.signatureKey) == signature)
    names = {fb_text(t.name) for t in sd.inputs or []}
    unknown = sorted(set(inputs or {}) - names)
    if unknown:
        raise ValueError(f"inputs: {unknown[0]!r} is not an input of signature {signature!r}; its inputs are "
                         f"{', '.join(sorted(names))}")
    lib = _library()
    with _runtime_log():
        return _run(lib, path, signature, sigs[signature], tags, inputs or {}, min_time_s, max_runs,
                    model.subgraphs[sigs[signature]], model)


@contextlib.contextmanager
def _runtime_log():
    """libLiteRt.so logs set-up lines (INFO / WARNING) to the process's stderr and has no level to set from here:
    they are kept aside and shown only when profiling fails, where they may say why."""
    import tempfile

    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as log:
        os.dup2(log.fileno(), 2)
        try:
            yield
        except BaseException:
            os.dup2(saved, 2)
            log.seek(0)
            sys.stderr.write(log.read(1 << 16).decode(errors="replace"))
            raise
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def _run(lib, path, signature, sg_index, tags, inputs, min_time_s, max_runs, sg, model) -> OpProfile:
    h = ctypes.c_void_p
    keep = []  # the option payloads: LiteRT reads them through the compiled model's lifetime

    def check(status, what):
        if status != 0:
            raise ProfileError(f"{path}: LiteRT {what} failed (LiteRtStatus {status})")

    env, mdl, opts, cm = h(), h(), h(), h()
    buffers = []
    try:
        check(lib.LiteRtCreateEnvironment(0, None, ctypes.byref(env)), "LiteRtCreateEnvironment")
        check(lib.LiteRtCreateModelFromFile(env, path.encode(), ctypes.byref(mdl)), "LiteRtCreateModelFromFile")
        check(lib.LiteRtCreateOptions(ctypes.byref(opts)), "LiteRtCreateOptions")
        check(lib.LiteRtSetOptionsHardwareAccelerators(opts, 1), "LiteRtSetOptionsHardwareAccelerators(CPU)")
        no_free = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(lambda p: None)
        keep.append(no_free)
        # runtime options turn the profiler on; the CPU options (identifier "xnnpack") pick the builtin kernels
        for ident, toml in (("runtime_options_string", "enable_profiling = true\n"),
                            ("xnnpack", 'kernel_mode = "builtin"\nnum_threads = 1\n')):
            payload = ctypes.create_string_buffer(toml.encode())
            keep.append(payload)
            opq = h()
            check(lib.LiteRtCreateOpaqueOptions(ident.encode(), ctypes.cast(payload, ctypes.c_void_p), no_free,
                                                ctypes.byref(opq)), f"LiteRtCreateOpaqueOptions({ident})")
            check(lib.LiteRtAddOpaqueOptions(opts, opq), f"LiteRtAddOpaqueOptions({ident})")
        check(lib.LiteRtCreateCompiledModel(env, mdl, opts, ctypes.byref(cm)), "LiteRtCreateCompiledModel")
        prof = h()
        check(lib.LiteRtCompiledModelGetProfiler(cm, ctypes.byref(prof)), "LiteRtCompiledModelGetProfiler")
        if not prof.value:
            raise ProfileError(f"{path}: LiteRT returned no profiler for the compiled model")
        n_sigs = ctypes.c_size_t()
        check(lib.LiteRtGetNumModelSignatures(mdl, ctypes.byref(n_sigs)), "LiteRtGetNumModelSignatures")
        sig, sig_idx = h(), None
        for i in range(n_sigs.value):
            check(lib.LiteRtGetModelSignature(mdl, ctypes.c_size_t(i), ctypes.byref(sig)), "LiteRtGetModelSignature")
            key = ctypes.c_char_p()
            check(lib.LiteRtGetSignatureKey(sig, ctypes.byref(key)), "LiteRtGetSignatureKey")
            if key.value.decode() == signature:
                sig_idx = i
                break
        if sig_idx is None:
            raise ProfileError(f"{path}: LiteRT does not list signature {signature!r}")
        sd = next(sd for sd in model.signatureDefs if fb_text(sd.signatureKey) == signature)
        in_dtypes = {fb_text(t.name): _DTYPES.get(sg.tensors[t.tensorIndex].type) for t in sd.inputs or []}
        rng = np.random.default_rng(0)
        ins, outs = [], []
        for is_in, lst in ((True, ins), (False, outs)):
            cnt = ctypes.c_size_t()
            what = "Inputs" if is_in else "Outputs"
            check(getattr(lib, f"LiteRtGetNumSignature{what}")(sig, ctypes.byref(cnt)), f"LiteRtGetNumSignature{what}")
            for i in range(cnt.value):
                t = h()
                getter = "LiteRtGetSignatureInputTensorByIndex" if is_in else "LiteRtGetSignatureOutputTensorByIndex"
                check(getattr(lib, getter)(sig, ctypes.c_size_t(i), ctypes.byref(t)), getter)
                ttype = ctypes.create_string_buffer(1024)  # LiteRtRankedTensorType, filled by LiteRT
                check(lib.LiteRtGetRankedTensorType(t, ttype), "LiteRtGetRankedTensorType")
                req = h()
                rq = f"LiteRtGetCompiledModel{what[:-1]}BufferRequirements"
                check(getattr(lib, rq)(cm, ctypes.c_size_t(sig_idx), ctypes.c_size_t(i), ctypes.byref(req)), rq)
                b = h()
                check(lib.LiteRtCreateManagedTensorBufferFromRequirements(env, ttype, req, ctypes.byref(b)),
                      "LiteRtCreateManagedTensorBufferFromRequirements")
                buffers.append(b)
                lst.append(b)
                if is_in:
                    name = ctypes.c_char_p()
                    check(lib.LiteRtGetSignatureInputName(sig, ctypes.c_size_t(i), ctypes.byref(name)),
                          "LiteRtGetSignatureInputName")
                    _fill(lib, check, b, name.value.decode(), in_dtypes, inputs, rng)
        in_arr = (h * len(ins))(*ins)
        out_arr = (h * len(outs))(*outs)

        def run():
            t0 = time.perf_counter()
            check(lib.LiteRtRunCompiledModel(cm, ctypes.c_size_t(sig_idx), ctypes.c_size_t(len(ins)), in_arr,
                                             ctypes.c_size_t(len(outs)), out_arr), "LiteRtRunCompiledModel")
            return time.perf_counter() - t0

        run()  # warm-up: first-run allocations stay out of the profile
        n = ctypes.c_int()
        # one profiled run counts the events a run records (a loop body's ops record one per iteration), so the
        # runs fit the profiler's buffer; starting the profiler again clears it
        check(lib.LiteRtStartProfiler(prof), "LiteRtStartProfiler")
        once = run()
        check(lib.LiteRtStopProfiler(prof), "LiteRtStopProfiler")
        check(lib.LiteRtGetNumProfilerEvents(prof, ctypes.byref(n)), "LiteRtGetNumProfilerEvents")
        runs = int(min(max_runs, max(3, min_time_s / max(once, 1e-6)), _MAX_EVENTS // (2 * max(n.value, 1))))
        if runs < 1:
            raise ProfileError(f"{path}: one run records {n.value} profiler events, more than the profiler's buffer "
                               f"holds ({_MAX_EVENTS})")
        check(lib.LiteRtStartProfiler(prof), "LiteRtStartProfiler")
        wall = [run() for _ in range(runs)]
        check(lib.LiteRtStopProfiler(prof), "LiteRtStopProfiler")
        check(lib.LiteRtGetNumProfilerEvents(prof, ctypes.byref(n)), "LiteRtGetNumProfilerEvents")
        events = (_Event * n.value)()
        check(lib.LiteRtGetProfilerEvents(prof, n, events), "LiteRtGetProfilerEvents")
        return _summarize(path, signature, sg_index, tags, events, n.value, runs, wall)
    finally:
        for b in buffers:
            lib.LiteRtDestroyTensorBuffer(b)
        if cm.value:
            lib.LiteRtDestroyCompiledModel(cm)
        if opts.value:
            lib.LiteRtDestroyOptions(opts)
        if mdl.value:
            lib.LiteRtDestroyModel(mdl)
        if env.value:
            lib.LiteRtDestroyEnvironment(env)
        keep.clear()


def _fill(lib, check, buf, name, dtypes, inputs, rng) -> None:
    size = ctypes.c_size_t()
    check(lib.LiteRtGetTensorBufferPackedSize(buf, ctypes.byref(size)), "LiteRtGetTensorBufferPackedSize")
    dtype = dtypes.get(name)
    if dtype is None:
        raise ProfileError(f"input {name!r}: its tensor type has no numpy dtype here; profile a model whose inputs are "
                           "numeric")
    raw = _feed(dtype, size.value, name, inputs.get(name), rng)
    addr = ctypes.c_void_p()
    check(lib.LiteRtLockTensorBuffer(buf, ctypes.byref(addr), 1), "LiteRtLockTensorBuffer(write)")
    try:
        ctypes.memmove(addr, raw, len(raw))
    finally:
        check(lib.LiteRtUnlockTensorBuffer(buf), "LiteRtUnlockTensorBuffer")


def _summarize(path, signature, sg_index, tags, events, n, runs, wall) -> OpProfile:
    if n >= _MAX_EVENTS:
        raise ProfileError(f"{path}: the profiler's buffer ({_MAX_EVENTS} events) filled up, so events were lost")
    total: dict = {}
    calls: dict = {}
    invokes = []
    for e in events[:n]:
        tag = (e.tag or b"").decode(errors="replace")
        if e.event_type in (_DELEGATE_OPERATOR, _DELEGATE_PROFILED_OPERATOR):
            raise ProfileError(f"{path}: the profile holds a delegate's operator {tag!r}, so a delegate ran part of "
                               "the model and its events are not model ops")
        if e.event_type == _DEFAULT and tag == "Invoke" and int(e.event_metadata2) == sg_index:
            invokes.append(e.elapsed_time_us)  # the signature's invoke; a called subgraph's has its own index
        if e.event_type != _OPERATOR:
            continue
        g, k = int(e.event_metadata2), int(e.event_metadata1)
        if g >= len(tags) or k >= len(tags[g]) or tags[g][k] != tag:
            want = tags[g][k] if g < len(tags) and k < len(tags[g]) else "no op"
            raise ProfileError(f"{path}: profiler event {tag!r} names subgraph {g} op {k}, which is {want!r} in the "
                               "model; refusing to tie the profile to ops")
        total[(g, k)] = total.get((g, k), 0) + int(e.elapsed_time_us)
        calls[(g, k)] = calls.get((g, k), 0) + 1
    if len(invokes) != runs:
        raise ProfileError(f"{path}: {len(invokes)} interpreter invokes profiled for {runs} runs")
    missing = [k for k in range(len(tags[sg_index])) if (sg_index, k) not in total]
    if missing:
        raise ProfileError(f"{path}: ops {missing[:5]} of signature {signature!r}'s subgraph have no profiler event")
    ops = tuple(OpTime(g, k, tags[g][k], total[(g, k)] / runs, calls[(g, k)] / runs) for g, k in sorted(total))
    return OpProfile(signature=signature, subgraph=sg_index, runs=runs, invoke_us=float(np.mean(invokes)),
                     run_us=float(np.mean(wall)) * 1e6, ops=ops)
