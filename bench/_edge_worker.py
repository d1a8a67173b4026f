"""One conversion in a fresh process (ours or the peer's), so time and peak RSS are its own.

Usage: python bench/_edge_worker.py {ours|peer|export-only} MODEL OUT.tflite [real|tiny]  -> one JSON line.
MODEL: a name in bench/real_models.py (real, the default) or tests/zoo.py (tiny).
Runs under the project venv (ours) or the peer's venv (Google's litert-torch, same module name).
"""

import json
import os
import resource
import sys
import time

# appended, not prepended: the peer venv's litert_torch must win over this repo's package of the same name
sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main():
    impl, name, out = sys.argv[1:4]
    size = sys.argv[4] if len(sys.argv) > 4 else "real"
    t_start = time.perf_counter()
    import torch

    try:  # ours in the project's venv, Google's in the peer's (which has no tpu_export)
        from tpu_export import litert_torch
    except ImportError:
        import litert_torch

    if size == "tiny":
        from tests.zoo import build

        module, args = build(name)
    else:
        from bench.real_models import build_real

        module, args = build_real(name)
        # real_models puts the repo first on the path; the peer's own modules must keep winning after this
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        sys.path[:] = [p for p in sys.path if p != root] + [root]
    t0 = time.perf_counter()
    if impl == "export-only":
        # The floor of any torch.export-based converter in a fresh process: importing torch.export's
        # tracer (torch._dynamo and friends) plus one export, with nothing converted.
        with torch.no_grad():
            torch.export.export(module, args, strict=False)
        convert_s = time.perf_counter() - t0
    else:
        model = litert_torch.convert(module, args)
        convert_s = time.perf_counter() - t0
        model.export(out)
    print(json.dumps({
        "impl": impl, "model": name, "convert_s": convert_s,
        "process_s": time.perf_counter() - t_start,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "torch": torch.__version__,
    }))


if __name__ == "__main__":
    main()
