"""`tpu-export serve` under load at real size: ResNet-50 (torchvision's architecture and width, random weights;
bench/real_models.py), 224x224 float32 images, converted with a dynamic batch dim (1..32) for tpu-v6e and served
here on PJRT (this host's CPU unless it has a TPU or GPU). For each of batched (--max-batch 32) and unbatched
(--max-batch 1) the server runs as a child process (`tpu-export serve`); this process's client threads (httpx,
one image per request, the JSON bodies encoded once beforehand) keep 1, 8 and 32 requests in flight.

    .venv/bin/python bench/serve.py [--requests 64] [--out bench/results/serve.json]

Writes per setting: images/s, latency p50/p90/p99, the mean rows per model call (from the server's /metrics) and
the max abs error of the answers against torch eager; and the host (CPU count, load average), so that figures from
a shared host are read as such.

    .venv/bin/python bench/serve.py --lm [--lm-requests 4,16,32] [--out bench/results/serve.json]

LM mode (the "lm" entry of the same file): a Llama-architecture model at published widths (hidden 768, 12 layers,
12 heads, MLP 2048, vocab 32000, tied embeddings: 110 M parameters; random weights, seeded) with a word-level
tokenizer over its 32000 ids, converted for tpu-v6e with slots=32 (prefill 16 and 32, cache 128), served twice: with
continuous batching (--max-batch 32) and one request at a time (--max-batch 1: LoopGenerator's loop, the batch-1
prefill and decode signatures, the sequential generate of the same artifact). Streamed completions (greedy, 64 new
tokens, prompts of 8 to 30 tokens) with 1, 8 and 32 in flight: tokens/s, time to first token p50/p99 and the time
between tokens p50/p99; each request's text is compared between the two modes.
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


LM = dict(vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=12, num_attention_heads=12,
          num_key_value_heads=12, max_position_embeddings=2048, tie_word_embeddings=True, pad_token_id=0,
          bos_token_id=1, eos_token_id=2)


def _lm_dir(path: str, layers: int, hidden: int) -> int:
    """A seeded random Llama at LM's widths (``layers``/``hidden`` to shrink it for a smoke run) with a word-level
    tokenizer whose every id decodes ("w123"); returns its parameter count."""
    import tokenizers
    import torch
    import transformers
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit

    cfg = transformers.LlamaConfig(**{**LM, "num_hidden_layers": layers, "hidden_size": hidden,
                                      "intermediate_size": hidden * 8 // 3})
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    model.save_pretrained(path)
    special = ["<pad>", "<s>", "</s>", "<unk>"]
    vocab = {w: i for i, w in enumerate(special)}
    vocab.update({f"w{i}": i for i in range(len(special), cfg.vocab_size)})
    tok = tokenizers.Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = WhitespaceSplit()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>",
                                                eos_token="</s>", unk_token="<unk>")
    fast.save_pretrained(path)
    return sum(p.numel() for p in model.parameters())


def _stream_one(c, prompt: str, max_tokens: int) -> dict:
    """One streamed completion: time to the first text, the times between texts, the text, the token count."""
    body = {"model": "lm", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    stamps, text, tokens = [], [], None
    with c.stream("POST", "/v1/completions", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ev = json.loads(line[6:])
            assert "error" not in ev, ev
            if ev.get("usage"):
                tokens = ev["usage"]["completion_tokens"]
            for ch in ev.get("choices") or ():
                if ch.get("text"):
                    stamps.append(time.perf_counter())
                    text.append(ch["text"])
    return {"ttft": stamps[0] - t0, "gaps": [b - a for a, b in zip(stamps, stamps[1:])], "text": "".join(text),
            "tokens": tokens, "total": time.perf_counter() - t0}


def _lm_load(base: str, prompts: list, concurrency: int, max_tokens: int) -> tuple[list, float]:
    import httpx

    out, lock, nxt = [None] * len(prompts), threading.Lock(), [0]

    def worker():
        with httpx.Client(base_url=base, timeout=3600) as c:
            while True:
                with lock:
                    i = nxt[0]
                    nxt[0] += 1
                if i >= len(prompts):
                    return
                out[i] = _stream_one(c, prompts[i], max_tokens)

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out, time.perf_counter() - t0


def _serve(args: list) -> tuple:
    import httpx

    port = _port()
    base = f"http://127.0.0.1:{port}"
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", CLI, "serve", *args, "--port", str(port), "--log-level",
                             "warning"], cwd=ROOT)
    while True:
        assert proc.poll() is None, "the server exited"
        try:
            if httpx.get(f"{base}/v2/health/ready").status_code == 200:
                break
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    return proc, base, time.perf_counter() - t0


def main_lm(a) -> int:
    import random

    import tpu_export

    work = tempfile.mkdtemp(prefix="serve-lm-bench-")
    params = _lm_dir(os.path.join(work, "hf"), a.lm_layers, a.lm_hidden)
    t0 = time.perf_counter()
    tpu_export.convert_lm(os.path.join(work, "hf"), {"tpu-v6e": {"aot": False, "slots": a.slots}},
                          os.path.join(work, "out"), prefill_lengths=(16, 32), cache_len=128)
    convert_s = time.perf_counter() - t0
    rnd = random.Random(0)
    counts = [int(n) for n in a.lm_requests.split(",")]
    levels = [int(c) for c in a.concurrency.split(",")]
    prompts = {c: [" ".join(f"w{rnd.randrange(4, 32000)}" for _ in range(rnd.randint(8, 30))) for _ in range(n)]
               for c, n in zip(levels, counts)}
    rows, texts = [], {}
    for mode, max_batch in (("continuous", a.slots), ("sequential", 1)):
        proc, base, start_s = _serve([f"lm={work}/out/tpu-v6e", "--max-batch", str(max_batch),
                                      "--request-timeout", "3600", "--max-queue", "1024"])
        try:
            _lm_load(base, ["w5 w6 w7"], 1, 2)  # the first request's connection setup
            for c in levels:
                res, wall = _lm_load(base, prompts[c], c, a.new_tokens)
                tokens = sum(r["tokens"] for r in res)
                ttft = [r["ttft"] for r in res]
                gaps = [g for r in res for g in r["gaps"]]
                texts[(mode, c)] = [r["text"] for r in res]
                row = {"mode": mode, "max_batch": max_batch, "concurrency": c, "requests": len(res),
                       "tokens": tokens, "tokens_per_s": tokens / wall, "wall_s": wall,
                       "ttft_p50_ms": _pct(ttft, 0.5) * 1e3, "ttft_p99_ms": _pct(ttft, 0.99) * 1e3,
                       "token_gap_p50_ms": _pct(gaps, 0.5) * 1e3, "token_gap_p99_ms": _pct(gaps, 0.99) * 1e3,
                       "server_start_s": start_s, "loadavg": os.getloadavg()[0]}
                rows.append(row)
                print(json.dumps(row), flush=True)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(120)
    same = {c: texts[("continuous", c)] == texts[("sequential", c)] for c in levels}
    speedup = {c: next(r["tokens_per_s"] for r in rows if r["mode"] == "continuous" and r["concurrency"] == c) /
               next(r["tokens_per_s"] for r in rows if r["mode"] == "sequential" and r["concurrency"] == c)
               for c in levels}
    lm = {"command": " ".join(["bench/serve.py", *sys.argv[1:]]),
          "model": f"Llama architecture, hidden {a.lm_hidden}, {a.lm_layers} layers, vocab 32000, tied embeddings: "
                   f"{params / 1e6:.1f} M parameters (random weights)",
          "artifact": f"tpu-v6e (PJRT CPU here), slots={a.slots}, prefill 16 and 32, cache 128, float32",
          "new_tokens": a.new_tokens, "convert_s": convert_s, "speedup_tokens_per_s": speedup,
          "same_text_as_sequential": same,
          "host": {"platform": platform.platform(), "cpus": os.cpu_count(), "loadavg_at_end": os.getloadavg(),
                   "python": platform.python_version()},
          "rows": rows}
    print(json.dumps({"speedup": speedup, "same_text": same}), flush=True)
    result = {}
    if os.path.exists(a.out):
        with open(a.out) as f:
            result = json.load(f)
    result["lm"] = lm
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(result, f, indent=2)
    print(f"wrote {a.out}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=64, help="requests per setting (at concurrency 1: a quarter)")
    ap.add_argument("--concurrency", default="1,8,32")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "serve.json"))
    ap.add_argument("--lm", action="store_true", help="the LM bench (continuous batching vs one at a time)")
    ap.add_argument("--lm-requests", default="4,16,32", help="LM: requests at each concurrency")
    ap.add_argument("--slots", type=int, default=32, help="LM: slots of the artifact")
    ap.add_argument("--new-tokens", type=int, default=64, help="LM: new tokens per request")
    ap.add_argument("--lm-layers", type=int, default=12, help="LM: layers (12; fewer for a smoke run)")
    ap.add_argument("--lm-hidden", type=int, default=768, help="LM: hidden size (768; less for a smoke run)")
    a = ap.parse_args()
    if a.lm:
        return main_lm(a)

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
        proc, base, start_s = _serve([f"resnet50={work}/out/tpu-v6e", "--max-batch", str(max_batch),
                                      "--batch-timeout-ms", "5"])
        try:
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
    previous = {}
    if os.path.exists(a.out):
        with open(a.out) as f:
            previous = json.load(f)
    result = {"command": " ".join(["bench/serve.py", *sys.argv[1:]]), "model": "resnet50 (25.6M params), 224x224",
              "convert_s": convert_s,
              "host": {"platform": platform.platform(), "cpus": os.cpu_count(), "loadavg_at_end": os.getloadavg(),
                       "python": platform.python_version()},
              "rows": rows, **({"lm": previous["lm"]} if "lm" in previous else {})}
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(result, f, indent=2)
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
