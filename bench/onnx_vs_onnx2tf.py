"""ONNX files to .tflite: ours vs onnx2tf 2.6, side by side in one run.

    .venv/bin/python bench/onnx_vs_onnx2tf.py [--models resnet18,bert_base] [--exporter torchscript17|dynamo18]
                                              [--runs 60]

The models are bench/real_models.py's architectures at their published sizes (torchvision's widths and
depths, 224x224 RGB, batch 1; bert-base at 128 tokens), random seeded weights, exported to ONNX once
(static shapes) by torch.onnx.export: the TorchScript exporter at opset 17 (default) or the dynamo exporter
at opset 18. Each file is then converted once by each converter in a fresh process (bench/_onnx_peer_worker.py):
ours is tpu_export.convert(path, targets=["android"]) (NHWC image inputs/outputs, the android default);
onnx2tf 2.6 runs with its defaults in its own venv (.bench-venv-onnx2tf, Python >= 3.12 as onnx2tf 2.x
requires, installed here with pip), once with its default backend (flatbuffer_direct: its own .tflite
writer) and once with tflite_backend="tf_converter" (TensorFlow's converter, onnx2tf 1.x's path; minutes
per model: --peers peer skips it). Columns: conversion wall time, its CPU time (user + system, the worker and
its children: on a shared host the fairer figure) and peak RSS (the worker's VmHWM),
.tflite size (onnx2tf's *_float32.tflite), LiteRT interpreter latency (1 thread, median, ours and
onnx2tf's in alternating blocks of 5; the ratio is the median over --fresh processes of a CPU-time A/B,
bench/onnx_latency_ab.py), TRANSPOSE ops in the file, max rel err vs onnxruntime on the same
input (NHWC inputs get the transposed image; NHWC outputs are compared transposed back).
Goals: conversion >= 5x faster, latency <= 0.90x, no more TRANSPOSEs than onnx2tf, size <= 1.01x.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PEER_VENV = os.path.join(ROOT, ".bench-venv-onnx2tf")
sys.path.insert(0, ROOT)

DEFAULT_MODELS = ["resnet18", "resnet50", "mobilenet_v2", "efficientnet_b0", "regnet_y_400mf", "densenet121",
                  "convnext_tiny", "swin_t", "vit_b_16", "bert_base"]
# onnx2tf 2.x's own dependencies (its README's install line): TensorFlow, tf-keras, the ONNX tools it calls
PEER_PACKAGES = ["onnx2tf==2.6.*", "tensorflow-cpu", "tf-keras", "onnx", "onnxruntime", "onnx-graphsurgeon",
                 "sng4onnx", "psutil", "ai-edge-litert"]


def _python312() -> str:
    """A Python >= 3.12 to build the peer's venv with (onnx2tf 2.x requires it; this repo's venv is 3.11)."""
    cands = [os.environ.get("ONNX2TF_PYTHON", "")] + [f"python3.{v}" for v in (12, 13)]
    cands += sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.1[23]*/bin/python")))
    import shutil

    for c in cands:
        path = shutil.which(c) if c and not os.path.isabs(c) else c
        if path and os.path.exists(path):
            return path
    raise SystemExit("onnx2tf 2.6 needs Python >= 3.12: none found; set ONNX2TF_PYTHON=/path/to/python3.12")


def ensure_peer() -> str:
    py = os.path.join(PEER_VENV, "bin", "python")
    if not os.path.exists(py):
        subprocess.run([_python312(), "-m", "venv", PEER_VENV], check=True)
    r = subprocess.run([py, "-c", "import onnx2tf, importlib.metadata as m; print(m.version('onnx2tf'))"],
                       capture_output=True, text=True)
    if r.returncode != 0 or not r.stdout.strip().startswith("2.6."):
        subprocess.run([py, "-m", "pip", "install", "-q", *PEER_PACKAGES], check=True)
    return py


class _Bert(torch.nn.Module):
    """(ids, mask) -> (last hidden state, pooled): transformers' forward takes its keyword arguments positionally
    in the TorchScript tracer (BertModel.forward() got multiple values for argument 'use_cache')."""

    def __init__(self, bert):
        super().__init__()
        self.bert = bert

    def forward(self, input_ids, attention_mask):
        out = self.bert(input_ids=input_ids, attention_mask=attention_mask, return_dict=True)
        return out.last_hidden_state, out.pooler_output


def export_onnx(name: str, path: str, exporter: str):
    """Export one real-size model; returns the torch inputs as numpy arrays (NCHW, int64 ids)."""
    from bench.real_models import build_real

    module, args = build_real(name)
    names = ["input_ids", "attention_mask"] if name == "bert_base" else ["x"]
    if name == "bert_base":
        module = _Bert(module)
    with torch.no_grad():
        if exporter == "torchscript17":
            torch.onnx.export(module, args, path, opset_version=17, dynamo=False, input_names=names)
        else:
            torch.onnx.export(module, args, path, opset_version=18, dynamo=True, verbose=False,
                              input_names=names).save(path)
    return {n: a.numpy() for n, a in zip(names, args)}


def convert_in_subprocess(py, impl, onnx_path, out):
    from _worker_json import run_json

    return run_json([py, os.path.join(ROOT, "bench", "_onnx_peer_worker.py"), impl, onnx_path, out], timeout=1800,
                    extra_env={"CUDA_VISIBLE_DEVICES": ""})


def convert_alternating(impls, peer_py, onnx_path, tmp, name, runs) -> dict:
    """{impl: its worker's row, with convert_s / convert_cpu_s the medians of ``runs`` conversions}: one at a time
    (the host is shared), ours and each peer alternating, so that a noisy stretch falls on both."""
    each = {impl: [] for impl in impls}
    for _ in range(runs):
        for impl in impls:
            py = sys.executable if impl == "ours" else peer_py
            each[impl].append(convert_in_subprocess(py, impl, onnx_path, os.path.join(tmp, f"{name}.{impl}.tflite")))
    rows = {}
    for impl, infos in each.items():
        ok = [i for i in infos if "error" not in i]
        if not ok:
            rows[impl] = infos[0]
            continue
        row = dict(ok[-1])
        for key in ("convert_s", "convert_cpu_s", "peak_rss_mb"):
            vals = [i[key] for i in ok if key in i]
            if vals:
                row[key] = statistics.median(vals)
                row[f"{key}_each"] = vals
        rows[impl] = row
    return rows


def torch_import_floor_cpu_s() -> float:
    """CPU seconds a fresh interpreter spends on ``import torch`` and torch.export's tracer (which imports dynamo): the
    part of each of our conversions that is torch's own start-up, whatever the model."""
    code = ("import resource, torch, torch.export._trace; r = resource.getrusage(resource.RUSAGE_SELF); "
            "print(r.ru_utime + r.ru_stime)")
    base = ("import resource; r = resource.getrusage(resource.RUSAGE_SELF); print(r.ru_utime + r.ru_stime)")
    runs = [float(subprocess.run([sys.executable, "-c", c], capture_output=True, text=True, check=True).stdout)
            for _ in range(3) for c in (code, base)]
    return statistics.median(runs[0::2]) - statistics.median(runs[1::2])


def _key(name: str) -> str:
    return re.sub(r"[^0-9a-z]", "", name.lower())


def onnx_feed(inputs: dict):
    """The ONNX inputs by signature name (matched ignoring case and punctuation, else by position), NCHW images
    transposed where the .tflite asks NHWC (both converters give NHWC image inputs), cast to its dtypes."""
    def feed(details):
        by_key = {_key(n): a for n, a in inputs.items()}
        order = list(inputs.values())
        out = {}
        for i, (n, d) in enumerate(details.items()):
            a = by_key.get(_key(n), order[i] if i < len(order) else None)
            want = tuple(d["shape"])
            if a.shape != want and a.ndim == 4 and a.transpose(0, 2, 3, 1).shape == want:
                a = a.transpose(0, 2, 3, 1)
            out[n] = a.astype(d["dtype"])
        return out

    return feed


def _fits(g, r) -> bool:
    return g.shape == r.shape or (r.ndim == 4 and g.ndim == 4 and g.transpose(0, 3, 1, 2).shape == r.shape)


def rel_err_vs(outs: dict, refs: dict) -> float:
    """Max rel err over the ONNX outputs; each matched to a .tflite output by name, else by element count and
    shape (NHWC outputs transposed back)."""
    import numpy as np

    from tests.numerics import rel_err

    free = dict(outs)
    worst = 0.0
    for name, r in refs.items():
        pick = next((k for k in free if _key(k) == _key(name)), None)
        if pick is None:
            pick = next((k for k in free if _fits(free[k], r)), None)
        if pick is None:
            return float("nan")
        g = free.pop(pick)
        if g.shape != r.shape and r.ndim == 4:
            g = g.transpose(0, 3, 1, 2)
        worst = max(worst, rel_err(np.asarray(g, np.float64), r))
    return worst


def transposes(path: str) -> int:
    from tpu_export.edge.inspect import op_histogram

    with open(path, "rb") as f:
        return op_histogram(f.read()).get("TRANSPOSE", 0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default=",".join(DEFAULT_MODELS))
    ap.add_argument("--exporter", default="torchscript17", choices=("torchscript17", "dynamo18"))
    ap.add_argument("--runs", type=int, default=60)
    ap.add_argument("--convert-runs", type=int, default=1,
                    help="conversions per converter, alternating ours / each peer; the row keeps the medians")
    ap.add_argument("--fresh", type=int, default=4,
                    help="the latency ratio is the median of this many fresh-process A/Bs by CPU time "
                         "(bench/onnx_latency_ab.py; one process's ratio is off by up to +-5%% here); 0: one "
                         "process's wall medians only")
    ap.add_argument("--report", metavar="ROWS.jsonl", help="print the tables from rows a run wrote to stderr")
    ap.add_argument("--peers", default="peer,peer-tf",
                    help="peer: onnx2tf's default flatbuffer_direct backend; peer-tf: its tf_converter backend "
                         "(TensorFlow Lite's converter, minutes per model)")
    a = ap.parse_args()
    impls = ["ours"] + a.peers.split(",")
    if a.report:
        with open(a.report) as f:
            rows = [json.loads(line) for line in f if line.startswith("{")]
        for peer in impls[1:]:
            report(rows, a.exporter, peer)
        return
    import onnxruntime as ort

    from bench.edge_vs_litert_torch import Timed, compile_our_sources, latencies_ms

    peer_py = ensure_peer()
    compile_our_sources()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in a.models.split(","):
            onnx_path = os.path.join(tmp, f"{name}.onnx")
            try:
                inputs = export_onnx(name, onnx_path, a.exporter)
            except Exception as e:  # noqa: BLE001 - a model torch cannot export is a row, not the end of the run
                rows.append({"model": name, **{i: {"error": f"torch.onnx.export: {e}"[:200]} for i in impls}})
                continue
            sess = ort.InferenceSession(onnx_path, providers=["CPUExecutionProvider"])
            refs = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, inputs)))
            del sess
            row = {"model": name, **convert_alternating(impls, peer_py, onnx_path, tmp, name, a.convert_runs)}
            timed = {}
            for impl in impls:
                out, info = os.path.join(tmp, f"{name}.{impl}.tflite"), row[impl]
                if "error" in info:
                    continue
                try:
                    timed[impl] = Timed(out, onnx_feed(inputs))
                    info.update(size=os.path.getsize(out), transposes=transposes(out),
                                rel_err=rel_err_vs(timed[impl].out, refs))
                except Exception as e:  # noqa: BLE001 - one model's failure is a row, not the end of the run
                    info.update(error=f"run: {e}"[:200])
                    timed.pop(impl, None)
            for impl, ms in latencies_ms(timed, a.runs).items():
                row[impl]["latency_ms"] = ms
            del timed
            if a.fresh:
                _fresh_latency(row, impls, name, tmp, inputs, a.fresh)
            os.remove(onnx_path)
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    for peer in impls[1:]:
        report(rows, a.exporter, peer)
        record(rows, a.exporter, peer)
    print(f"\nfloor: import torch + torch.export in a fresh interpreter, {torch_import_floor_cpu_s():.2f} CPU s "
          f"(part of each of ours)")


