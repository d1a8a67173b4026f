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
tokenizer over its 32000 ids, converted with slots=32 (prefill 16 and 32, cache 128) for --lm-target (cpu-xla, the
artifact for the CPU it is served on here; tpu-v6e's artifact runs here too, with TPU-layout weights), served twice:
with continuous batching (--max-batch 32) and one request at a time (--max-batch 1: LoopGenerator's loop, the batch-1
prefill and decode signatures, the sequential generate of the same artifact). Streamed completions (greedy, 64 new
tokens, prompts of 8 to 30 tokens) with 1, 8 and 32 in flight, both servers up and the two modes run back to back at
each level: tokens/s, time to first token p50/p99, the time between tokens p50/p99 and the server's CPU time per
token (steadier than wall time on a shared host), with the load average; each request's text is compared between
the two modes.

    .venv/bin/python bench/serve.py --cold-start [--cold-runs 3] [--out bench/results/serve.json]

Cold-start mode (the "cold_start" entry): ResNet-50 at batch 1 served by a fresh `tpu-export serve` child, timed
from the exec to its first answer, alternating two modes: JIT (PJRT CPU compiles the artifact's StableHLO at start,
what the server does) and AOT (the same PJRT CPU executables, serialized and loaded back from jax's persistent
compilation cache, which one priming run fills). Then the serving signature's executable is compiled, serialized
and deserialized in this process (times, size, same output), what storing CPU executables in an artifact would cost.
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


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system, all threads) process ``pid`` has used: on a shared host a server's CPU time per
    token is steadier than its wall time."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main_lm(a) -> int:
    import random

    import tpu_export

    work = tempfile.mkdtemp(prefix="serve-lm-bench-")
    params = _lm_dir(os.path.join(work, "hf"), a.lm_layers, a.lm_hidden)
    t0 = time.perf_counter()
    options = {"slots": a.slots, **({"aot": False} if a.lm_target.startswith("tpu-") else {})}
    tpu_export.convert_lm(os.path.join(work, "hf"), {a.lm_target: options},
                          os.path.join(work, "out"), prefill_lengths=(16, 32), cache_len=128)
    convert_s = time.perf_counter() - t0
    rnd = random.Random(0)
    counts = [int(n) for n in a.lm_requests.split(",")]
    levels = [int(c) for c in a.concurrency.split(",")]
    prompts = {c: [" ".join(f"w{rnd.randrange(4, 32000)}" for _ in range(rnd.randint(8, 30))) for _ in range(n)]
               for c, n in zip(levels, counts)}
    rows, texts, servers = [], {}, {}
    # both servers up at once, the two modes measured back to back at each concurrency: on a shared host the load
    # drifts over minutes, and comparing runs minutes apart would measure the drift
    try:
        for mode, max_batch in (("continuous", a.slots), ("sequential", 1)):
            proc, base, start_s = _serve([f"lm={work}/out/{a.lm_target}", "--max-batch", str(max_batch),
                                          "--request-timeout", "3600", "--max-queue", "1024"])
            servers[mode] = (proc, base, start_s, max_batch)
            _lm_load(base, ["w5 w6 w7"], 1, 2)  # the first request's connection setup
        for c in levels:
            for mode, (proc, base, start_s, max_batch) in servers.items():
                load0, cpu0 = os.getloadavg()[0], _cpu_s(proc.pid)
                res, wall = _lm_load(base, prompts[c], c, a.new_tokens)
                cpu = _cpu_s(proc.pid) - cpu0
                tokens = sum(r["tokens"] for r in res)
                ttft = [r["ttft"] for r in res]
                gaps = [g for r in res for g in r["gaps"]]
                texts[(mode, c)] = [r["text"] for r in res]
                row = {"mode": mode, "max_batch": max_batch, "concurrency": c, "requests": len(res),
                       "tokens": tokens, "tokens_per_s": tokens / wall, "wall_s": wall,
                       "ttft_p50_ms": _pct(ttft, 0.5) * 1e3, "ttft_p99_ms": _pct(ttft, 0.99) * 1e3,
                       "token_gap_p50_ms": _pct(gaps, 0.5) * 1e3, "token_gap_p99_ms": _pct(gaps, 0.99) * 1e3,
                       "server_cpu_s": cpu, "server_cpu_ms_per_token": cpu / tokens * 1e3,
                       "server_start_s": start_s, "loadavg_before": load0, "loadavg": os.getloadavg()[0]}
                rows.append(row)
                print(json.dumps(row), flush=True)
    finally:
        for proc, *_ in servers.values():
            proc.send_signal(signal.SIGTERM)
            proc.wait(120)
    rows.sort(key=lambda r: (r["mode"] != "continuous", r["concurrency"]))
    same = {c: texts[("continuous", c)] == texts[("sequential", c)] for c in levels}
    speedup = {c: next(r["tokens_per_s"] for r in rows if r["mode"] == "continuous" and r["concurrency"] == c) /
               next(r["tokens_per_s"] for r in rows if r["mode"] == "sequential" and r["concurrency"] == c)
               for c in levels}
    cpu_ratio = {c: next(r["server_cpu_ms_per_token"] for r in rows if r["mode"] == "sequential" and
                         r["concurrency"] == c) /
                 next(r["server_cpu_ms_per_token"] for r in rows if r["mode"] == "continuous" and r["concurrency"] == c)
                 for c in levels}
    lm = {"command": " ".join(["bench/serve.py", *sys.argv[1:]]),
          "model": f"Llama architecture, hidden {a.lm_hidden}, {a.lm_layers} layers, vocab 32000, tied embeddings: "
                   f"{params / 1e6:.1f} M parameters (random weights)",
          "artifact": f"{a.lm_target} (PJRT CPU here), slots={a.slots}, prefill 16 and 32, cache 128, float32",
          "new_tokens": a.new_tokens, "convert_s": convert_s, "speedup_tokens_per_s": speedup,
          "server_cpu_per_token_ratio": cpu_ratio,
          "same_text_as_sequential": same,
          "host": {"platform": platform.platform(), "cpus": os.cpu_count(), "loadavg_at_end": os.getloadavg(),
                   "python": platform.python_version()},
          "rows": rows}
    print(json.dumps({"speedup": speedup, "cpu_per_token_ratio": cpu_ratio, "same_text": same}), flush=True)
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


