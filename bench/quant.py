"""Quantization schemes side by side: size, LiteRT interpreter latency (1 thread) and accuracy vs the
float model, ours (edge + ai-edge-quantizer) and Google's litert-torch 0.10.0 where it offers the scheme.

    .venv/bin/python bench/quant.py [--models resnet18,mobilenet_v2,vit] [--runs 30] [--eval 200] [--no-peer]
                                    [--zoo-sizes]

The models are tests/zoo.py's WIDE variants, the ones tests/edge/test_quant.py checks (MobileNetV2 at
width 1.0, ViT at ViT-Ti's width: weights dominate the file as in the real models); --zoo-sizes takes
the zoo's own tiny builds instead.

Each implementation converts a model (float + every scheme) in a fresh subprocess (the peer in its own
venv, .bench-venv-peer; see bench/edge_vs_litert_torch.py); this process then measures every .tflite
with the same interpreter: file size, median latency of --runs invocations on one input (1 thread),
top-1 agreement with torch eager over --eval seeded random inputs (classifiers) and max rel err
(max |got - torch| / max |torch| over all of them). Static int8 calibrates on 32 other seeded inputs.

The peer's schemes: its ai-edge-quantizer recipes (litert_torch.generative.quantize.quant_recipes:
full_dynamic_recipe, full_weight_only_recipe (int8 / INT4), full_fp16_recipe) as quant_config, and for
static int8 its PT2E flow (PT2EQuantizer + torchao prepare_pt2e / convert_pt2e on the same calibration
inputs, then convert with QuantConfig(pt2e_quantizer=...)). A scheme it refuses shows its error.

Worker mode (internal): bench/quant.py --worker {ours|peer} MODEL OUT_DIR SCHEMES {wide|zoo}
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import statistics
import sys
import tempfile
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCHEMES = ["float", "dynamic_int8", "weight_only_int8", "weight_only_int4", "fp16", "static_int8"]
N_CAL = 32


def random_inputs(args, n, seed):
    """n seeded samples shaped like ``args``: float ~ N(0, 1); integer inputs (token ids, masks) drawn
    uniformly below the sample's max + 1."""
    import torch

    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        sample = []
        for a in args:
            if a.is_floating_point():
                sample.append(torch.randn(a.shape, generator=g))
            else:
                sample.append(torch.randint(0, int(a.max()) + 1, a.shape, generator=g, dtype=a.dtype))
        out.append(tuple(sample))
    return out


# ----------------------------------------------------------------------------- worker (one venv each)


def _convert_ours(module, args, scheme, cal):
    from tpu_export import litert_torch

    if scheme == "float":
        return litert_torch.convert(module, args)
    return litert_torch.convert(module, args, quant_config=scheme,
                                calibration_data=cal if scheme == "static_int8" else None)


def _convert_peer(module, args, scheme, cal):
    from tpu_export import litert_torch
    from tpu_export.litert_torch.generative.quantize import quant_attrs, quant_recipes

    if scheme == "float":
        return litert_torch.convert(module, args)
    recipes = {
        "dynamic_int8": quant_recipes.full_dynamic_recipe,
        "weight_only_int8": quant_recipes.full_weight_only_recipe,
        "weight_only_int4": lambda: quant_recipes.full_weight_only_recipe(weight_dtype=quant_attrs.Dtype.INT4),
        "fp16": quant_recipes.full_fp16_recipe,
    }
    if scheme in recipes:
        return litert_torch.convert(module, args, quant_config=recipes[scheme]())
    import torch
    from torchao.quantization.pt2e import quantize_pt2e

    from tpu_export.litert_torch.quantize import pt2e_quantizer
    from tpu_export.litert_torch.quantize.quant_config import QuantConfig

    quantizer = pt2e_quantizer.PT2EQuantizer().set_global(
        pt2e_quantizer.get_symmetric_quantization_config(is_per_channel=True))
    m = quantize_pt2e.prepare_pt2e(torch.export.export(module, args).module(), quantizer)
    with torch.no_grad():
        for sample in cal:
            m(*sample)
    m = quantize_pt2e.convert_pt2e(m, fold_quantize=False)
    return litert_torch.convert(m, args, quant_config=QuantConfig(pt2e_quantizer=quantizer))


def build_model(name, sizes):
    from tests.zoo import build, build_wide

    return build_wide(name) if sizes == "wide" else build(name)


