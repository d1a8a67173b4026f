"""`tpu-export serve` under load at real size: ResNet-50 (torchvision's architecture and width, random weights;
bench/real_models.py), 224x224 float32 images, converted with a dynamic batch dim (1..32) for tpu-v6e and served
here on PJRT (this host's CPU unless it has a TPU or GPU). For each of batched (--max-batch 32) and unbatched
(--max-batch 1) the server runs as a child process (`tpu-export serve`); this process's client threads (httpx,
one image per request, the JSON bodies encoded once beforehand) keep 1, 8 and 32 requests in flight.

    .venv/bin/python bench/serve.py [--requests 64] [--out bench/results/serve.json]

Writes per setting: images/s, latency p50/p90/p99, the mean rows per model call (from the server's /metrics) and
the max abs error of the answers against torch eager; and the host (CPU count, load average), so that figures from
a shared host are read as such.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLI = "import sys; from tpu_export.cli import main; sys.exit(main())"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _metric(base: str, name: str) -> float:
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    for fam in text_string_to_metric_families(httpx.get(f"{base}/metrics").text):
        for s in fam.samples:
            if s.name == name and s.labels.get("model") == "resnet50":
                return s.value
    return 0.0


def _load(base: str, bodies: list, concurrency: int, requests: int) -> tuple[list, list, float]:
    """(latencies in s, answers, wall seconds) of ``requests`` posts with ``concurrency`` in flight."""
    import httpx

    lat, answers, lock, nxt = [], [None] * requests, threading.Lock(), [0]

    def worker():
        with httpx.Client(base_url=base, timeout=600) as c:
            while True:
                with lock:
                    i = nxt[0]
                    nxt[0] += 1
                if i >= requests:
                    return
                t0 = time.perf_counter()
                r = c.post("/v2/models/resnet50/infer", content=bodies[i % len(bodies)],
                           headers={"content-type": "application/json"})
                dt = time.perf_counter() - t0
                r.raise_for_status()
                with lock:
                    lat.append(dt)
                    answers[i] = r.json()["outputs"][0]["data"]

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return lat, answers, time.perf_counter() - t0


def _pct(xs: list, q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=64, help="requests per setting (at concurrency 1: a quarter)")
    ap.add_argument("--concurrency", default="1,8,32")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "serve.json"))
    a = ap.parse_args()

    import httpx
    import numpy as np
    import torch

    import tpu_export
    from bench.real_models import build_real

    model, _ = build_real("resnet50")
    work = tempfile.mkdtemp(prefix="serve-bench-")
    batch = torch.export.Dim("batch", min=1, max=32)
    t0 = time.perf_counter()
    tpu_export.convert(model, (torch.zeros(2, 3, 224, 224),), targets={"tpu-v6e": {"aot": False}},
                       out_dir=os.path.join(work, "out"), dynamic_shapes=({0: batch},))
    convert_s = time.perf_counter() - t0
    rng = np.random.default_rng(0)
    images = [rng.standard_normal((1, 3, 224, 224)).astype(np.float32) for _ in range(8)]
    with torch.no_grad():
        want = [model(torch.from_numpy(x)).numpy().ravel() for x in images]
    bodies = [json.dumps({"inputs": [{"name": "x", "shape": [1, 3, 224, 224], "datatype": "FP32",
                                      "data": x.ravel().tolist()}]}).encode() for x in images]
    levels = [int(c) for c in a.concurrency.split(",")]
    rows = []
    for mode, max_batch in (("batched", 32), ("unbatched", 1)):
        port = _port()
        base = f"http://127.0.0.1:{port}"
        t0 = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-c", CLI, "serve", f"resnet50={work}/out/tpu-v6e", "--port",
                                 str(port), "--max-batch", str(max_batch), "--batch-timeout-ms", "5",
                                 "--log-level", "warning"], cwd=ROOT)
        try:
            while True:
                assert proc.poll() is None, "the server exited"
                try:
                    if httpx.get(f"{base}/v2/health/ready").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                time.sleep(0.2)
            start_s = time.perf_counter() - t0
            _load(base, bodies, 1, 2)  # the first requests' connection setup
            for c in levels:
                n = max(a.requests // 4, 4) if c == 1 else a.requests
                calls0 = _metric(base, "tpu_export_serve_batch_size_count")
                rows0 = _metric(base, "tpu_export_serve_batch_size_sum")
                lat, answers, wall = _load(base, bodies, c, n)
                calls = _metric(base, "tpu_export_serve_batch_size_count") - calls0
                err = max(float(np.abs(np.asarray(ans) - want[i % len(want)]).max())
                          for i, ans in enumerate(answers))
                row = {"mode": mode, "max_batch": max_batch, "concurrency": c, "requests": n,
                       "images_per_s": n / wall, "p50_ms": _pct(lat, 0.5) * 1e3, "p90_ms": _pct(lat, 0.9) * 1e3,
                       "p99_ms": _pct(lat, 0.99) * 1e3, "mean_ms": statistics.mean(lat) * 1e3,
                       "rows_per_call": (_metric(base, "tpu_export_serve_batch_size_sum") - rows0) / calls,
                       "max_abs_err_vs_torch": err, "server_start_s": start_s}
                rows.append(row)
                print(json.dumps(row), flush=True)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(120)
    result = {"command": " ".join(["bench/serve.py", *sys.argv[1:]]), "model": "resnet50 (25.6M params), 224x224",
              "convert_s": convert_s,
              "host": {"platform": platform.platform(), "cpus": os.cpu_count(), "loadavg_at_end": os.getloadavg(),
                       "python": platform.python_version()},
              "rows": rows}
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(result, f, indent=2)
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
