"""Dynamic dims on the edge: ours vs litert-torch 0.10.0, and what a dynamic dim costs at run time.

    .venv/bin/python bench/edge_dynamic.py [--models bert,gpt2,...] [--runs 20]

Per model (real-size configs: BERT-base, DistilBERT-base, GPT-2 small, a Llama of GPT-2 small's size,
T5-base encoder, Whisper-base encoder, Wav2Vec2-base, ViT-B/16; the zoo's DeepLabV3 / LR-ASPP heads and a
UNet, seeded random weights; Wav2Vec2's range starts at 800 samples: its convs need >= 720), each
conversion in a fresh process:
- ours and the peer (litert-torch 0.10.0, in bench/edge_vs_litert_torch.py's venv) with the model's dims
  dynamic (batch + sequence, frames, samples, height x width, or batch for ViT): conversion time, or
  the first line of the error;
- ours with every dim static at a fixed size, then our dynamic and static .tflite files at that size in
  the LiteRT interpreter (1 thread, XNNPACK; inputs resized once, then set + invoke), --runs calls each
  (more for a fast model: about a second of calls, at most 500),
  the two files alternating call by call: medians of the calling thread's CPU time (time.thread_time: on
  a shared, loaded host the wall clock mostly measures waiting for a core; with 1 thread the interpreter
  runs in the calling thread) and of the wall time, the ratio dynamic / static of each (goal <= 1.05), and
  rel err vs torch. --skip-peer leaves out the peer's conversions (~1-2 min each).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# appended, not prepended: in the peer's venv its litert_torch must win over this repo's package
sys.path.append(ROOT)

MODELS = ["bert", "distilbert", "gpt2", "llama", "t5_encoder", "whisper_encoder", "wav2vec2", "deeplabv3",
          "lraspp", "unet", "vit"]


# ---------------------------------------------------------------------------- models (both venvs)


def _hf(cfg_name, model_name, **cfg):
    import torch
    import transformers

    torch.manual_seed(0)
    c = getattr(transformers, cfg_name)(**cfg)
    c._attn_implementation = "sdpa"
    return getattr(transformers, model_name)(c).eval()


def _text(m, vocab, seq_max):
    """(module, sample kwargs, dynamic_shapes, fixed-size kwargs) for an ids + mask encoder."""
    import torch

    Dim = torch.export.Dim
    b, s = Dim("batch", min=1, max=8), Dim("seq", min=2, max=seq_max)

    def kw(n, t):
        g = torch.Generator().manual_seed(n * 1000 + t)
        return {"input_ids": torch.randint(0, vocab, (n, t), generator=g),
                "attention_mask": torch.ones(n, t, dtype=torch.long)}

    return m, kw(2, 16), {"input_ids": {0: b, 1: s}, "attention_mask": {0: b, 1: s}}, kw(1, 128)


def build(name):
    import torch

    Dim = torch.export.Dim
    if name == "bert":
        return _text(_hf("BertConfig", "BertModel"), 30522, 512)
    if name == "distilbert":
        return _text(_hf("DistilBertConfig", "DistilBertModel"), 30522, 512)
    if name == "gpt2":
        return _text(_hf("GPT2Config", "GPT2Model", use_cache=False), 50257, 1024)
    if name == "llama":
        return _text(_hf("LlamaConfig", "LlamaModel", vocab_size=32000, hidden_size=768, intermediate_size=2048,
                         num_hidden_layers=12, num_attention_heads=12, num_key_value_heads=4,
                         max_position_embeddings=2048, use_cache=False), 32000, 2048)
    if name == "t5_encoder":
        return _text(_hf("T5Config", "T5EncoderModel", d_model=768, d_ff=3072, num_layers=12, num_heads=12), 32128,
                     512)
    if name == "whisper_encoder":
        from transformers import WhisperConfig
        from transformers.models.whisper.modeling_whisper import WhisperEncoder

        from tests.zoo import WhisperFrames

        torch.manual_seed(0)
        cfg = WhisperConfig(d_model=512, encoder_layers=6, encoder_attention_heads=8, encoder_ffn_dim=2048)
        cfg._attn_implementation = "sdpa"
        enc = WhisperEncoder(cfg).eval()

        def kw(n, t):
            return {"input_features": torch.randn(n, 80, t, generator=torch.Generator().manual_seed(t))}

        half = Dim("half", min=2, max=1500)
        dyn = {"input_features": {0: Dim("batch", min=1, max=8), 2: 2 * half}}
        return WhisperFrames(enc).eval(), kw(2, 400), dyn, kw(1, 1000)
    if name == "wav2vec2":
        m = _hf("Wav2Vec2Config", "Wav2Vec2Model", apply_spec_augment=False)

        def kw(n, t):
            return {"input_values": torch.randn(n, t, generator=torch.Generator().manual_seed(t))}

        return m, kw(2, 8000), {"input_values": {0: Dim("batch", min=1, max=8), 1: Dim("samples", min=800,
                                                                                            max=160000)}}, kw(1, 16000)
    if name in ("deeplabv3", "lraspp", "unet", "vit"):
        if name == "vit":
            m = _vit()
        elif name == "unet":
            m = _unet()
        else:
            from tests.zoo import NamedX
            from tests.zoo import build as zoo

            m = NamedX(zoo(name)[0]).eval()

        def kw(n, h, w=None):
            return {"x": torch.randn(n, 3, h, w or h, generator=torch.Generator().manual_seed(h))}

        if name == "vit":
            return m, kw(2, 224), {"x": {0: Dim("batch", min=1, max=32)}}, kw(1, 224)
        q = 4 if name == "unet" else 16
        hq, wq = Dim("hq", min=2, max=1024 // q), Dim("wq", min=2, max=1024 // q)
        return m, kw(2, 128), {"x": {0: Dim("batch", min=1, max=8), 2: q * hq, 3: q * wq}}, kw(1, 256)
    raise SystemExit(f"unknown model {name!r}; pick from {MODELS}")


def _vit():
    import torch
    from torch import nn
    from transformers import ViTConfig, ViTModel

    torch.manual_seed(0)
    cfg = ViTConfig()
    cfg._attn_implementation = "sdpa"
    vit = ViTModel(cfg, add_pooling_layer=False).eval()

    class Wrap(nn.Module):
        def __init__(self):
            super().__init__()
            self.vit = vit

        def forward(self, x):
            return self.vit(pixel_values=x).last_hidden_state

    return Wrap().eval()


def _unet():
    import torch
    import torch.nn.functional as F
    from torch import nn

    def c(i, o):
        return nn.Sequential(nn.Conv2d(i, o, 3, padding=1), nn.BatchNorm2d(o), nn.ReLU(), nn.Conv2d(o, o, 3, padding=1),
                             nn.BatchNorm2d(o), nn.ReLU())

    class UNet(nn.Module):  # the classic shape, widths 32-256, 4 levels; output at the input's size
        def __init__(self, w=(32, 64, 128, 256)):
            super().__init__()
            self.downs = nn.ModuleList([c(3, w[0])] + [c(w[i], w[i + 1]) for i in range(3)])
            self.ups = nn.ModuleList([c(w[i + 1] + w[i], w[i]) for i in reversed(range(3))])
            self.head = nn.Conv2d(w[0], 2, 1)

        def forward(self, x):
            skips = []
            for i, d in enumerate(self.downs):
                x = d(x if i == 0 else F.max_pool2d(x, 2))
                skips.append(x)
            for u, s in zip(self.ups, reversed(skips[:-1])):
                x = u(torch.cat([F.interpolate(x, size=s.shape[-2:], mode="bilinear", align_corners=False), s], 1))
            return self.head(x)

    torch.manual_seed(0)
    return UNet().eval()


# ---------------------------------------------------------------------------- one conversion per process


def worker(impl, name, mode, out):
    import torch

    try:  # ours in the project's venv, Google's in the peer's (which has no tpu_export)
        from tpu_export import litert_torch
    except ImportError:
        import litert_torch

    module, sample, dyn, fixed = build(name)
    t0 = time.perf_counter()
    try:
        kwargs = fixed if mode == "static" else sample
        with torch.no_grad():
            model = litert_torch.convert(module, (), kwargs, dynamic_shapes=None if mode == "static" else dyn)
        model.export(out)
        info = {"convert_s": time.perf_counter() - t0}
    except Exception as e:  # noqa: BLE001 - recorded: the peer fails on most
        msg = " ".join(str(e).split())
        info = {"error": f"{type(e).__name__}: {msg[:240]}", "after_s": time.perf_counter() - t0}
    print(json.dumps(info))


def run_worker(py, impl, name, mode, out):
    from _worker_json import run_json

    return run_json([py, os.path.abspath(__file__), "--worker", impl, name, mode, out], timeout=1800,
                    cwd=tempfile.gettempdir(), err_chars=240)  # cwd: not this repo's package


# ---------------------------------------------------------------------------- latency


class Timed:
    def __init__(self, path, kwargs):
        import numpy as np
        from ai_edge_litert.interpreter import Interpreter

        self.it = Interpreter(model_path=path, num_threads=1)
        ins = self.it.get_input_details()
        by_name = {d["name"]: d for d in ins}
        names = self.it.get_signature_list()["serving_default"]["inputs"]
        sig = self.it.get_signature_runner().get_input_details()
        self.feed = []
        for n in names:
            d = by_name.get(n) or next(x for x in ins if x["index"] == sig[n]["index"])
            x = kwargs[n].numpy().astype(d["dtype"])
            self.it.resize_tensor_input(d["index"], list(x.shape))
            self.feed.append((d["index"], np.ascontiguousarray(x)))
        self.it.allocate_tensors()
        self.out_index = self.it.get_output_details()[0]["index"]
        self.times, self.cpu = [], []
        for _ in range(2):
            self._run()

    def _run(self):
        for i, x in self.feed:
            self.it.set_tensor(i, x)
        self.it.invoke()

    def block(self, n):
        for _ in range(n):
            c, t = time.thread_time(), time.perf_counter()
            self._run()
            self.times.append((time.perf_counter() - t) * 1e3)
            self.cpu.append((time.thread_time() - c) * 1e3)

    def output(self):
        return self.it.get_tensor(self.out_index)


def probe(path, kwargs, ref) -> dict:
    """A .tflite that converted: its inputs' shape_signature, and whether it runs at the fixed size (inputs
    in signature order = kwargs order) and matches torch there."""
    import numpy as np
    from ai_edge_litert.interpreter import Interpreter

    it = Interpreter(model_path=path, num_threads=1)
    ins = it.get_input_details()
    info = {"shape_signature": [d["shape_signature"].tolist() for d in ins]}
    try:
        for d, x in zip(ins, kwargs.values()):
            it.resize_tensor_input(d["index"], list(x.shape), strict=True)
        it.allocate_tensors()
        for d, x in zip(ins, kwargs.values()):
            it.set_tensor(d["index"], x.numpy().astype(d["dtype"]))
        it.invoke()
        got = it.get_tensor(it.get_output_details()[0]["index"]).astype(np.float64)
        info["at_fixed_size"] = (f"rel err {np.abs(got - ref).max() / np.abs(ref).max():.1e}"
                                 if got.shape == ref.shape else f"output shape {got.shape}, expected {ref.shape}")
    except Exception as e:  # noqa: BLE001
        info["at_fixed_size"] = f"{type(e).__name__}: {' '.join(str(e).split())[:160]}"
    return info


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--skip-peer", action="store_true", help="convert with ours only")
    a = ap.parse_args()
    import numpy as np
    import torch

    from bench.edge_vs_litert_torch import compile_our_sources, ensure_peer

    peer_py = None if a.skip_peer else ensure_peer()
    compile_our_sources()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in a.models.split(","):
            row = {"model": name}
            for key, py, impl, mode in (("peer", peer_py, "peer", "dynamic"),
                                        ("ours", sys.executable, "ours", "dynamic"),
                                        ("static", sys.executable, "ours", "static")):
                if py is None:
                    row[key] = {"error": "skipped (--skip-peer)"}
                    continue
                row[key] = run_worker(py, impl, name, mode, os.path.join(tmp, f"{name}.{key}.tflite"))
            module, _, _, fixed = build(name)
            with torch.no_grad():
                out = module(**fixed)
            ref = (out if isinstance(out, torch.Tensor) else out[0]).double().numpy()
            if "error" not in row["peer"] and not a.skip_peer:
                row["peer"].update(probe(os.path.join(tmp, f"{name}.peer.tflite"), fixed, ref))
            if "error" not in row["ours"] and "error" not in row["static"]:
                timed = {k: Timed(os.path.join(tmp, f"{name}.{k}.tflite"), fixed) for k in ("ours", "static")}
                # a fast model gets more calls (about a second of each file, at most 500): 20 calls of a
                # 1 ms model on the loaded host varied its ratio by +-4%
                t0 = time.perf_counter()
                timed["static"].block(1)
                timed["static"].times.clear()
                timed["static"].cpu.clear()
                runs = max(a.runs, min(500, int(1.0 / max(time.perf_counter() - t0, 1e-4))))
                for _ in range(runs):
                    for t in timed.values():
                        t.block(1)
                for k, t in timed.items():
                    got = t.output().astype(np.float64)
                    row[k]["latency_ms"] = statistics.median(t.times)
                    row[k]["cpu_ms"] = statistics.median(t.cpu)
                    row[k]["rel_err"] = float(np.abs(got - ref).max() / np.abs(ref).max())
                row["dyn_over_static"] = row["ours"]["latency_ms"] / row["static"]["latency_ms"]
                row["dyn_over_static_cpu"] = row["ours"]["cpu_ms"] / row["static"]["cpu_ms"]
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    report(rows)
    record(rows, a.skip_peer)


def report(rows):
    print(f"{'model':16s} {'ours dyn conv s':>15s} {'static conv s':>13s} {'dyn cpu ms':>10s} {'static cpu':>10s} "
          f"{'dyn/static':>10s} {'dyn ms':>8s} {'static ms':>9s} {'wall d/s':>8s} {'err dyn':>8s}  "
          f"peer (dynamic dims)")
    for r in rows:
        o, s, p = r["ours"], r["static"], r["peer"]
        peer = (f"converts in {p['convert_s']:.1f} s, inputs {p['shape_signature']}, at the fixed size: "
                f"{p['at_fixed_size']}") if "error" not in p else p["error"][:150]
        if "error" in o or "error" in s:
            print(f"{r['model']:16s} ours: {o.get('error', 'ok')[:100]} static: {s.get('error', 'ok')[:60]}  {peer}")
            continue
        print(f"{r['model']:16s} {o['convert_s']:15.1f} {s['convert_s']:13.1f} {o['cpu_ms']:10.2f} "
              f"{s['cpu_ms']:10.2f} {r['dyn_over_static_cpu']:10.3f} {o['latency_ms']:8.2f} {s['latency_ms']:9.2f} "
              f"{r['dyn_over_static']:8.3f} {o['rel_err']:8.1e}  {peer}")


def record(rows, skip_peer: bool) -> None:
    """Append this run to bench/results/edge_dynamic.json: a run with the peer to the "peer" set, else "quiet"."""
    from bench.render_pages import append_run

    table, ratios = [], []
    for r in rows:
        o, s, p = r["ours"], r["static"], r["peer"]
        row = {"model": r["model"]}
        if "error" in o or "error" in s:
            row["ours_error"] = f"ours: {o.get('error', 'ok')}; static: {s.get('error', 'ok')}"[:200]
        else:
            row.update(dyn_convert_s=o["convert_s"], static_convert_s=s["convert_s"], dyn_cpu_ms=o["cpu_ms"],
                       static_cpu_ms=s["cpu_ms"], dyn_over_static_cpu=r["dyn_over_static_cpu"],
                       dyn_over_static_wall=r["dyn_over_static"], rel_err=o["rel_err"])
            ratios.append(r["dyn_over_static_cpu"])
        if not skip_peer:
            row["peer"] = (f"converts in {p['convert_s']:.1f} s, inputs {p['shape_signature']}, at the fixed size: "
                           f"{p['at_fixed_size']}" if "error" not in p else p["error"])[:200]
        table.append(row)
    columns = [{"key": "model", "label": "model"},
               {"key": "dyn_convert_s", "label": "ours, dynamic dims: convert s", "fmt": ".1f"},
               {"key": "static_convert_s", "label": "ours static: convert s", "fmt": ".1f"},
               {"key": "dyn_cpu_ms", "label": "dyn ms (CPU)", "fmt": ".2f"},
               {"key": "static_cpu_ms", "label": "static ms (CPU)", "fmt": ".2f"},
               {"key": "dyn_over_static_cpu", "label": "dyn / static (CPU)", "fmt": ".3f"},
               {"key": "dyn_over_static_wall", "label": "dyn / static (wall)", "fmt": ".3f"},
               {"key": "rel_err", "label": "rel err vs torch", "fmt": ".1e"},
               {"key": "ours_error", "label": "ours failed"}]
    if not skip_peer:
        columns.append({"key": "peer", "label": "litert-torch 0.10.0 with the same dynamic dims"})
    headline = (f"dynamic / static latency (CPU) {min(ratios):.3f}-{max(ratios):.3f}x; "
                f"{sum(x <= 1.05 for x in ratios)} of {len(rows)} models within 1.05x" if ratios
                else "no model converted on both sides")
    append_run("edge_dynamic", columns, table, headline, set_name="quiet" if skip_peer else "peer")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(*sys.argv[2:6])
    else:
        main()
