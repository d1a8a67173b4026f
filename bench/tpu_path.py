"""TPU path per model at real size: export time, AOT compile time per TPU generation, libtpu's own
floor for the same function, artifact size, XLA:CPU latency of the artifact vs torch eager on the
same threads, and the TPU cost report (XLA's step time and our roofline).

    .venv/bin/python bench/tpu_path.py [--models resnet18,vit_b_16] [--generations tpu-v6e] [--runs 20]
                                       [--floor] [--bf16] [--parallel] [--zoo]

Models: bench/real_models.py (torchvision's classification models at published widths, 224x224,
batch 1, float32, random weights; bert_base at 128 tokens); ``--zoo`` takes the tests' tiny zoo.

Compile columns, per generation, one chip: ``ours`` is ``bundle.compile_for`` on the exported artifact
(platforms tpu+cpu, float32 at Precision.HIGHEST: fp32 parity on TPU); ``--floor`` adds libtpu alone:
the same lowered JAX function jitted and AOT-compiled for the same device, no jax.export and no CPU
branch; ``--bf16`` adds the compile of a dtype="bfloat16" export (one MXU pass per matmul/conv instead
of six). ``--parallel`` compiles the generations in threads (tpu_backend.compile_many).

XLA:CPU vs eager is measured side by side in this one process (median of --runs each, in alternating
blocks of 5), torch limited to --threads and XLA's CPU client to the same count.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

DEFAULT_MODELS = ["resnet18", "resnet50", "mobilenet_v2", "efficientnet_b0", "convnext_tiny", "densenet121",
                  "vit_b_16", "regnet_y_400mf", "swin_t", "bert_base"]
ZOO_MODELS = ["resnet18", "mobilenet_v2", "efficientnet", "convnext", "vit", "swin", "bert", "llama", "t5"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default=None)
    ap.add_argument("--zoo", action="store_true", help="the tests' tiny zoo instead of the real sizes")
    ap.add_argument("--generations", default="tpu-v5e,tpu-v6e,tpu-v7x")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--floor", action="store_true", help="also compile the lowered function with libtpu directly")
    ap.add_argument("--bf16", action="store_true", help="also compile a dtype='bfloat16' export")
    ap.add_argument("--parallel", action="store_true", help="compile the generations in threads")
    ap.add_argument("--no-cpu", action="store_true", help="skip the XLA:CPU vs eager timing")
    a = ap.parse_args()
    if a.threads == 1:
        # one thread on both sides: on a shared 2-core host, OpenMP/Eigen pools that spin-wait
        # oversubscribe the cores and turn medians into scheduler noise
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                                   " --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1").strip()
    import warnings

    warnings.simplefilter("ignore")
    import torch

    torch.set_num_threads(a.threads)
    gens = [g for g in a.generations.split(",") if g]
    models = (a.models or ",".join(ZOO_MODELS if a.zoo else DEFAULT_MODELS)).split(",")
    warm_up(gens)
    rows = []
    for name in models:
        r = measure(name, a, gens)
        print_row(r, gens)
        rows.append(r)
    record(rows, gens, "zoo" if a.zoo else "real")


def record(rows, gens, set_name) -> None:
    """Append this run to bench/results/tpu_path.json (print_row's figures, one column per generation)."""
    import statistics as st

    from bench.render_pages import append_run

    columns = [{"key": "model", "label": "model"}]
    table = []
    for g in gens:
        columns += [{"key": f"{g}_compile_s", "label": f"{g} compile s", "fmt": ".1f"},
                    {"key": f"{g}_opt_us", "label": f"{g} XLA step us", "fmt": ".1f"},
                    {"key": f"{g}_roofline_us", "label": f"{g} roofline us", "fmt": ".1f"}]
    columns += [{"key": "xla_ms", "label": "XLA:CPU ms", "fmt": ".1f"}, {"key": "eager_ms", "label": "eager ms",
                                                                        "fmt": ".1f"},
                {"key": "ratio", "label": "ratio", "fmt": ".2f", "suffix": "x"},
                {"key": "rel_err", "label": "rel err", "fmt": ".1e"},
                {"key": "size_mib", "label": "artifact MiB", "fmt": ".1f"}]
    for r in rows:
        row = {"model": r["model"]}
        for g in gens:
            s = r["ours"][g]
            opt = s["cost"]["optimal_seconds"]["value"]
            roof = s["roofline"]["least_bytes"].get("seconds")
            row.update({f"{g}_compile_s": s["compile_seconds"], f"{g}_opt_us": "unknown" if opt is None else opt * 1e6,
                        f"{g}_roofline_us": roof * 1e6 if isinstance(roof, float) else "unknown"})
        if "xla_ms" in r:
            row.update(xla_ms=r["xla_ms"], eager_ms=r["eager_ms"], ratio=r["xla_ms"] / r["eager_ms"],
                       rel_err=r["rel_err"], size_mib=r["size"] / 2**20)
        table.append(row)
    ratios = [row["ratio"] for row in table if "ratio" in row]
    headline = (f"XLA:CPU / eager median {st.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f}x)" if ratios
                else "compile only (--no-cpu)")
    append_run("tpu_path", columns, table, headline, set_name=set_name)


def warm_up(gens):
    """libtpu's one-off start (topology description, compiler set-up) before anything is timed."""
    from tpu_export.tpu_backend.host import prepare_cpu_host

    prepare_cpu_host()
    import jax
    import jax.numpy as jnp

    from tpu_export.tpu_backend.aot import topology_devices
    from tpu_export.tpu_backend.chips import parse_topology

    for g in gens:
        dev = topology_devices(parse_topology(g))[0]
        x = jax.ShapeDtypeStruct((8, 128), jnp.float32, sharding=jax.sharding.SingleDeviceSharding(dev))
        jax.jit(jnp.sin).lower(x).compile()


def _build(name, zoo):
    if zoo:
        from tests.zoo import build

        return build(name)
    from bench.real_models import build_real

    return build_real(name)


def measure(name, a, gens) -> dict:
    import torch

    from tpu_export import converter, tpu_backend

    module, args = _build(name, a.zoo)
    r = {"model": name}
    t0 = time.perf_counter()
    prog = converter.prepare(module, args)
    r["capture_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    bundle = tpu_backend.export_program(prog)
    r["export_s"] = time.perf_counter() - t0
    r["stablehlo_bytes"] = len(bundle.signatures["serving_default"].serialize())
    t0 = time.perf_counter()
    if a.parallel:
        done = tpu_backend.compile_many(bundle, [(g, None) for g in gens], cache_dir=False)
    else:
        done = [bundle.compile_for(g, None, cache_dir=False) for g in gens]
    r["compile_wall_s"] = time.perf_counter() - t0
    r["ours"] = {c.target: c.report["signatures"]["serving_default"] for c in done}
    if a.floor:
        r["floor"] = {g: libtpu_floor(prog, g) for g in gens}
    if a.bf16:
        b16 = tpu_backend.export_program(prog, dtype="bfloat16", platforms=("tpu",))
        r["bf16"] = {g: b16.compile_for(g, None, cache_dir=False).report["signatures"]["serving_default"]
                     ["compile_seconds"] for g in gens}
    if not a.no_cpu:
        r.update(cpu_vs_eager(bundle, module, args, a.runs))
    print(f"{name}: {r}", file=sys.stderr, flush=True)
    del torch
    return r


def libtpu_floor(prog, target) -> float:
    """Seconds libtpu takes to compile the same lowered JAX function for one chip of ``target``, with
    no jax.export round trip and no CPU branch (lowered for tpu alone)."""
    import jax

    from tpu_export.tpu_backend.aot import topology_devices
    from tpu_export.tpu_backend.chips import parse_topology
    from tpu_export.tpu_backend.lowering import lower_signature

    lo = lower_signature(prog, platforms=("tpu",))
    dev = topology_devices(parse_topology(target))[0]
    place = jax.sharding.SingleDeviceSharding(dev)
    sig = prog.signature()
    w = [jax.ShapeDtypeStruct(tuple(prog.weights[n].shape), _np_dtype(prog.weights[n].dtype), sharding=place)
         for n in lo.weight_names]
    xs = [jax.ShapeDtypeStruct(tuple(s.shape), _np_dtype(s.dtype), sharding=place) for s in sig.inputs]
    lowered = jax.jit(lambda ws, *x: lo.fn(list(ws), *x)).lower(w, *xs)
    t0 = time.perf_counter()
    lowered.compile()
    return time.perf_counter() - t0


def _np_dtype(torch_dtype):
    from tpu_export.tpu_backend.artifact.dtypes import name_to_numpy, torch_to_name

    return name_to_numpy(torch_to_name(torch_dtype))


def cpu_vs_eager(bundle, module, args, runs) -> dict:
    import torch

    from tpu_export import tpu_backend

    with tempfile.TemporaryDirectory() as tmp:
        path = tpu_backend.save(bundle, os.path.join(tmp, "m.tpuexp"))
        size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)
        runner = tpu_backend.load(path)
        np_args = [x.numpy() for x in args]
        for _ in range(3):
            out = runner(*np_args)
            with torch.no_grad():
                want = module(*args)
        from tests.numerics import rel_err

        leaves = torch.utils._pytree.tree_leaves
        err = max(rel_err(o, w) for o, w in zip(leaves(out), leaves(want)) if hasattr(w, "shape"))
        t_x, t_e = [], []
        # Alternating blocks (not single calls): XLA's CPU thread pool spins for a while after
        # each run and would starve torch's threads if the two were interleaved call by call.
        for _block in range(max(1, runs // 5)):
            time.sleep(0.05)
            for _ in range(5):
                t = time.perf_counter()
                out = runner(*np_args)
                _ = [o.numpy() for o in leaves(out) if hasattr(o, "numpy")]
                t_x.append(time.perf_counter() - t)
            time.sleep(0.05)
            for _ in range(5):
                t = time.perf_counter()
                with torch.no_grad():
                    module(*args)
                t_e.append(time.perf_counter() - t)
    return dict(size=size, rel_err=err, xla_ms=statistics.median(t_x) * 1e3, eager_ms=statistics.median(t_e) * 1e3)


def _opt_us(sig):
    v = sig["cost"]["optimal_seconds"]["value"]
    return "unknown" if v is None else f"{v * 1e6:.1f}"


def print_row(r, gens):
    ratio = r["xla_ms"] / r["eager_ms"] if "xla_ms" in r else None
    cells = []
    for g in gens:
        s = r["ours"][g]
        roof = s["roofline"]["least_bytes"].get("seconds")
        roof = f"{roof * 1e6:.1f}" if isinstance(roof, float) else "unknown"
        extra = "".join(f" / {k} {r[k][g]:.1f}" for k in ("floor", "bf16") if k in r)
        cells.append(f"{g}: {s['compile_seconds']:.1f}s{extra}; XLA {_opt_us(s)} us, roofline {roof} us")
    cpu = (f"xla {r['xla_ms']:.1f} ms eager {r['eager_ms']:.1f} ms ratio {ratio:.2f}x err {r['rel_err']:.1e} "
           f"size {r['size'] / 2**20:.1f} MiB" if ratio else "")
    print(f"| {r['model']} | capture {r['capture_s']:.1f}s export {r['export_s']:.1f}s "
          f"stablehlo {r['stablehlo_bytes'] / 2**10:.0f} KiB | compile wall {r['compile_wall_s']:.1f}s | "
          + " | ".join(cells) + f" | {cpu} |", flush=True)


if __name__ == "__main__":
    main()
