"""Accuracy-driven mixed precision at real size: a published architecture (random weights, BatchNorm statistics
calibrated as the test zoo does) converted for the `cpu` target with a weight scheme, plainly and with
``max_rel_err``; the output's relative error against torch eager on the LiteRT interpreter, the ops kept float, the
file sizes and the latency on this CPU (the search's own medians).

    .venv/bin/python bench/mixed_precision.py [--models resnet18,mobilenet_v2] [--scheme dynamic_int8]
                                              [--fraction 0.5]

``max_rel_err`` is ``--fraction`` of the plain quantized model's error (so that plain quantization misses it by
construction and the search has work to do). Results: bench/results/mixed_precision.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
RESULTS = os.path.join(ROOT, "bench", "results", "mixed_precision.json")


def one(name: str, scheme: str, fraction: float) -> dict:
    import tpu_export
    from bench.real_models import build_real
    from tpu_export.explore.mixed import mixed_precision

    model, args = build_real(name)
    with tempfile.TemporaryDirectory() as tmp:
        float_path = tpu_export.convert(model, args, targets="cpu", out_dir=tmp)["cpu"]
        # the plain quantized error first, from a search that may keep everything (a bound of 10 is always met)
        _, plain = mixed_precision(model, float_path, args, max_rel_err=10.0, scheme=scheme, repeats=3)
        bound = fraction * plain.rel_err["quantized"]
        t0 = time.perf_counter()
        _, rep = mixed_precision(model, float_path, args, max_rel_err=bound, scheme=scheme, repeats=20)
        search_s = time.perf_counter() - t0
    kept = len(rep.float_ops)
    return {"model": name, "scheme": scheme, "max_rel_err": float(f"{bound:.3g}"),
            "rel_err": {k: float(f"{v:.3g}") for k, v in rep.rel_err.items()},
            "ops_kept_float": kept, "quantizable_ops": kept + len(rep.quantized_ops),
            "kept": [f"{n} ({op})" for n, op, _ in rep.float_ops],
            "bytes": rep.bytes, "latency_us": {k: round(v, 1) for k, v in rep.latency_us.items()},
            "search_s": round(search_s, 1)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="resnet18,mobilenet_v2")
    ap.add_argument("--scheme", default="dynamic_int8")
    ap.add_argument("--fraction", type=float, default=0.5)
    a = ap.parse_args()
    rows = [one(m, a.scheme, a.fraction) for m in a.models.split(",")]
    for r in rows:
        print(json.dumps(r))
    os.makedirs(os.path.dirname(RESULTS), exist_ok=True)
    with open(RESULTS, "w") as f:
        json.dump({"machine": f"{os.cpu_count()} cores", "date": time.strftime("%Y-%m-%d"), "rows": rows}, f,
                  indent=1)


if __name__ == "__main__":
    main()