def _fresh_latency(row, impls, name, tmp, inputs, n):
    """Each peer's ``cpu_ratio_fresh``: ours / its CPU ms per invoke, the median over n fresh processes."""
    import numpy as np

    from bench.onnx_latency_ab import fresh_ratios

    ours = os.path.join(tmp, f"{name}.ours.tflite")
    if "error" in row["ours"]:
        return
    x_path = None
    if len(inputs) == 1:  # one image / tensor input: the same values on both sides (else seeded random ones)
        x_path = os.path.join(tmp, f"{name}.x.npy")
        np.save(x_path, next(iter(inputs.values())))
    for impl in impls[1:]:
        if "error" not in row[impl]:
            r = fresh_ratios(ours, os.path.join(tmp, f"{name}.{impl}.tflite"), x_path, n)
            row[impl]["cpu_ratio_fresh"] = statistics.median(r)
            row[impl]["cpu_ratio_fresh_each"] = r


def report(rows, exporter, peer):
    backend = {"peer": "flatbuffer_direct", "peer-tf": "tf_converter"}[peer]
    print(f"\nONNX files from torch.onnx.export ({exporter}); ours = tpu_export android, "
          f"peer = onnx2tf 2.6 tflite_backend={backend}")
    print(f"{'model':16s} {'conv ours':>9s} {'conv peer':>9s} {'x faster':>8s} {'cpu ours':>8s} {'cpu peer':>8s} "
          f"{'x cpu':>6s} {'rss ours':>8s} {'rss peer':>8s} "
          f"{'lat ours':>8s} {'lat peer':>8s} {'lat ratio':>9s} {'MB ours':>8s} {'size ratio':>10s} "
          f"{'T ours':>6s} {'T peer':>6s} {'err ours':>9s} {'err peer':>9s}")
    speed, cpu, lat, size, tr = [], [], [], [], []
    for r in rows:
        o, p = r["ours"], r.get(peer, {"error": "not run"})
        if "error" in o or "error" in p:
            ours = o.get("error") or (f"ok ({o['convert_s']:.2f} s, {o['peak_rss_mb']:.0f} MB, "
                                      f"{o['latency_ms']:.2f} ms, {o['transposes']} TRANSPOSE, err {o['rel_err']:.1e})")
            print(f"{r['model']:16s} ours: {ours}  peer: {p.get('error', 'ok').splitlines()[0]}")
            continue
        speed.append(p["convert_s"] / o["convert_s"])
        # CPU seconds (user + system, the worker and its children): what a conversion costs, whatever else runs
        o_cpu, p_cpu = o.get("convert_cpu_s", float("nan")), p.get("convert_cpu_s", float("nan"))
        cpu.append(p_cpu / o_cpu)
        # the fresh-process A/B by CPU time where it ran; one process's wall medians otherwise
        lat.append(p.get("cpu_ratio_fresh", o["latency_ms"] / p["latency_ms"]))
        size.append(o["size"] / p["size"])
        tr.append(o["transposes"] - p["transposes"])
        print(f"{r['model']:16s} {o['convert_s']:9.2f} {p['convert_s']:9.2f} {speed[-1]:8.2f} {o_cpu:8.2f} "
              f"{p_cpu:8.2f} {cpu[-1]:6.2f} {o['peak_rss_mb']:8.0f} "
              f"{p['peak_rss_mb']:8.0f} {o['latency_ms']:8.2f} {p['latency_ms']:8.2f} {lat[-1]:9.2f} "
              f"{o['size'] / 2**20:8.1f} {size[-1]:10.3f} {o['transposes']:6d} {p['transposes']:6d} "
              f"{o['rel_err']:9.1e} {p['rel_err']:9.1e}")
    if speed:
        print(f"\nconversion: min {min(speed):.2f}x faster (goal >= 5x), median {statistics.median(speed):.2f}x; "
              f"in CPU seconds min {min(cpu):.2f}x, median {statistics.median(cpu):.2f}x")
        print(f"latency: max ratio {max(lat):.2f}, median {statistics.median(lat):.2f} (goal <= 0.90)")
        print(f"TRANSPOSE: {sum(t > 0 for t in tr)} models with more than onnx2tf (goal 0)")
        print(f"size: max ratio {max(size):.3f} (goal <= 1.01)")