def worker(impl, name, out_dir, schemes, sizes) -> None:
    import warnings

    warnings.simplefilter("ignore")
    module, args = build_model(name, sizes)
    cal = random_inputs(args, N_CAL, seed=2)
    convert = _convert_ours if impl == "ours" else _convert_peer
    result = {}
    for scheme in schemes.split(","):
        t0 = time.perf_counter()
        try:
            convert(module, args, scheme, cal).export(os.path.join(out_dir, f"{scheme}.tflite"))
            result[scheme] = {"convert_s": time.perf_counter() - t0}
        except Exception as e:  # noqa: BLE001 - reported in the table; the run goes on
            result[scheme] = {"error": traceback.format_exception_only(type(e), e)[-1].strip()[:300]}
    print(json.dumps(result))


# ----------------------------------------------------------------------------- measuring (project venv)


def convert_all(py, impl, name, out_dir, schemes, sizes) -> dict:
    from _worker_json import run_json

    made = run_json([py, os.path.abspath(__file__), "--worker", impl, name, out_dir, ",".join(schemes), sizes],
                    timeout=3600)
    # a worker that printed no result: its error stands for every scheme
    return {s: dict(made) for s in schemes} if set(made) == {"error"} else made


class Runner:
    """One signature runner, fed the model's positional args by input name (ours: forward's parameter
    names; the peer: args_0, args_1, ...), in each input's dtype (int8 inputs quantized)."""

    def __init__(self, path, params):
        from ai_edge_litert.interpreter import Interpreter

        self.interp = Interpreter(model_path=path, num_threads=1)
        self.runner = self.interp.get_signature_runner()
        self.inputs = self.runner.get_input_details()
        self.params = params

    def _position(self, n):
        return self.params.index(n) if n in self.params else int(n.rsplit("_", 1)[-1])

    def feed(self, sample) -> dict:
        import numpy as np

        out = {}
        for n, d in self.inputs.items():
            x = sample[self._position(n)].numpy()
            scale, zp = d.get("quantization", (0.0, 0))
            if np.dtype(d["dtype"]) == np.int8 and scale:
                x = np.clip(np.round(x / scale + zp), -128, 127)
            out[n] = x.astype(d["dtype"])
        return out

    def __call__(self, feed) -> list:
        import numpy as np

        out = self.runner(**feed)
        details = self.runner.get_output_details()
        keys = sorted(out, key=lambda k: int(k.rsplit("_", 1)[-1]) if k.rsplit("_", 1)[-1].isdigit() else 0)
        res = []
        for k in keys:
            y = np.asarray(out[k])
            scale, zp = details[k].get("quantization", (0.0, 0))
            res.append((y.astype(np.float32) - zp) * scale if y.dtype == np.int8 and scale else y)
        return res


def measure(path, params, evals, refs, runs) -> dict:
    import numpy as np

    r = Runner(path, params)
    feed = r.feed(evals[0])
    for _ in range(3):
        r(feed)
    ts = []
    for _ in range(runs):
        t = time.perf_counter()
        r(feed)
        ts.append((time.perf_counter() - t) * 1e3)
    agree, n_cls, worst, scale = 0, 0, 0.0, 0.0
    for sample, ref in zip(evals, refs):
        got = r(r.feed(sample))
        if len(got) != len(ref):
            return {"error": f"{len(got)} outputs, torch gives {len(ref)}"}
        for g, w in zip(got, ref):
            worst = max(worst, float(np.abs(g.astype(np.float64) - w).max()))
            scale = max(scale, float(np.abs(w).max()))
        g0, w0 = got[0], ref[0]
        if w0.ndim == 2 and w0.shape[1] > 1:  # a classifier's logits
            agree += int((g0.argmax(1) == w0.argmax(1)).sum())
            n_cls += w0.shape[0]
    return {"size": os.path.getsize(path), "latency_ms": statistics.median(ts),
            "top1": agree / n_cls if n_cls else None, "rel_err": worst / max(scale, 1e-6)}


def bench_model(name, impls, runs, n_eval, sizes) -> dict:
    import torch
    import torch.utils._pytree as pytree

    module, args = build_model(name, sizes)
    params = list(inspect.signature(module.forward).parameters)
    evals = random_inputs(args, n_eval, seed=1)
    with torch.no_grad():
        refs = [[t.numpy() for t in pytree.tree_leaves(module(*x))] for x in evals]
    row = {}
    for impl, py in impls.items():
        with tempfile.TemporaryDirectory() as tmp:
            made = convert_all(py, impl, name, tmp, SCHEMES, sizes)
            for scheme in SCHEMES:
                info = dict(made.get(scheme, {"error": "not run"}))
                if "error" not in info:
                    try:
                        info.update(measure(os.path.join(tmp, f"{scheme}.tflite"), params, evals, refs, runs))
                    except Exception as e:  # noqa: BLE001
                        info["error"] = f"run: {type(e).__name__}: {e}"[:200]
                row.setdefault(scheme, {})[impl] = info
    return row


