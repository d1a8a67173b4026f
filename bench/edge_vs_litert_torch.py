"""Edge path vs Google's litert-torch 0.10.0, side by side in one run.

    .venv/bin/python bench/edge_vs_litert_torch.py [--models resnet18,vit_b_16] [--runs 60] [--conversions 3]
                                                   [--tiny]

Models: real sizes by default (bench/real_models.py: torchvision's architectures at their published
widths, 224x224, batch 1, random weights; bert_base at 128 tokens); ``--tiny`` takes the tests' tiny zoo
(tests/zoo.py, where conversion time is mostly fixed cost and latency hides the convolutions).

Installs litert-torch 0.10.0 into its own venv (.bench-venv-peer; it owns the module name
`litert_torch`) and converts each model with both in fresh subprocesses: conversion wall time and
peak RSS are the median of --conversions runs, interleaved with the peer's and with torch.export
alone ("export": importing its tracer and exporting once, the floor of any torch.export-based
converter; "x bound" = peer time / export time). Then, in this process: .tflite size, LiteRT
interpreter latency (1 thread, median of --runs, ours and the peer's in alternating blocks of 5),
max rel err vs torch eager, and our/peer ratios.

Both converters run as installed packages do, from bytecode: pip compiled the peer's when it installed
it; this repo is an editable install, and where PYTHONDONTWRITEBYTECODE is set (as on this machine)
Python would recompile our sources in every worker (~0.04 s of each conversion), so the script
compiles them once first (into the usual __pycache__ folders, git-ignored).
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PEER_VENV = os.path.join(ROOT, ".bench-venv-peer")
sys.path.insert(0, ROOT)

REAL_MODELS = ["resnet18", "mobilenet_v2", "efficientnet_b0", "convnext_tiny", "vit_b_16", "swin_t", "swinv2_cr_tiny",
               "bert_base"]
TINY_MODELS = ["resnet18", "mobilenet_v2", "mobilenet_v3", "efficientnet", "shufflenet_v2", "squeezenet",
                  "regnet", "convnext", "densenet", "deeplabv3", "lraspp", "vit", "swin", "bert", "llama", "t5"]


def ensure_peer() -> str:
    py = os.path.join(PEER_VENV, "bin", "python")
    if not os.path.exists(py):
        subprocess.run([sys.executable, "-m", "venv", PEER_VENV], check=True)
    r = subprocess.run([py, "-c", "import litert_torch, importlib.metadata as m; print(m.version('litert-torch'))"],
                       capture_output=True, text=True)
    if r.returncode != 0 or not r.stdout.strip().startswith("0.10.0"):
        # torch pinned to the local CPU wheel: an unpinned torch would pull a CUDA build.
        subprocess.run([py, "-m", "pip", "install", "-q", "torch==2.13.0", "litert-torch==0.10.0"], check=True)
    return py


def compile_our_sources():
    import compileall

    for pkg in ("converter", "edge", "litert_torch", "tpu_backend", "targets", "tpu_export"):
        compileall.compile_dir(os.path.join(ROOT, pkg), quiet=1)


def convert_in_subprocess(py, impl, model, out, size="real"):
    from _worker_json import run_json

    return run_json([py, os.path.join(ROOT, "bench", "_edge_worker.py"), impl, model, out, size], timeout=1800)


def build(name, size):
    """The same builders the worker uses (bench/_edge_worker.py build)."""
    if size == "tiny":
        from tests.zoo import build as tiny

        return tiny(name)
    from bench.real_models import build_real

    return build_real(name)


def median_run(infos: list) -> dict:
    """The run with the median conversion time (its own peak RSS), or the first error."""
    errors = [i for i in infos if "error" in i]
    if errors:
        return errors[0]
    return sorted(infos, key=lambda i: i["convert_s"])[len(infos) // 2]


class Timed:
    """One .tflite in the LiteRT interpreter (1 thread, XNNPACK): ``feed(input details) -> {name: array}`` builds
    its inputs once; three warm-up calls, then ``block(n)`` times n calls (ms in ``times``)."""

    def __init__(self, path, feed):
        from ai_edge_litert.interpreter import Interpreter

        it = Interpreter(model_path=path, num_threads=1)
        self.runner = it.get_signature_runner()
        self.feed = feed(self.runner.get_input_details())
        for _ in range(3):
            self.out = self.runner(**self.feed)
        self.times = []

    def block(self, n):
        for _ in range(n):
            t = time.perf_counter()
            self.runner(**self.feed)
            self.times.append((time.perf_counter() - t) * 1e3)


def feed_by_position(inputs, params):
    """The model's inputs by signature name: ours are forward's parameter names, the peer's args_0, args_1, ...;
    each cast to the input's dtype (int64 ids -> the model's int32)."""
    def position(n):
        return params.index(n) if n in params else int(n.rsplit("_", 1)[-1])

    return lambda details: {n: inputs[position(n)].astype(d["dtype"]) for n, d in details.items()}


def latencies_ms(timed: dict, runs: int) -> dict:
    """Median latency of each, measured in alternating blocks of 5 runs (a burst of load on this
    shared host then hits both sides, not whichever happened to run during it)."""
    for _ in range(max(1, runs // 5)):
        for t in timed.values():
            t.block(5)
    return {k: statistics.median(t.times) for k, t in timed.items()}


def rel_err(outs: dict, ref) -> float:
    import numpy as np
    import torch.utils._pytree as pytree

    refs = [r.detach().numpy() for r in pytree.tree_leaves(ref)]
    got = [outs[k] for k in sorted(outs, key=lambda k: int(k.rsplit("_", 1)[-1])
                                   if k.rsplit("_", 1)[-1].isdigit() else 0)]
    if len(got) != len(refs):
        return float("nan")
    worst = 0.0
    for g, r in zip(got, refs):
        if g.shape != r.shape:
            return float("nan")
        worst = max(worst, float(np.abs(g.astype("f8") - r).max() / max(np.abs(r).max(), 1e-6)))
    return worst


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default=None)
    ap.add_argument("--tiny", action="store_true", help="the tests' tiny zoo instead of the real sizes")
    ap.add_argument("--runs", type=int, default=60)
    ap.add_argument("--conversions", type=int, default=3, help="fresh-process conversions per model and converter")
    a = ap.parse_args()
    import numpy as np
    import torch

    size = "tiny" if a.tiny else "real"
    models = a.models or ",".join(TINY_MODELS if a.tiny else REAL_MODELS)
    peer_py = ensure_peer()
    compile_our_sources()
    ours_py = sys.executable
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in models.split(","):
            module, args = build(name, size)
            with torch.no_grad():
                ref = module(*args)
            params = list(inspect.signature(module.forward).parameters)
            inputs = [x.numpy().astype(np.int32) if x.dtype == torch.int64 else x.numpy() for x in args]
            row = {"model": name}
            workers = (("export", ours_py, "export-only"), ("ours", ours_py, "ours"), ("peer", peer_py, "peer"))
            for key, _, _ in workers:
                row[key] = []
            for _ in range(a.conversions):  # interleaved, so that load on the machine hits all three alike
                for key, py, impl in workers:
                    row[key].append(convert_in_subprocess(py, impl, name, os.path.join(tmp, f"{name}.{key}.tflite"),
                                                         size))
            for key, _, _ in workers:
                row[key] = median_run(row[key])
            timed = {}
            for impl in ("ours", "peer"):
                out = os.path.join(tmp, f"{name}.{impl}.tflite")
                info = row[impl]
                if "error" in info:
                    continue
                feed = inputs
                if impl == "peer":  # the peer keeps int64 ids
                    feed = [x.numpy() for x in args]
                try:
                    timed[impl] = Timed(out, feed_by_position(feed, params))
                    info.update(size=os.path.getsize(out), rel_err=rel_err(timed[impl].out, ref))
                except Exception as e:  # noqa: BLE001
                    info.update(error=f"run: {e}"[:200])
                    timed.pop(impl, None)
            for impl, ms in latencies_ms(timed, a.runs).items():
                row[impl]["latency_ms"] = ms
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    report(rows)
    record(rows, size, bool(a.models))


def report(rows):
    hdr = (f"{'model':14s} {'export':>7s} {'conv ours':>9s} {'conv peer':>9s} {'x faster':>8s} {'x bound':>7s} "
           f"{'rss ours':>8s} {'rss peer':>8s} {'rss ratio':>9s} {'lat ours':>8s} {'lat peer':>8s} {'lat ratio':>9s} "
           f"{'size ratio':>10s} {'err ours':>9s} {'err peer':>9s}")
    print(hdr)
    sums = {"co": 0, "cp": 0, "ex": 0}
    speed, bound, rss, lat, size = [], [], [], [], []
    for r in rows:
        o, p = r.get("ours", {}), r.get("peer", {})
        if "error" in o or "error" in p:
            print(f"{r['model']:14s} ours: {o.get('error', 'ok')}  peer: {p.get('error', 'ok')}")
            continue
        sums["co"] += o["convert_s"]
        sums["cp"] += p["convert_s"]
        speed.append(p["convert_s"] / o["convert_s"])
        ex = r.get("export", {}).get("convert_s", float("nan"))
        sums["ex"] += ex
        bound.append(p["convert_s"] / ex)  # the speed-up a converter that took no time after torch.export would get
        rss.append(o["peak_rss_mb"] / p["peak_rss_mb"])
        lat.append(o["latency_ms"] / p["latency_ms"])
        size.append(o["size"] / p["size"])
        print(f"{r['model']:14s} {ex:7.2f} {o['convert_s']:9.2f} {p['convert_s']:9.2f} {speed[-1]:8.2f} "
              f"{bound[-1]:7.2f} {o['peak_rss_mb']:8.0f} "
              f"{p['peak_rss_mb']:8.0f} {rss[-1]:9.2f} {o['latency_ms']:8.3f} {p['latency_ms']:8.3f} {lat[-1]:9.2f} "
              f"{size[-1]:10.3f} {o['rel_err']:9.1e} {p['rel_err']:9.1e}")
    if speed:
        import statistics as st

        print(f"\nconversion: {sums['cp'] / sums['co']:.2f}x faster summed (goal >= 3x), "
              f"min {min(speed):.2f}x (goal >= 2x)")
        print(f"  bound set by torch.export alone (import + one export, fresh process): {sums['cp'] / sums['ex']:.2f}x "
              f"summed, min {min(bound):.2f}x")
        print(f"peak RSS: max ratio {max(rss):.2f} (goal <= 0.7)")
        print(f"latency: median ratio {st.median(lat):.2f} (goal <= 1.00), max {max(lat):.2f} (goal <= 1.10)")
        print(f"size: max ratio {max(size):.3f} (goal <= 1.01)")


COLUMNS = [("model", "model", None), ("export_s", "export s", ".2f"), ("ours_s", "ours s", ".2f"),
           ("peer_s", "peer s", ".2f"), ("x_faster", "x faster", ".2f"), ("x_bound", "x bound", ".2f"),
           ("rss_ours_mb", "RSS ours MB", ".0f"), ("rss_peer_mb", "RSS peer MB", ".0f"),
           ("rss_ratio", "RSS ratio", ".2f"),
           ("lat_ours_ms", "latency ours ms", ".3f"), ("lat_peer_ms", "latency peer ms", ".3f"),
           ("lat_ratio", "latency ratio", ".2f"), ("size_ratio", "size ratio", ".3f"),
           ("err_ours", "rel err ours", ".1e"), ("err_peer", "rel err peer", ".1e")]


def headline(table: list[dict]) -> str:
    import statistics as st

    co, cp = sum(r["ours_s"] for r in table), sum(r["peer_s"] for r in table)
    return (f"conversion {cp / co:.2f}x faster summed (min {min(r['x_faster'] for r in table):.2f}x); "
            f"peak RSS ratio max {max(r['rss_ratio'] for r in table):.2f}; latency ratio median "
            f"{st.median(r['lat_ratio'] for r in table):.2f}; size ratio max {max(r['size_ratio'] for r in table):.3f}")


def record(rows, size: str, subset: bool) -> None:
    """Append this run to bench/results/edge_vs_litert_torch.json (a model that failed on either side is a note)."""
    from bench.render_pages import append_run

    table, failed = [], []
    for r in rows:
        o, p, ex = r.get("ours", {}), r.get("peer", {}), r.get("export", {})
        if "error" in o or "error" in p:
            failed.append(f"{r['model']}: ours {o.get('error', 'ok')}; peer {p.get('error', 'ok')}")
            continue
        table.append({"model": r["model"], "export_s": ex.get("convert_s"), "ours_s": o["convert_s"],
                      "peer_s": p["convert_s"], "x_faster": p["convert_s"] / o["convert_s"],
                      "x_bound": p["convert_s"] / ex["convert_s"] if ex.get("convert_s") else None,
                      "rss_ours_mb": o["peak_rss_mb"], "rss_peer_mb": p["peak_rss_mb"],
                      "rss_ratio": o["peak_rss_mb"] / p["peak_rss_mb"], "lat_ours_ms": o["latency_ms"],
                      "lat_peer_ms": p["latency_ms"], "lat_ratio": o["latency_ms"] / p["latency_ms"],
                      "size_ratio": o["size"] / p["size"], "err_ours": o["rel_err"], "err_peer": p["rel_err"]})
    if not table:
        return
    columns = [{"key": k, "label": label, **({"fmt": f} if f else {})} for k, label, f in COLUMNS]
    # a run of chosen models is a set of its own, so that it does not replace the table of the default set
    set_name = "tiny" if size == "tiny" else ("swin" if subset and all("swin" in r["model"] for r in table)
                                              else "real")
    append_run("edge_vs_litert_torch", columns, table, headline(table), set_name=set_name, notes=failed or None)


if __name__ == "__main__":
    main()
