"""One ONNX -> .tflite conversion in a fresh process (ours or onnx2tf's), so time and peak RSS are its own.

Usage: python bench/_onnx_peer_worker.py {ours|peer|peer-tf} MODEL.onnx OUT.tflite  -> prints one JSON line.
"ours" runs under the project venv (tpu_export.convert(path, targets=["android"]): NHWC image I/O, the
android target's default, as onnx2tf gives); "peer" / "peer-tf" under .bench-venv-onnx2tf (onnx2tf.convert
with its defaults but the backend: float32 and float16 .tflite files, as its users get them).
"""

import json
import os
import shutil
import sys
import tempfile
import time


def peak_rss_mb() -> float:
    """This process's VmHWM (not ru_maxrss, which a forked parent's RSS can inflate)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def cpu_s() -> float:
    """User + system CPU seconds of this process and its children so far (wall time alone is unfair on a busy
    host: a niced conversion waits for the CPU)."""
    import resource

    return sum(r.ru_utime + r.ru_stime for r in (resource.getrusage(resource.RUSAGE_SELF),
                                                 resource.getrusage(resource.RUSAGE_CHILDREN)))


def main():
    impl, onnx_path, out = sys.argv[1:4]
    t_start = time.perf_counter()
    c_start = cpu_s()
    with tempfile.TemporaryDirectory() as tmp:
        if impl == "ours":
            sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
            t0 = time.perf_counter()
            import tpu_export

            written = tpu_export.convert(onnx_path, targets=["android"], out_dir=tmp)["android"]
        else:
            t0 = time.perf_counter()
            import onnx2tf

            # "peer": onnx2tf 2.6's default backend (its own flatbuffer writer); "peer-tf": its TensorFlow
            # Lite converter path (onnx2tf 1.x's only one, still selectable)
            backend = "tf_converter" if impl == "peer-tf" else "flatbuffer_direct"
            onnx2tf.convert(input_onnx_file_path=onnx_path, output_folder_path=tmp, non_verbose=True,
                            tflite_backend=backend)
            stem = os.path.splitext(os.path.basename(onnx_path))[0]
            written = os.path.join(tmp, f"{stem}_float32.tflite")
        convert_s = time.perf_counter() - t0
        convert_cpu_s = cpu_s() - c_start  # the interpreter's own start-up (before main) not counted, as in wall
        shutil.copyfile(written, out)
    print(json.dumps({"impl": impl, "convert_s": convert_s, "convert_cpu_s": convert_cpu_s,
                      "process_s": time.perf_counter() - t_start,
                      "peak_rss_mb": peak_rss_mb()}))


if __name__ == "__main__":
    main()
