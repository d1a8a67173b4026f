"""Large models: conversion wall time and peak RSS, ours vs litert-torch 0.10.

    .venv/bin/python bench/large.py [--models llama0.5b,llama1.1b] [--modes stream,delete,loader,peer,memory]

Each model is a Llama-style transformers LlamaForCausalLM, random init (seeded), float32, saved once
as a model directory (safetensors) under --work (default: $TMPDIR/tpu-export-bench-large). Each
conversion runs in a fresh process that
loads the model and converts `ids [1, 16] -> logits`; peak RSS is the peak of that process's tree
(everything: torch, the loaded model, the conversion, and any child it starts, such as the TPU compile
worker): its VmRSS summed with its descendants', polled every 0.1 s, or its own VmHWM if higher (the
worker's own VmHWM is also in the row, worker_peak_rss_gb). "x weights" is peak RSS / weight bytes.

Modes (ours unless named):
  memory   convert() with no path: the classic bytes in memory (the older in-memory path)
  stream   the module loaded in memory, output_file_path=... (weights streamed into the file)
  delete   stream + delete_in_memory_params=True (parameters freed as they are written)
  loader   the module built on the meta device, weights_loader=safetensors_loader(model dir):
           weights read one tensor at a time, never all in memory (the "model directory" path)
  loader_int8  loader + quant_config="dynamic_int8": FULLY_CONNECTED weights and the embedding table int8 as
           they are written
  loader_int4  loader + quant_config="dynamic_int4_block32": the same weights int4 in blocks of 32
  phases   stream's steps timed one by one (capture, lowering, write), printed in the row
  tpu      the module loaded in memory, tpu_export.convert(..., targets=["tpu-v6e"]): the TPU artifact (export,
           weights streamed into weights.safetensors, libtpu AOT compile for one v6e chip); size = the folder's.
           The compile runs in a child process (tpu_backend/compile_worker.py; the default for these sizes)
  tpu_dir  tpu from the model directory loaded lazily (convert-lm's load: parameters are private maps of the
           shards, paged in as read; the fingerprint and the weights.safetensors write give each weight's pages back,
           converter/page_release.py); a bf16 directory stays bf16
  tpu_in_process  tpu with aot_in_process=True: libtpu's compile in the converting process
  tpu_child  tpu with aot_in_process=False: the compile in a child whatever the size (--models tiny: its cost)
  peer     litert-torch 0.10.0 convert(..., lightweight_conversion=True) then export(path), in its
           own venv (.bench-venv-peer, installed by bench/edge_vs_litert_torch.py)
Models: llama0.5b, llama1.1b (float32), llama3b (bfloat16 directory; run it with --modes loader_int8,loader_int4,
tpu,tpu_dir: the tpu modes keep its bf16);
vit_b_16 (the held-out zoo model) with --modes vit_memory,vit_stream,vit_peer
(convert() + export(), output_file_path, the peer's convert() + export()).
Targets: peak RSS <= 1.5x weight bytes (stream/delete), <= 0.5x (loader); time <= 0.5x the peer's.
Runs one conversion at a time; check `free -g` first (the 1.1B peer run needs ~3x its 4.4 GB).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PEER_PY = os.path.join(ROOT, ".bench-venv-peer", "bin", "python")

CONFIGS = {
    # ~0.49 B: a 492 M Llama-style decoder
    "llama0.5b": dict(vocab_size=32000, hidden_size=1024, intermediate_size=4096, num_hidden_layers=25,
                      num_attention_heads=16, num_key_value_heads=16),
    # ~1.1 B: TinyLlama's shape
    "llama1.1b": dict(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
                      num_attention_heads=32, num_key_value_heads=4),
    # ~3.0 B in bfloat16 (Llama 3.2 3B's widths, a 32000 vocabulary): converted from its directory to int8
    "llama3b": dict(vocab_size=32000, hidden_size=3072, intermediate_size=8192, num_hidden_layers=28,
                    num_attention_heads=24, num_key_value_heads=8, dtype="bfloat16"),
    # ~66 M (264 MB float32): where a child compile starts to pay (tpu_backend.aot.CHILD_MIN_WEIGHT_BYTES)
    "llama66m": dict(vocab_size=32000, hidden_size=512, intermediate_size=2048, num_hidden_layers=8,
                     num_attention_heads=8, num_key_value_heads=8),
    # ~107 M (426 MB float32)
    "llama107m": dict(vocab_size=32000, hidden_size=640, intermediate_size=2560, num_hidden_layers=10,
                      num_attention_heads=10, num_key_value_heads=10),
    "tiny": dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2),
}


def _config(name):
    import transformers

    kw = dict(CONFIGS[name])
    dtype = kw.pop("dtype", "float32")
    return transformers.LlamaConfig(**kw, tie_word_embeddings=False, max_position_embeddings=256, torch_dtype=dtype)


def ensure_model(name: str, work: str) -> str:
    folder = os.path.join(work, name)
    if os.path.isfile(os.path.join(folder, "config.json")):
        return folder
    import torch
    import transformers

    torch.manual_seed(0)
    cfg = _config(name)
    dtype = getattr(torch, CONFIGS[name].get("dtype", "float32"))
    torch.set_default_dtype(dtype)  # built in its dtype: a 3 B model is never materialized in float32 here
    try:
        model = transformers.LlamaForCausalLM(cfg).eval()
    finally:
        torch.set_default_dtype(torch.float32)
    model.save_pretrained(folder, safe_serialization=True)
    return folder


def _wrapper(torch):
    class LogitsOf(torch.nn.Module):
        def __init__(self, module):
            super().__init__()
            self.module = module  # parameter names "module.<checkpoint key>": the loader strips "module."

        def forward(self, ids):
            return self.module(input_ids=ids, use_cache=False).logits

    return LogitsOf


def vit_worker(mode: str, out: str) -> None:
    """vit_b_16 at its published size (86.6 M parameters, 224x224), random init: ours (convert() then
    export, or output_file_path) or the peer's (convert() then export), peak RSS of the process."""
    t_start = time.perf_counter()
    import torch

    from tests.zoo import ViT

    torch.manual_seed(0)
    module, x = ViT(224, 16, 768, 12, 12, 3072, 1000).eval(), torch.randn(1, 3, 224, 224)
    t0 = time.perf_counter()
    from tpu_export import litert_torch

    if mode == "vit_stream":
        litert_torch.convert(module, (x,), output_file_path=out)
    else:  # vit_memory (ours) and vit_peer: a user's plain convert() + export()
        litert_torch.convert(module, (x,)).export(out)
    print(json.dumps({"mode": mode, "convert_s": round(time.perf_counter() - t0, 1),
                      "process_s": round(time.perf_counter() - t_start, 1),
                      "peak_rss_gb": round(_peak_rss() / 2**30, 3),
                      "size_gb": round(os.path.getsize(out) / 2**30, 3)}))