def _cell(info, key, fmt):
    if info is None:
        return "-"
    if "error" in info:
        return "n/a"
    v = info.get(key)
    return "-" if v is None else format(v, fmt)


def report(results: dict, impls) -> str:
    cols = ["size KB", "x float", "lat ms", "top-1", "rel err"]
    head = "| model | scheme | " + " | ".join(f"{c} {i}" for c in cols for i in impls) + " |"
    lines = [head, "|" + "---|" * (2 + len(cols) * len(impls))]
    errors = []
    for name, row in results.items():
        floats = {i: row["float"].get(i, {}).get("size") for i in impls}
        for scheme in SCHEMES:
            cells = []
            for key, fmt in [("size", ".1f"), ("ratio", ".3f"), ("latency_ms", ".3f"), ("top1", ".3f"),
                             ("rel_err", ".2e")]:
                for i in impls:
                    info = dict(row[scheme].get(i) or {})
                    if "size" in info:
                        info["ratio"] = info["size"] / floats[i] if floats[i] else None
                        info["size"] = info["size"] / 1024
                    cells.append(_cell(info, key, fmt))
                    if key == "size" and "error" in info:
                        errors.append(f"{name} {scheme} {i}: {info['error']}")
            lines.append(f"| {name} | {scheme} | " + " | ".join(cells) + " |")
    text = "\n".join(lines)
    if errors:
        text += "\n\nnot made:\n" + "\n".join(f"- {e}" for e in errors)
    return text


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        impl = sys.argv[2]
        # the peer venv's litert_torch must win over this repo's package of the same name: append
        (sys.path.append if impl == "peer" else (lambda p: sys.path.insert(0, p)))(ROOT)
        return worker(*sys.argv[2:7])
    sys.path.insert(0, ROOT)
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="resnet18,mobilenet_v2,vit")
    ap.add_argument("--runs", type=int, default=30, help="latency: median of this many invocations (>= 20)")
    ap.add_argument("--eval", type=int, default=200, help="seeded random inputs for the accuracy figures")
    ap.add_argument("--no-peer", action="store_true")
    ap.add_argument("--zoo-sizes", action="store_true", help="the zoo's tiny builds instead of the WIDE variants")
    ap.add_argument("--json", help="also write the raw figures here")
    a = ap.parse_args()
    impls = {"ours": sys.executable}
    if not a.no_peer:
        from bench.edge_vs_litert_torch import ensure_peer

        impls["peer"] = ensure_peer()
    results = {}
    for name in a.models.split(","):
        results[name] = bench_model(name, impls, a.runs, a.eval, "zoo" if a.zoo_sizes else "wide")
        print(json.dumps({name: results[name]}), file=sys.stderr, flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)
    print(report(results, list(impls)))
    record(results, list(impls))


def record(results: dict, impls) -> None:
    """Append this run to bench/results/quant.json: the figures of report()'s table, a scheme a side did not make
    as n/a with its error in the notes."""
    from bench.render_pages import append_run

    figures = [("size", "size KB", ".1f"), ("ratio", "x float", ".3f"), ("latency_ms", "lat ms", ".3f"),
               ("top1", "top-1", ".3f"), ("rel_err", "rel err", ".2e")]
    columns = [{"key": "model", "label": "model"}, {"key": "scheme", "label": "scheme"}]
    columns += [{"key": f"{key}_{i}", "label": f"{label} {i}", "fmt": fmt}
                for key, label, fmt in figures for i in impls]
    table, errors, sizes = [], [], []
    for name, row in results.items():
        floats = {i: row["float"].get(i, {}).get("size") for i in impls}
        for scheme in SCHEMES:
            out = {"model": name, "scheme": scheme}
            for i in impls:
                info = row[scheme].get(i) or {}
                if "error" in info:
                    errors.append(f"{name} {scheme} {i}: {info['error']}")
                for key, _, _ in figures:
                    if key == "size":
                        v = info["size"] / 1024 if "size" in info else None
                    elif key == "ratio":
                        v = info["size"] / floats[i] if "size" in info and floats[i] else None
                    else:
                        v = info.get(key)
                    out[f"{key}_{i}"] = "n/a" if "error" in info else v
            if scheme != "float" and isinstance(out.get("ratio_ours"), float):
                sizes.append((scheme, out["ratio_ours"]))
            table.append(out)
    int8 = [r for s, r in sizes if "int8" in s]
    fp16 = [r for s, r in sizes if s == "fp16"]
    headline = "; ".join(f"{what} files {min(v):.3f}-{max(v):.3f}x of the float file (ours)"
                         for what, v in (("int8", int8), ("fp16", fp16)) if v) or "no quantized file made"
    append_run("quant", columns, table, headline, notes=[f"not made: {e}" for e in errors] or None)


if __name__ == "__main__":
    main()
