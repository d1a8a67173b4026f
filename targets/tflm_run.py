"""Running a .tflite in the TFLite Micro interpreter (``tflite-micro`` from PyPI) and measuring its arena."""

from __future__ import annotations

import os
import re
import tempfile

import numpy as np

__all__ = ["io_names", "measure_arena", "run_tflm", "TflmError"]

# Generous arena for the measuring run; the real need is read back from the recording allocator.
_PROBE_ARENA = 64 << 20


class TflmError(RuntimeError):
    pass


def io_names(tflite: bytes, signature_index: int = 0) -> tuple[list[str], list[str]]:
    """Signature input/output names in the subgraph's positional order (TFLite Micro runs by position)."""
    from ai_edge_litert import schema_py_generated as s

    m = s.Model.GetRootAs(tflite, 0)
    sg = m.Subgraphs(0)
    order_in = [int(i) for i in sg.InputsAsNumpy()]
    order_out = [int(i) for i in sg.OutputsAsNumpy()]
    if not m.SignatureDefsLength():
        return ([sg.Tensors(i).Name().decode() for i in order_in], [sg.Tensors(i).Name().decode() for i in order_out])
    sd = m.SignatureDefs(signature_index)
    by_tensor_in = {sd.Inputs(k).TensorIndex(): sd.Inputs(k).Name().decode() for k in range(sd.InputsLength())}
    by_tensor_out = {sd.Outputs(k).TensorIndex(): sd.Outputs(k).Name().decode() for k in range(sd.OutputsLength())}
    return [by_tensor_in[i] for i in order_in], [by_tensor_out[i] for i in order_out]


def _interpreter(tflite: bytes, arena: int):
    from tflite_micro.python.tflite_micro import runtime

    try:
        return runtime.Interpreter.from_bytes(tflite, arena_size=arena)
    except Exception as e:  # noqa: BLE001 - the binding raises RuntimeError with TFLM's log text
        raise TflmError(f"TFLite Micro could not load the model (arena {arena} bytes): {e}") from e


def measure_arena(tflite: bytes) -> int:
    """Bytes of tensor arena the model needs: TFLite Micro's RecordingMicroAllocator report, raised to the
    smallest arena the model loads in.

    Measured on this host (64-bit pointers); a 32-bit MCU needs slightly less for the same model.
    """
    interp = _interpreter(tflite, _PROBE_ARENA)
    text = _stderr_of(interp.print_allocations)
    m = re.search(r"Arena allocation total (\d+) bytes", text)
    if not m:
        raise TflmError(f"could not read the arena size from TFLite Micro's report:\n{text[:2000]}")
    return _smallest_that_loads(tflite, int(m.group(1)))


def _stderr_of(fn) -> str:
    """What ``fn`` writes to fd 2 from C++ (TFLite Micro logs there, through C stdio's buffer)."""
    with tempfile.TemporaryFile() as tmp:
        saved = os.dup(2)
        try:
            os.dup2(tmp.fileno(), 2)
            fn()
            _flush_c_stdout()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        tmp.seek(0)
        return tmp.read().decode(errors="replace")


def _loads(tflite: bytes, arena: int) -> bool:
    """Whether the model loads in an ``arena``-byte arena, tried in a forked child where fork exists: TFLite Micro
    can crash instead of failing on an arena a few bytes short (a two-layer FULLY_CONNECTED model at 1,680 of the
    1,696 bytes it needs), and a probe that crashes is one that does not load."""
    if not hasattr(os, "fork"):
        return _loads_here(tflite, arena)
    pid = os.fork()
    if pid == 0:  # the child answers in its exit code and leaves without any Python clean-up
        code = 1
        try:
            code = 0 if _loads_here(tflite, arena) else 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


def _loads_here(tflite: bytes, arena: int) -> bool:
    ok = []

    def attempt():
        try:
            _interpreter(tflite, arena)
            ok.append(True)
        except TflmError:
            pass

    _stderr_of(attempt)  # a probe too small logs its failed allocations: not the user's to read
    return bool(ok)


def _smallest_that_loads(tflite: bytes, reported: int) -> int:
    """The report leaves out the temporary allocations kernels make while they prepare (a tiny model's
    CONV_2D needs ~100 bytes more than reported): grow from the report until the model loads, then
    bisect back, in TFLite Micro's 16-byte alignment steps."""
    if _loads(tflite, reported):
        return reported
    lo, step = reported, 16
    while not _loads(tflite, lo + step):
        lo, step = lo + step, step * 2
        if lo > _PROBE_ARENA:
            raise TflmError(f"the model does not load in TFLite Micro even with a {lo}-byte arena")
    hi = lo + step
    while hi - lo > 16:
        mid = lo + (hi - lo) // 32 * 16
        lo, hi = (lo, mid) if _loads(tflite, mid) else (mid, hi)
    return hi


def _flush_c_stdout() -> None:
    import ctypes

    ctypes.CDLL(None).fflush(None)


def _quantize(x: np.ndarray, detail: dict) -> np.ndarray:
    dtype = np.dtype(detail["dtype"])
    q = detail.get("quantization_parameters") or {}
    scales = np.asarray(q.get("scales", []))
    if dtype.kind in "iu" and scales.size:
        zp = np.asarray(q.get("zero_points", [0]))
        info = np.iinfo(dtype)
        return np.clip(np.round(np.asarray(x, np.float32) / scales + zp), info.min, info.max).astype(dtype)
    return np.asarray(x).astype(dtype)


def _dequantize(y: np.ndarray, detail: dict) -> np.ndarray:
    q = detail.get("quantization_parameters") or {}
    scales = np.asarray(q.get("scales", []))
    if np.asarray(y).dtype.kind in "iu" and scales.size:
        zp = np.asarray(q.get("zero_points", [0]))
        return (np.asarray(y, np.float32) - zp) * scales
    return np.asarray(y)


def run_tflm(tflite: bytes, inputs: dict, arena: int) -> dict:
    """Run ``tflite`` once in TFLite Micro; float inputs are quantized with the input tensors' scale and
    zero point, outputs are returned dequantized (float32), by signature name."""
    names_in, names_out = io_names(tflite)
    interp = _interpreter(tflite, arena)
    for i, name in enumerate(names_in):
        interp.set_input(_quantize(inputs[name], interp.get_input_details(i)), i)
    interp.invoke()
    return {name: _dequantize(interp.get_output(i), interp.get_output_details(i)) for i, name in enumerate(names_out)}