def worker(mode: str, folder: str, out: str) -> None:
    if mode.startswith("vit_"):
        return vit_worker(mode, out)
    t_start = time.perf_counter()
    import torch
    import transformers

    ids = torch.randint(0, 500, (1, 16), generator=torch.Generator().manual_seed(1))
    wrap = _wrapper(torch)
    kwargs = {}
    if mode in ("loader", "loader_int8", "loader_int4"):
        # built in float32 on the meta device: the loader casts each (bf16) tensor as it reads it
        cfg = transformers.AutoConfig.from_pretrained(folder)
        with torch.device("meta"):
            hf = transformers.LlamaForCausalLM(cfg).eval()
        # non-persistent buffers are not in the checkpoint: the rotary table is rebuilt on the CPU
        hf.model.rotary_emb = type(hf.model.rotary_emb)(cfg)
        from tpu_export.converter.safetensors_weights import safetensors_loader

        kwargs["weights_loader"] = safetensors_loader(folder)
        if mode in ("loader_int8", "loader_int4"):  # quantized while streaming (FULLY_CONNECTED weights, the table)
            kwargs["quant_config"] = "dynamic_int8" if mode == "loader_int8" else "dynamic_int4_block32"
    elif mode == "tpu_dir":
        hf = _lazy_dir(folder)
    elif mode in ("tpu", "tpu_in_process", "tpu_child"):  # a TPU artifact keeps the checkpoint's dtype (3B: bf16)
        hf = transformers.LlamaForCausalLM.from_pretrained(folder, torch_dtype=_dir_dtype(torch, folder)).eval()
    else:
        hf = transformers.LlamaForCausalLM.from_pretrained(folder, torch_dtype=torch.float32).eval()
    module = wrap(hf).eval()
    t0 = time.perf_counter()
    from tpu_export import litert_torch

    if mode == "phases":  # where our streamed conversion's time goes: capture, lowering, the write
        from tpu_export.converter import prepare_many
        from tpu_export.converter.pipeline import SignatureRequest
        from tpu_export.edge.convert import lower_program, write_model

        prog = prepare_many([SignatureRequest("serving_default", module, (ids,))])
        t1 = time.perf_counter()
        lowered = lower_program(prog, spill=True, spill_folder=os.path.dirname(os.path.abspath(out)))
        t2 = time.perf_counter()
        write_model(lowered, out)
        t3 = time.perf_counter()
        phases = {"capture_s": round(t1 - t0, 1), "lower_s": round(t2 - t1, 1), "write_s": round(t3 - t2, 1)}
        print(json.dumps(phases), file=sys.stderr)
    elif mode == "peer":
        model = litert_torch.convert(module, (ids,), lightweight_conversion=True)
        model.export(out)
    elif mode in ("tpu", "tpu_in_process", "tpu_child", "tpu_dir"):  # a TPU artifact for one v6e chip
        import shutil

        import tpu_export

        folder_out = out + ".tpu"
        shutil.rmtree(folder_out, ignore_errors=True)
        # "tpu": the default (aot_in_process=None: a child for these sizes)
        opts = {"tpu_in_process": {"aot_in_process": True}, "tpu_child": {"aot_in_process": False}}.get(mode, {})
        written = tpu_export.convert(module, (ids,), targets=["tpu-v6e"], out_dir=folder_out, **opts)
        convert_s = time.perf_counter() - t0
        art = written["tpu-v6e"]
        size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(art) for f in fs)
        print(json.dumps({"mode": mode, "convert_s": round(convert_s, 1),
                          "process_s": round(time.perf_counter() - t_start, 1),
                          "peak_rss_gb": round(_peak_rss() / 2**30, 2), "size_gb": round(size / 2**30, 3)}))
        shutil.rmtree(folder_out, ignore_errors=True)
        return
    elif mode == "memory":
        model = litert_torch.convert(module, (ids,))
        model.export(out)
    else:
        model = litert_torch.convert(module, (ids,), output_file_path=out, delete_in_memory_params=mode == "delete",
                                     **kwargs)
    convert_s = time.perf_counter() - t0
    print(json.dumps({"mode": mode, "convert_s": round(convert_s, 1),
                      "process_s": round(time.perf_counter() - t_start, 1),
                      "peak_rss_gb": round(_peak_rss() / 2**30, 2),
                      "size_gb": round(os.path.getsize(out) / 2**30, 3)}))


