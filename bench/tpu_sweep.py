"""Every model through the TPU path: torch.export -> our TPU export -> AOT compile for one TPU generation
(default tpu-v6e, one chip) -> save, load -> run on PJRT CPU vs torch eager. One model per fresh process,
with a timeout; one JSON line per model (appended to --out) and a markdown table at the end.

    .venv/bin/python bench/tpu_sweep.py [--models a,b] [--set held-out|families|all] [--timeout 1800]
                                        [--out out/tpu_sweep.jsonl] [--table-only]

What is compiled in which dtype (each model, same process):
- ``f32`` bundle: ``export_program(prog)`` (platforms tpu+cpu, float32, convs/matmuls at Precision.HIGHEST
  on TPU). It is saved, loaded and run on PJRT CPU (its CPU branch, one thread) against torch eager in
  float32: the rel err and the XLA:CPU / eager ms are of this float32 artifact. It is AOT-compiled for the
  TPU (``f32 s``) only for the held-out set (HELD_OUT) or with --f32.
- ``bf16`` bundle: ``export_program(prog, dtype="bfloat16", platforms=("tpu",))``, AOT-compiled for the
  TPU (``bf16 s``) for every model: libtpu compiles it 3-10x faster than the float32 program (one MXU pass
  per matmul instead of six), which keeps the whole sweep inside an hour on a 2-core host.
- ``direct s`` (held-out models whose f32 compile took over --floor-over seconds): libtpu alone, the same
  lowered JAX function jitted and AOT-compiled for the same chip without jax.export and without the CPU
  branch (bench/tpu_path.py libtpu_floor), right after ours in the same process.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

HELD_OUT = ["resnet18", "resnet50", "mobilenet_v2", "efficientnet_b0", "convnext_tiny", "densenet121", "vit_b_16",
            "regnet_y_400mf", "swin_t"]


def _families():
    from bench.real_families import HF, SEGMENTATION, TORCHVISION

    return list(TORCHVISION) + SEGMENTATION + HF


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default=None)
    ap.add_argument("--set", default="all", choices=["held-out", "families", "all"])
    ap.add_argument("--target", default="tpu-v6e")
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--f32", action="store_true", help="also compile the float32 artifact for every model")
    ap.add_argument("--floor-over", type=float, default=60.0)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--out", default=os.path.join(ROOT, "out", "tpu_sweep.jsonl"))
    ap.add_argument("--table-only", action="store_true")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        return worker(a)
    if not a.table_only:
        names = a.models.split(",") if a.models else (
            {"held-out": HELD_OUT, "families": _families(), "all": _families() + HELD_OUT}[a.set])
        os.makedirs(os.path.dirname(a.out), exist_ok=True)
        for name in names:
            r = run_one(name, a)
            with open(a.out, "a") as f:
                f.write(json.dumps(r) + "\n")
            print(json.dumps(r), file=sys.stderr, flush=True)
    print_table(a.out)
    if not a.table_only:
        record(a.out)


def record(path) -> None:
    """Append the table print_table shows (the latest run of each model in the JSONL) to
    bench/results/tpu_sweep.json."""
    from bench.render_pages import append_run

    latest = {}
    with open(path) as f:
        for line in f:
            if line.strip():
                r = json.loads(line)
                latest[r["model"]] = r
    keys = [("model", "model", None, ""), ("params_m", "params M", ".2f", ""), ("export", "export", None, ""),
            ("bf16_compile_s", "v6e compile s (bf16)", ".1f", ""), ("f32_compile_s", "f32 s", ".1f", ""),
            ("direct_f32_compile_s", "libtpu direct f32 s", ".1f", ""), ("xla_ms", "XLA:CPU ms", ".1f", ""),
            ("eager_ms", "eager ms", ".1f", ""), ("ratio", "ratio", ".2f", "x"), ("rel_err", "rel err", ".2e", ""),
            ("failure", "failure", None, "")]
    columns = [{"key": k, "label": label, **({"fmt": fmt} if fmt else {}), **({"suffix": sfx} if sfx else {})}
               for k, label, fmt, sfx in keys]
    rows = [{**{k: r.get(k) for k, *_ in keys}, "export": "ok" if r.get("export_ok") else "FAIL"}
            for r in latest.values()]
    ratios = sorted(r["ratio"] for r in rows if isinstance(r["ratio"], (int, float)))
    ran = len(ratios)
    headline = f"{ran} of {len(rows)} models export, compile and run" + (
        f"; XLA:CPU / eager median {statistics.median(ratios):.2f}x" if ratios else "")
    append_run("tpu_sweep", columns, rows, headline)


def run_one(name, a) -> dict:
    argv = [sys.executable, os.path.abspath(__file__), "--one", name, "--target", a.target, "--runs", str(a.runs),
            "--floor-over", str(a.floor_over)] + (["--f32"] if a.f32 else [])
    env = dict(os.environ, PYTHONWARNINGS="ignore", TF_CPP_MIN_LOG_LEVEL="3")
    t0 = time.perf_counter()
    try:
        p = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=a.timeout, cwd=ROOT)
        out, err, rc = p.stdout, p.stderr, p.returncode
    except subprocess.TimeoutExpired as e:
        out, err, rc = _text(e.stdout), _text(e.stderr), "timeout"
    r = {"model": name}
    for line in reversed(out.strip().splitlines()):
        if line.startswith("{"):
            r = json.loads(line)
            break
    r["wall_s"] = round(time.perf_counter() - t0, 1)
    r["date"] = time.strftime("%Y-%m-%d")
    if rc == "timeout":
        r["failure"] = f"timeout after {a.timeout:.0f} s in stage {r.get('stage', 'start')}"
    elif rc != 0 and "failure" not in r:
        r["failure"] = f"exit {rc}: " + ((err.strip().splitlines() or ["?"])[-1][:300])
    return r


def _text(b):
    return b.decode(errors="replace") if isinstance(b, bytes) else (b or "")


def worker(a):
    # one thread on both sides for the CPU timing (see bench/tpu_path.py)
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               " --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1").strip()
    import warnings

    warnings.simplefilter("ignore")
    import torch

    torch.set_num_threads(1)
    r = {"model": a.one, "target": a.target}

    def stage(name, fn):
        r["stage"] = name
        print(json.dumps(r), flush=True)  # the last line printed is what a timeout leaves
        t0 = time.perf_counter()
        try:
            out = fn()
        except Exception as e:  # noqa: BLE001 - recorded as the model's failure at this stage
            msg = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"[:400]
            r.setdefault("failure", f"{name}: {msg}")
            print(traceback.format_exc(), file=sys.stderr, flush=True)
            return None
        r[f"{name}_s"] = round(time.perf_counter() - t0, 2)
        return out

    from tpu_export import converter, tpu_backend

    built = stage("build", lambda: _build(a.one))
    if built is None:
        return _emit(r)
    module, args = built
    r["params_m"] = round(sum(p.numel() for p in module.parameters()) / 1e6, 2)
    prog = stage("torch_export", lambda: converter.prepare(module, args))
    r["export_ok"] = prog is not None
    if prog is None:
        return _emit(r)
    f32 = stage("tpu_export", lambda: tpu_backend.export_program(prog))
    if f32 is not None:
        r["stablehlo_kib"] = round(len(f32.signatures["serving_default"].serialize()) / 1024, 1)
        cpu = stage("cpu_run", lambda: cpu_vs_eager(f32, module, args, a.runs))
        if cpu:
            r.update(cpu)
    b16 = stage("tpu_export_bf16", lambda: tpu_backend.export_program(prog, dtype="bfloat16", platforms=("tpu",)))
    if b16 is not None:
        c = stage("compile_bf16", lambda: b16.compile_for(a.target, None, cache_dir=False))
        if c is not None:
            r["bf16_compile_s"] = round(c.report["signatures"]["serving_default"]["compile_seconds"], 1)
        del b16, c
    if f32 is not None and (a.f32 or a.one in HELD_OUT):
        c = stage("compile_f32", lambda: f32.compile_for(a.target, None, cache_dir=False))
        if c is not None:
            r["f32_compile_s"] = round(c.report["signatures"]["serving_default"]["compile_seconds"], 1)
            if r["f32_compile_s"] > a.floor_over:
                from bench.tpu_path import libtpu_floor

                d = stage("direct_f32", lambda: libtpu_floor(prog, a.target))
                if d is not None:
                    r["direct_f32_compile_s"] = round(d, 1)
    r["stage"] = "done"
    return _emit(r)


def _emit(r):
    print(json.dumps(r), flush=True)
    return 0


def _build(name):
    if name in HELD_OUT:
        from bench.real_models import build_real

        return build_real(name)
    from bench.real_families import build_family

    return build_family(name)


def cpu_vs_eager(bundle, module, args, runs) -> dict:
    """The float32 artifact saved, loaded (its CPU branch on PJRT CPU) and run against torch eager: rel err
    and medians in alternating blocks of 5 (XLA's pool spins after each run; see bench/tpu_path.py)."""
    import torch

    from tests.numerics import rel_err
    from tpu_export import tpu_backend

    leaves = torch.utils._pytree.tree_leaves
    with tempfile.TemporaryDirectory() as tmp:
        path = tpu_backend.save(bundle, os.path.join(tmp, "m.tpuexp"))
        runner = tpu_backend.load(path)
        np_args = [x.numpy() for x in args]
        out = runner(*np_args)
        with torch.no_grad():
            want = module(*args)
        err = max(rel_err(o, w) for o, w in zip(leaves(out), leaves(want)) if hasattr(w, "shape"))
        t_x, t_e = [], []
        for _block in range(max(1, runs // 5)):
            for _ in range(5):
                t = time.perf_counter()
                out = runner(*np_args)
                _ = [o.numpy() for o in leaves(out) if hasattr(o, "numpy")]
                t_x.append(time.perf_counter() - t)
            for _ in range(5):
                t = time.perf_counter()
                with torch.no_grad():
                    module(*args)
                t_e.append(time.perf_counter() - t)
    x, e = statistics.median(t_x) * 1e3, statistics.median(t_e) * 1e3
    return dict(rel_err=float(f"{err:.2e}"), xla_ms=round(x, 1), eager_ms=round(e, 1), ratio=round(x / e, 2))


def print_table(path):
    rows = {}
    for line in open(path):
        if line.strip():
            r = json.loads(line)
            rows[r["model"]] = r  # the latest run of each model
    print("| model | params M | export | v6e compile s (bf16) | f32 s | libtpu direct f32 s | XLA:CPU ms | eager ms "
          "| ratio | rel err | failure |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")

    def g(r, k, fmt="{}"):
        return fmt.format(r[k]) if r.get(k) is not None else ""

    for r in rows.values():
        print(f"| {r['model']} | {g(r, 'params_m')} | {'ok' if r.get('export_ok') else 'FAIL'} "
              f"| {g(r, 'bf16_compile_s')} | {g(r, 'f32_compile_s')} | {g(r, 'direct_f32_compile_s')} "
              f"| {g(r, 'xla_ms')} | {g(r, 'eager_ms')} | {g(r, 'ratio', '{}x')} | {g(r, 'rel_err')} "
              f"| {r.get('failure', '')} |")


if __name__ == "__main__":
    sys.exit(main())