def record(rows, exporter, peer) -> None:
    """Append this run against one peer to bench/results/onnx_vs_onnx2tf.json; a side that failed is a cell."""
    from bench.render_pages import append_run

    table, cpu, lat = [], [], []
    for r in rows:
        o, p = r["ours"], r.get(peer, {"error": "not run"})
        if "error" in o:
            table.append({"model": r["model"], "note": f"ours: {o['error'].splitlines()[0]}"[:160]})
            continue
        row = {"model": r["model"], "cpu_s": [o.get("convert_cpu_s"), p.get("convert_cpu_s")],
               "wall_s": [o["convert_s"], p.get("convert_s")], "peak_mb": [o["peak_rss_mb"], p.get("peak_rss_mb")],
               "transposes": [o["transposes"], p.get("transposes")], "err": [o["rel_err"], p.get("rel_err")]}
        if "error" in p:
            row["note"] = f"onnx2tf: {p['error'].splitlines()[0]}"[:160]
        else:
            row.update(x_less_cpu=p["convert_cpu_s"] / o["convert_cpu_s"],
                       lat_ratio=p.get("cpu_ratio_fresh", o["latency_ms"] / p["latency_ms"]),
                       size_ratio=o["size"] / p["size"])
            cpu.append(row["x_less_cpu"])
            lat.append(row["lat_ratio"])
        table.append(row)
    columns = [{"key": "model", "label": "model"},
               {"key": "cpu_s", "label": "convert CPU s ours / onnx2tf", "fmt": ".2f"},
               {"key": "x_less_cpu", "label": "x less CPU", "fmt": ".2f"},
               {"key": "wall_s", "label": "wall s ours / onnx2tf", "fmt": ".2f"},
               {"key": "peak_mb", "label": "peak MB ours / onnx2tf", "fmt": ".0f"},
               {"key": "lat_ratio", "label": "latency ratio", "fmt": ".2f"},
               {"key": "size_ratio", "label": "size ratio", "fmt": ".3f"},
               {"key": "transposes", "label": "transposes ours / onnx2tf"},
               {"key": "err", "label": "rel err ours / onnx2tf", "fmt": ".1e"},
               {"key": "note", "label": "failed"}]
    runs = sum("note" not in row for row in table)
    headline = (f"conversion CPU ours / onnx2tf: max {max(cpu):.2f}x less, median {statistics.median(cpu):.2f}x; "
                f"latency ratio median {statistics.median(lat):.2f}; " if cpu else "") + \
        f"{len(table) - runs} of {len(table)} models fail on one side"
    set_name = "tf" if peer == "peer-tf" else ("dynamo" if exporter == "dynamo18" else "direct")
    append_run("onnx_vs_onnx2tf", columns, table, headline, set_name=set_name)


if __name__ == "__main__":
    main()