def _cold_start_once(art: str, env: dict, body: bytes, want) -> dict:
    """One `tpu-export serve` child from its exec to its first answer: seconds to ready (every signature compiled
    or loaded) and to the first 200; the answer's max abs error against torch eager."""
    import httpx
    import numpy as np

    port = _port()
    base = f"http://127.0.0.1:{port}"
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", CLI, "serve", f"resnet50={art}", "--max-batch", "1", "--port",
                             str(port), "--log-level", "warning"], cwd=ROOT, env=env)
    try:
        while True:
            assert proc.poll() is None, "the server exited"
            try:
                if httpx.get(f"{base}/v2/health/ready", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        ready = time.perf_counter() - t0
        r = httpx.post(f"{base}/v2/models/resnet50/infer", content=body, timeout=600,
                       headers={"content-type": "application/json"})
        first = time.perf_counter() - t0
        r.raise_for_status()
        err = float(np.abs(np.asarray(r.json()["outputs"][0]["data"]) - want).max())
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(120)
    return {"ready_s": ready, "first_response_s": first, "max_abs_err_vs_torch": err}


def _executable_roundtrip(art: str) -> dict:
    """The PJRT CPU executable of the artifact's serving signature, compiled in this process, serialized to bytes
    and deserialized again: compile and load times, its size, and whether the loaded one computes the same (random
    inputs for every argument, weights included)."""
    import jax
    import numpy as np
    from jax._src.lib import xla_client as xc

    from tpu_export.tpu_backend.artifact.load import read_artifact

    exported = read_artifact(os.path.join(art, "model.tpuexp")).signatures["serving_default"].exported
    avals = exported.in_avals
    args, kwargs = jax.tree_util.tree_unflatten(exported.in_tree,
                                                [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in avals])
    t0 = time.perf_counter()
    compiled = jax.jit(exported.call).lower(*args, **kwargs).compile()
    compile_s = time.perf_counter() - t0
    raw = bytes(compiled.runtime_executable().serialize())
    dev = jax.devices()[0]
    t0 = time.perf_counter()
    loaded = dev.client.deserialize_executable(raw, xc.DeviceList((dev,)))
    load_s = time.perf_counter() - t0
    rng = np.random.default_rng(0)
    flat = [jax.device_put(rng.standard_normal(a.shape).astype(a.dtype)) for a in avals]
    args, kwargs = jax.tree_util.tree_unflatten(exported.in_tree, flat)
    want = np.asarray(jax.tree_util.tree_leaves(compiled(*args, **kwargs))[0])
    got = np.asarray(loaded.execute_sharded(flat).disassemble_into_single_device_arrays()[0][0])
    return {"compile_s": compile_s, "deserialize_s": load_s, "executable_mb": len(raw) / 2**20,
            "same_output": bool(np.array_equal(got, want)), "platform": dev.platform, "jax": jax.__version__}


def main_cold_start(a) -> int:
    """Cold start of `tpu-export serve` (process start to first response) compiling the StableHLO (JIT) against
    loading serialized PJRT CPU executables (jax's persistent compilation cache, filled by one priming run)."""
    import numpy as np
    import torch

    import tpu_export
    from bench.real_models import build_real

    model, _ = build_real("resnet50")
    work = tempfile.mkdtemp(prefix="serve-cold-")
    tpu_export.convert(model, (torch.zeros(1, 3, 224, 224),), targets={"tpu-v6e": {"aot": False}},
                       out_dir=os.path.join(work, "out"))
    art = os.path.join(work, "out", "tpu-v6e")
    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
    with torch.no_grad():
        want = model(torch.from_numpy(x)).numpy().ravel()
    body = json.dumps({"inputs": [{"name": "x", "shape": [1, 3, 224, 224], "datatype": "FP32",
                                   "data": x.ravel().tolist()}]}).encode()
    base_env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_COMPILATION_CACHE",
                                                                         "JAX_PERSISTENT_CACHE"))}
    cache = os.path.join(work, "jax-cache")
    envs = {"jit": {**base_env, "JAX_ENABLE_COMPILATION_CACHE": "false"},
            "aot": {**base_env, "JAX_COMPILATION_CACHE_DIR": cache, "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
                    "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"}}
    prime = _cold_start_once(art, envs["aot"], body, want)  # compiles and writes the executables
    entries = sorted(os.listdir(cache))
    cache_mb = sum(os.path.getsize(os.path.join(cache, e)) for e in entries) / 2**20
    print(json.dumps({"prime": prime, "cache_entries": len(entries), "cache_mb": cache_mb}), flush=True)
    runs = []
    for i in range(a.cold_runs):
        for mode in (("jit", "aot") if i % 2 == 0 else ("aot", "jit")):  # alternated: drift in load hits both
            row = {"mode": mode, "round": i, **_cold_start_once(art, envs[mode], body, want),
                   "loadavg": os.getloadavg()[0]}
            runs.append(row)
            print(json.dumps(row), flush=True)
    assert sorted(os.listdir(cache)) == entries, "a cached run compiled something new"
    summary = {m: {k: statistics.median(r[k] for r in runs if r["mode"] == m) for k in ("ready_s", "first_response_s")}
               for m in ("jit", "aot")}
    roundtrip = _executable_roundtrip(art)
    print(json.dumps({"summary": summary, "roundtrip": roundtrip}), flush=True)
    result = {}
    if os.path.exists(a.out):
        with open(a.out) as f:
            result = json.load(f)
    result["cold_start"] = {
        "command": " ".join(["bench/serve.py", *sys.argv[1:]]),
        "model": "resnet50 (25.6M params, random weights), batch 1, 224x224, tpu-v6e artifact without TPU AOT",
        "jit": "the artifact's StableHLO compiled by PJRT CPU when the server starts (what serve does today)",
        "aot": "serialized PJRT CPU executables loaded from jax's persistent compilation cache, filled by one "
               "priming run (an artifact carries TPU executables only; none for the CPU)",
        "cache_entries": len(entries), "cache_mb": cache_mb, "prime": prime, "median": summary,
        "speedup_first_response": summary["jit"]["first_response_s"] / summary["aot"]["first_response_s"],
        "executable_roundtrip": roundtrip,
        "host": {"platform": platform.platform(), "cpus": os.cpu_count(), "loadavg_at_end": os.getloadavg(),
                 "python": platform.python_version()},
        "runs": runs}
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
    ap.add_argument("--lm-target", default="cpu-xla", choices=["cpu-xla", "tpu-v6e", "cuda"],
                    help="LM: the artifact's target (cpu-xla: the one for the CPU it is served on here)")
    ap.add_argument("--new-tokens", type=int, default=64, help="LM: new tokens per request")
    ap.add_argument("--lm-layers", type=int, default=12, help="LM: layers (12; fewer for a smoke run)")
    ap.add_argument("--lm-hidden", type=int, default=768, help="LM: hidden size (768; less for a smoke run)")
    ap.add_argument("--cold-start", action="store_true",
                    help="cold start: process start to first response, compiling (JIT) vs stored executables")
    ap.add_argument("--cold-runs", type=int, default=3, help="cold start: runs of each mode, alternated")
    a = ap.parse_args()
    if a.lm:
        return main_lm(a)
    if a.cold_start:
        return main_cold_start(a)

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
              "rows": rows, **{k: previous[k] for k in ("lm", "cold_start") if k in previous}}
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(result, f, indent=2)
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