def _dir_dtype(torch, folder: str):
    with open(os.path.join(folder, "config.json")) as f:
        cfg = json.load(f)
    return getattr(torch, cfg.get("dtype") or cfg.get("torch_dtype") or "float32")


def _lazy_dir(folder: str):
    """The directory's model with its parameters mapped from the shards, read on demand (tpu_dir): convert-lm's
    lazy load (targets/lm_stream.load_lazily) in the directory's own dtype (a bf16 one stays bf16, mapped where it
    lies: the TPU artifact keeps bf16)."""
    import torch

    from tpu_export.targets.lm_stream import load_lazily

    dtype = _dir_dtype(torch, folder)
    model = load_lazily(folder, dtype=dtype)
    assert model is not None and isinstance(model.tpu_export_spool, list), f"{folder}: not mapped as {dtype}"
    return model


def _peak_rss() -> int:
    """This process's peak RSS (VmHWM). Not ru_maxrss: Linux carries a forked parent's RSS into the
    child's ru_maxrss across exec, so a worker started by a parent that had just built a 3 B model
    would report the parent's size."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def check_output(path: str, folder: str) -> float:
    """max rel err of the .tflite's logits vs transformers (in a fresh process: the model is big)."""
    code = f"""
import sys, torch, transformers, numpy as np
sys.path.insert(0, {ROOT!r})
from tpu_export import litert_torch
from tests.numerics import rel_err
ids = torch.randint(0, 500, (1, 16), generator=torch.Generator().manual_seed(1))
hf = transformers.LlamaForCausalLM.from_pretrained({folder!r}, torch_dtype=torch.float32).eval()
with torch.no_grad():
    want = hf(input_ids=ids, use_cache=False).logits
del hf
print(rel_err(litert_torch.load({path!r})(ids), want))
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    return float(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 else float("nan")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="llama0.5b,llama1.1b")
    ap.add_argument("--modes", default="stream,delete,loader,peer")
    ap.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "tpu-export-bench-large"))
    ap.add_argument("--check", action="store_true", help="also compare each .tflite's logits with transformers")
    ap.add_argument("--trace", action="store_true",
                    help="also write each run's process-tree RSS over time (<work>/<model>-<mode>.rss.tsv)")
    a = ap.parse_args()
    from _tree_rss import run_polled  # bench/ is this script's sys.path[0]

    os.makedirs(a.work, exist_ok=True)
    rows = []
    for name in a.models.split(","):
        if name == "vit_b_16":  # no directory: built in each worker; "weights" = its float32 parameters
            folder, wbytes = "-", 86_567_656 * 4
        else:
            # built in a child process: this one stays small (see _peak_rss)
            subprocess.run([sys.executable, os.path.abspath(__file__), "--build", name, a.work], check=True)
            folder = os.path.join(a.work, name)
            wbytes = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder)
                         if f.endswith(".safetensors"))
        for mode in a.modes.split(","):
            out = os.path.join(a.work, f"{name}-{mode}.tflite")
            py = PEER_PY if mode in ("peer", "vit_peer") else sys.executable
            env = dict(os.environ, PYTHONWARNINGS="ignore", TF_CPP_MIN_LOG_LEVEL="3")
            r, tree = run_polled([py, os.path.abspath(__file__), "--worker", mode, folder, out], env,
                                 trace=a.trace and f"{os.path.splitext(out)[0]}.rss.tsv")
            if r.returncode != 0:
                print(f"{name} {mode}: failed: {r.stderr.strip().splitlines()[-1:]}", flush=True)
                continue
            row = json.loads(r.stdout.strip().splitlines()[-1])
            for line in r.stderr.splitlines():
                if line.startswith('{"capture_s"'):
                    row.update(json.loads(line))
            # the process tree's peak (a worker's own children, e.g. the TPU compile worker, summed with it);
            # the worker's own VmHWM stays in the row as worker_peak_rss_gb
            row["worker_peak_rss_gb"] = row["peak_rss_gb"]
            row["peak_rss_gb"] = round(max(tree, row["peak_rss_gb"] * 2**30) / 2**30, 2)
            row.update(model=name, weights_gb=round(wbytes / 2**30, 2),
                       x_weights=round(row["peak_rss_gb"] * 2**30 / wbytes, 2))
            if a.check:
                row["rel_err"] = check_output(out, folder)
            rows.append(row)
            print(json.dumps(row), flush=True)
            if os.path.exists(out):
                os.remove(out)
    print()
    print(f"{'model':10s} {'mode':7s} {'weights GB':>10s} {'convert s':>9s} {'peak RSS GB':>11s} {'x weights':>9s} "
          f"{'.tflite GB':>10s}")
    for r in rows:
        print(f"{r['model']:10s} {r['mode']:7s} {r['weights_gb']:10.2f} {r['convert_s']:9.1f} {r['peak_rss_gb']:11.2f} "
              f"{r['x_weights']:9.2f} {r['size_gb']:10.3f}"
              + (f"  rel err {r['rel_err']:.1e}" if "rel_err" in r else ""))
    record(rows, a.modes.split(","))


def record(rows, modes) -> None:
    """Append this run to bench/results/large.json; the set follows the modes run."""
    from bench.render_pages import append_run

    if not rows:
        return
    columns = [{"key": "model", "label": "model"}, {"key": "mode", "label": "mode"},
               {"key": "weights_gb", "label": "weights GiB", "fmt": ".2f"},
               {"key": "convert_s", "label": "convert s", "fmt": ".1f"},
               {"key": "peak_rss_gb", "label": "peak RSS GiB", "fmt": ".2f"},
               {"key": "x_weights", "label": "x weights", "fmt": ".2f"},
               {"key": "size_gb", "label": "output GiB", "fmt": ".2f"},
               {"key": "rel_err", "label": "rel err vs transformers", "fmt": ".1e"}]
    table = [{c["key"]: r.get(c["key"]) for c in columns} for r in rows]
    xs = [r["x_weights"] for r in rows]
    headline = f"peak RSS {min(xs):.2f}-{max(xs):.2f}x the weights"
    ours = [r["convert_s"] for r in rows if r["mode"] == "stream"]
    peer = [r["convert_s"] for r in rows if r["mode"] == "peer"]
    if ours and peer:
        headline += f"; streamed conversion {sum(ours) / sum(peer):.2f}x the peer's time (summed)"
    if all(m.startswith("tpu") for m in modes):
        set_name = "tpu"
    elif all(m.startswith("loader_int") for m in modes):
        set_name = "int_3b"
    else:
        set_name = "modes"
    append_run("large", columns, table, headline, set_name=set_name)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--build":
        ensure_model(sys.argv[2], sys.argv[3])
    elif len(sys.argv) > 1 and sys.argv[1] == "--worker":
        sys.path.append(ROOT)  # appended: the peer venv's litert_torch must win over this repo's
        worker(*sys.argv[2:5])
    else:
        sys.path.insert(0, ROOT)
        main()
