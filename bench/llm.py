"""LLMs on the edge: ours (`tpu-export convert-lm --target android`) against litert-torch 0.10.0's `export_hf`,
the same saved model directories, prefill 32, cache length and quantization, in the LiteRT-LM engine.

    .venv/bin/python bench/llm.py [--models llama,gemma3] [--big] [--quant float,dynamic_int8] [--cache 1024]
                                  [--threads 1] [--blocks 3] [--decode 64] [--keep DIR] [--ours-only] [--convert-only]
    .venv/bin/python bench/llm.py --render     # docs/llm_bench.md from bench/results/llm.json

Model directories (random weights, seeded, written by this script): a Llama-style ~110 M (vocab 32000, hidden 768,
10 layers, GQA 12/4 heads, untied) and a Gemma-3-style ~100 M (vocab 65536 tied and scaled, hidden 640, 10 layers,
4 heads / 1 KV head of 256, sliding window 512 on 5 of every 6 layers); --big (or --models llama1b) adds a
Llama-style 0.84 B (TinyLlama's widths: hidden 2048, intermediate 5632, 32 heads / 4 KV heads of 64, vocab 32000
untied; 16 layers where TinyLlama has 22: 3.3 GB of float32 weights). Their
tokenizer is a word-level `tokenizers` model with one word per id ("t0".."t<V-1>" beside <pad> <bos> <eos> <unk>),
so that any id a random model emits reads back from the engine's text exactly.

Per model and quantization, one conversion each in a fresh process (ours, then the peer's, in its own venv
.bench-venv-peer-lm, installed here on first use): wall time of the process and peak RSS of its whole process tree
(/proc polled every 50 ms, summed over descendants; and the converter process's own VmHWM, from wait4), bundle
size. --ours-only skips the peer's conversion and compares with its figures in the README; --convert-only stops
after the conversions. Then each bundle in the LiteRT-LM engine (litert_lm.Engine, CPU, --threads for both), each
run in a fresh process, ours and the peer's alternating in --blocks blocks (the machine is shared and noisy):
prefill ms of a 24-word prompt, decode ms per token (median of the intervals between streamed tokens), and the
greedy tokens, compared with transformers' generate(do_sample=False)
on the ids that engine fed (the peer's bundle makes the engine prepend <bos>; ours tokenizes as tokenizer.json).
A model for which convert-lm writes no .litertlm (LFM2: the engine carries only KV caches) runs its .tflite through
tpu_export.generate's loop on the LiteRT interpreter instead, marked so in the row (runtime "tflite loop"): not an
engine figure. A peer that refuses a model leaves its exception type and message in the row, one line, beside
ours' figures. Rows (with their date and command) merge into bench/results/llm.json; --render writes
docs/llm_bench.md from it.
Goals, ours/peer: conversion <= 1/3 the time, peak RSS <= 0.7x, decode ms/token <= 0.90x, size <= 1.01x; float
greedy agreement 100%.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PEER_VENV = os.path.join(ROOT, ".bench-venv-peer-lm")
PEER_RECIPES = {"float": "none", "dynamic_int8": "dynamic_wi8_afp32", "dynamic_int4_block32": "dynamic_wi4b32_afp32",
                "weight_only_int8": "weight_only_wi8_afp32"}
SPECIALS = ["<pad>", "<bos>", "<eos>", "<unk>"]
# --ours-only compares against the peer's conversions measured 2026-11-30 by this script (README table)
PEER_MEASURED = {
    ("llama", "float"): dict(wall_s=101.5, peak_rss_mb=3171, cpu_s=47.8, size_mb=428.5),
    ("llama", "dynamic_int8"): dict(wall_s=158.4, peak_rss_mb=3169, cpu_s=46.6, size_mb=110.5),
    ("gemma3", "float"): dict(wall_s=187.7, peak_rss_mb=2921, cpu_s=63.2, size_mb=374.1),
    ("gemma3", "dynamic_int8"): dict(wall_s=281.0, peak_rss_mb=2821, cpu_s=67.0, size_mb=97.7),
}
CONFIGS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", dict(
        vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=10, num_attention_heads=12,
        num_key_value_heads=4, max_position_embeddings=4096, tie_word_embeddings=False)),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(
        vocab_size=65536, hidden_size=640, intermediate_size=2048, num_hidden_layers=10, num_attention_heads=4,
        num_key_value_heads=1, head_dim=256, sliding_window=512, max_position_embeddings=4096,
        layer_types=["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(10)])),
    # DeepSeek-V3's layout at ~105 M: MLA (latent 256, rope key 32, 12 heads of 64+32 / V 64), 4 routed experts of 512
    # (top-2 in 2 groups, 1 group kept) plus a shared one, the first layer dense
    "deepseek_v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM", dict(
        vocab_size=32000, hidden_size=768, intermediate_size=2048, moe_intermediate_size=512, num_hidden_layers=8,
        num_attention_heads=12, num_key_value_heads=12, kv_lora_rank=256, q_lora_rank=384, qk_rope_head_dim=32,
        qk_nope_head_dim=64, v_head_dim=64, n_routed_experts=4, num_experts_per_tok=2, n_group=2, topk_group=1,
        n_shared_experts=1, first_k_dense_replace=1, max_position_embeddings=4096, tie_word_embeddings=False)),
    # LFM2's hybrid layout at ~118 M: short convolutions (L_cache 3) on 7 of 10 layers, GQA attention on the rest
    "lfm2": ("Lfm2Config", "Lfm2ForCausalLM", dict(
        vocab_size=32000, hidden_size=768, intermediate_size=3072, num_hidden_layers=10, num_attention_heads=12,
        num_key_value_heads=4, conv_L_cache=3, max_position_embeddings=4096, tie_word_embeddings=False,
        layer_types=["conv", "conv", "full_attention"] * 3 + ["conv"])),
    "tiny": ("LlamaConfig", "LlamaForCausalLM", dict(  # a smoke test of this script, seconds
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=1024, tie_word_embeddings=False)),
    "llama1b": ("LlamaConfig", "LlamaForCausalLM", dict(
        vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=16, num_attention_heads=32,
        num_key_value_heads=4, max_position_embeddings=4096, tie_word_embeddings=False)),
}


def ensure_peer() -> str:
    py = os.path.join(PEER_VENV, "bin", "python")
    if not os.path.exists(py):
        subprocess.run([sys.executable, "-m", "venv", PEER_VENV], check=True)
    # -P: from the checkout, `import litert_torch` would find the repository's own litert_torch/ folder
    r = subprocess.run([py, "-P", "-c", "import litert_torch, tensorflow, importlib.metadata as m; "
                        "print(m.version('litert-torch'))"], capture_output=True, text=True)
    if r.returncode != 0 or not r.stdout.strip().startswith("0.10.0"):
        # torch pinned to the local CPU wheel (an unpinned one pulls CUDA); export_hf imports TensorFlow undeclared
        subprocess.run([py, "-m", "pip", "install", "-q", "torch==2.13.0", "litert-torch==0.10.0",
                        "tensorflow-cpu==2.21.0"], check=True)
    return py


def save_model_dir(name: str, path: str) -> str:
    """A seeded random-init model directory with a word-level tokenizer covering every id."""
    import torch
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    if os.path.exists(os.path.join(path, "config.json")):
        return path
    cfg_cls, model_cls, kw = CONFIGS[name]
    ids = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2)
    cfg = getattr(transformers, cfg_cls)(**kw, **ids)
    torch.manual_seed(0)
    model = getattr(transformers, model_cls)(cfg).eval()
    model.generation_config = transformers.GenerationConfig(**ids)
    model.save_pretrained(path, safe_serialization=True)
    vocab = {t: i for i, t in enumerate(SPECIALS)}
    vocab.update({f"t{i}": i for i in range(len(SPECIALS), cfg.vocab_size)})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<bos>",
                                                eos_token="<eos>", unk_token="<unk>")
    fast.save_pretrained(path)
    return path


class TreeRss:
    """Peak resident memory of a process and all its descendants, summed, polled from /proc; past ``limit_mb`` the
    tree is killed (``over`` set): on a shared host a peer conversion may not take the memory others run in."""

    def __init__(self, pid: int, every: float = 0.05, limit_mb: float | None = None):
        self.pid, self.every, self.peak, self._stop = pid, every, 0, threading.Event()
        self.limit, self.over = (limit_mb or 0) * 2**20, False
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _tree(self) -> list[int]:
        from _tree_rss import descendants

        return descendants(self.pid)

    def _run(self):
        page = os.sysconf("SC_PAGE_SIZE")
        while not self._stop.is_set():
            total, tree = 0, self._tree()
            for p in tree:
                try:
                    with open(f"/proc/{p}/statm") as f:
                        total += int(f.read().split()[1]) * page
                except (OSError, IndexError, ValueError):
                    pass
            self.peak = max(self.peak, total)
            if self.limit and total > self.limit and not self.over:
                self.over = True
                for p in reversed(tree):  # the processes this bench started, by pid
                    try:
                        os.kill(p, signal.SIGKILL)
                    except OSError:
                        pass
            self._stop.wait(self.every)

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return self.peak / 2**20


def run_measured(cmd, env=None, timeout=3600, rss_limit_mb=None) -> dict:
    """Run ``cmd``; wall and CPU time, peak RSS (the tree's, polled; and the process's own VmHWM), its JSON line."""
    env = dict(os.environ, PYTHONWARNINGS="ignore", TF_CPP_MIN_LOG_LEVEL="3", **(env or {}))
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    rss = TreeRss(p.pid, limit_mb=rss_limit_mb)
    streams = {}
    readers = [threading.Thread(target=lambda k=k, f=f: streams.__setitem__(k, f.read()))
               for k, f in (("out", p.stdout), ("err", p.stderr))]
    for r in readers:
        r.start()
    killer = threading.Timer(timeout, p.kill)
    killer.start()
    # wait4 gives this child's own rusage: CPU time (user + sys; on a shared host the wall time is mostly waiting
    # for a core, the CPU time is the work) and ru_maxrss, its VmHWM at exit (the kernel's peak, which a 50 ms
    # poll can miss); setting returncode keeps Popen from waiting on the reaped pid again
    _, status, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    killer.cancel()
    wall = time.perf_counter() - t0
    for r in readers:
        r.join()
    out, err = streams.get("out", ""), streams.get("err", "")
    info = {"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime, "peak_rss_mb": rss.stop(),
            "vmhwm_mb": usage.ru_maxrss / 1024, "rc": p.returncode}
    if rss.over:
        info["error"] = f"stopped: its process tree passed {rss_limit_mb:.0f} MB resident (--rss-limit-mb)"
    elif p.returncode < 0:
        info["error"] = f"killed by signal {-p.returncode} after {wall:.0f} s (out of memory, or stopped by hand)"
    elif p.returncode != 0:
        info["error"] = (err.strip().splitlines() or ["?"])[-1][:300]
    for line in reversed(out.strip().splitlines()):
        if line.startswith("{"):
            info.update(json.loads(line))
            break
    return info


def convert(impl: str, peer_py: str, model_dir: str, out: str, quant: str, cache: int, rss_limit_mb=None) -> dict:
    if impl == "ours":
        cmd = [os.path.join(os.path.dirname(sys.executable), "tpu-export"), "convert-lm", model_dir, "--target",
               "android", "--prefill", "32", "--cache", str(cache), "-o", out]
        cmd += [] if quant == "float" else ["--quantize", quant]
        info = run_measured(cmd, rss_limit_mb=rss_limit_mb)
        info["bundle"] = os.path.join(out, "android", "model.litertlm")
        if "error" not in info:
            with open(os.path.join(out, "summary.json")) as f:
                summary = json.load(f)
            cache = summary.get("cache", {})
            info["cache_bytes_per_token"] = cache.get("bytes_per_token")
            info["plain_kv_bytes_per_token"] = cache.get("plain_kv_bytes_per_token")
            missing = summary["targets"]["android"].get("not_written", {}).get("model.litertlm")
            if missing:  # a family the engine cannot run: the .tflite's figures, no engine runs
                info["no_bundle"] = missing
                info["bundle"] = os.path.join(out, "android", "model.tflite")
    else:
        cmd = [peer_py, os.path.join(ROOT, "bench", "_llm_peer_worker.py"), model_dir, out, "32", str(cache),
               PEER_RECIPES[quant]]
        # transformers' hub kernels (its `kernels` package) break the peer's patched Gemma 3 import; not used here
        info = run_measured(cmd, env={**os.environ, "USE_HUB_KERNELS": "0"}, rss_limit_mb=rss_limit_mb)
        if "error" in info:
            info.pop("bundle", None)
        else:
            info.setdefault("bundle", os.path.join(out, "model.litertlm"))
    if "error" not in info:
        info["size_mb"] = os.path.getsize(info["bundle"]) / 2**20
        if info.pop("no_bundle", None) is not None:
            # the .tflite is what runs: tpu_export.generate's loop on the LiteRT interpreter, not the engine
            info["note"] = "no .litertlm (the engine carries only KV caches): size of the .tflite"
        for folder, _, files in os.walk(out):  # only the bundle runs: a 0.84 B float .tflite is 3.3 GB of disk
            for f in files:
                if f.endswith(".tflite") and os.path.join(folder, f) != info["bundle"]:
                    os.remove(os.path.join(folder, f))
    return info


def engine_worker(bundle: str, prompt: str, threads: int, decode: int):
    """In a fresh process: load the bundle, prefill the prompt, decode `decode` greedy tokens; one JSON line with the
    engine's own timings (its benchmark info: the prefill's and the decode's tokens/s; streamed chunks carry several
    tokens each, so their arrival times do not time a step) and the text."""
    import litert_lm

    litert_lm.set_min_log_severity(litert_lm.LogSeverity.ERROR)
    t0 = time.perf_counter()
    eng = litert_lm.Engine(bundle, backend=litert_lm.Backend.CPU(thread_count=threads), enable_benchmark=True)
    s = eng.create_session(apply_prompt_template=False, max_output_tokens=decode,
                           sampler_config=litert_lm.SamplerConfig(top_k=1, temperature=0.0))
    t1 = time.perf_counter()
    s.run_prefill([prompt])
    t2, c2 = time.perf_counter(), time.process_time()
    text = s.run_decode().texts[0]
    t3, c3 = time.perf_counter(), time.process_time()
    info = s.get_benchmark_info()
    print(json.dumps({
        "init_s": t1 - t0, "prefill_ms": 1e3 * info.last_prefill_token_count / info.last_prefill_tokens_per_second,
        "prefill_tokens": info.last_prefill_token_count, "decode_ms": 1e3 / info.last_decode_tokens_per_second,
        "decode_tokens": info.last_decode_token_count, "prefill_wall_ms": (t2 - t1) * 1e3,
        # the process's CPU time (all its threads): unlike wall time, not the time other processes held the core
        "decode_cpu_ms": (c3 - c2) * 1e3 / max(info.last_decode_token_count, 1),
        "decode_wall_ms_per_token": (t3 - t2) * 1e3 / max(len(ids_of(text)), 1), "text": text,
        "prompt_ids": eng.tokenize(prompt), "bos": eng.bos_token_id}))
    s.close()
    eng.close()


def loop_worker(model: str, prompt: str, decode: int):
    """In a fresh process: our .tflite through tpu_export.generate's loop (LoopGenerator: the LiteRT interpreter,
    XNNPACK, with lm.json's caches and states), for a model the engine cannot run. Greedy, `decode` tokens after a
    warm-up call of each signature; one JSON line with the loop's own prefill and decode timings and the tokens."""
    from tpu_export.generators import LoopGenerator

    t0 = time.perf_counter()
    gen = LoopGenerator.from_artifact(model)
    t1 = time.perf_counter()
    c1 = time.process_time()
    res = gen.generate(prompt, decode)
    cpu = time.process_time() - c1
    steps = max(res.new_tokens - 1, 1)  # the first new token comes from the prefill step's decode call
    print(json.dumps({
        "runtime": "tflite loop", "init_s": t1 - t0, "prefill_ms": res.prefill_ms, "prefill_tokens": res.prompt_tokens,
        "decode_ms": 1e3 / res.decode_tokens_per_s if res.decode_tokens_per_s else None,
        "decode_tokens": res.new_tokens, "prefill_wall_ms": res.prefill_ms,
        # the process's CPU time over the whole call (warm-up, prefill, decode) per decode step: an upper bound
        "cpu_ms_per_step_all": cpu * 1e3 / steps, "decode_wall_ms_per_token": 1e3 / res.decode_tokens_per_s
        if res.decode_tokens_per_s else None, "warm_up_ms": res.warm_up_ms, "tokens": res.tokens,
        "prompt_ids": gen.encode(prompt), "bos": None}))


def ids_of(text: str) -> list[int]:
    words = {w: i for i, w in enumerate(SPECIALS)}
    found = re.finditer(r"t(\d+)|<pad>|<bos>|<eos>|<unk>", text)
    return [int(m.group(1)) if m.group(1) else words[m.group(0)] for m in found]


def agreement(model_dir: str, runs: dict, n: int) -> dict:
    """Per impl: tokens (of the first n) equal to transformers' greedy continuation of the ids its engine fed."""
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir).eval()
    out = {}
    for impl, r in runs.items():
        fed = ([r["bos"]] if r.get("bos") is not None else []) + r["prompt_ids"]
        with torch.no_grad():
            want = model.generate(torch.tensor([fed]), max_new_tokens=n, do_sample=False)[0, len(fed):].tolist()
        got = (r["tokens"] if r.get("tokens") is not None else ids_of(r["text"]))[:n]
        out[impl] = sum(a == b for a, b in zip(got, want)) / n
    return out


def engine_runs(bundles: dict, prompt: str, threads: int, decode: int, blocks: int) -> dict:
    """{impl: run}: a first (cold) load each, then `blocks` alternating fresh-process runs; medians of those."""
    def once(bundle):
        from llm_decode_ab import evict

        evict(bundle)  # read fresh each run: the page cache's 2 MiB mappings of the XNNPACK cache move decode 10-20%
        worker = "--loop-worker" if bundle.endswith(".tflite") else "--engine-worker"
        return run_measured([sys.executable, os.path.abspath(__file__), worker, bundle, "--prompt", prompt,
                             "--threads", str(threads), "--decode", str(decode)], timeout=1800)

    runs = {impl: [] for impl in bundles}
    cold = {impl: once(b) for impl, b in bundles.items()}  # writes the engine's xnnpack weight cache
    for _ in range(blocks):
        for impl, b in bundles.items():
            runs[impl].append(once(b))
    out = {}
    for impl, rs in runs.items():
        ok = [r for r in rs if "error" not in r and r.get("decode_ms") is not None]
        if not ok:
            out[impl] = {"error": (rs or [cold[impl]])[0].get("error", "no decode timing")}
            continue
        keys = ("prefill_ms", "prefill_wall_ms", "decode_ms", "decode_wall_ms_per_token", "init_s", "peak_rss_mb")
        out[impl] = {**ok[0], "cold_init_s": cold[impl].get("init_s"), "runs": len(ok),
                     **{k: statistics.median(r[k] for r in ok) for k in keys},
                     "decode_ms_each": [r["decode_ms"] for r in ok], "prefill_ms_each": [r["prefill_ms"] for r in ok]}
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="llama,gemma3")
    ap.add_argument("--big", action="store_true", help="add the 0.84 B Llama (llama1b)")
    ap.add_argument("--quant", default="float,dynamic_int8", help=f"of {', '.join(PEER_RECIPES)}")
    ap.add_argument("--cache", type=int, default=1024)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--blocks", type=int, default=3)
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--keep", help="work folder to keep (model directories are reused from it)")
    ap.add_argument("--ours-only", action="store_true",
                    help="convert ours only; the peer's conversion figures are the README's (llama, gemma3)")
    ap.add_argument("--rss-limit-mb", type=float,
                    help="kill a conversion whose process tree passes this resident size (a shared host)")
    ap.add_argument("--convert-only", action="store_true",
                    help="conversions only (time, RSS, size): no engine runs, no agreement")
    ap.add_argument("--report", help="print the table of a results.json written by an earlier run")
    ap.add_argument("--render", action="store_true",
                    help="only rewrite docs/llm_bench.md from bench/results/llm.json (bench/_llm_page.py)")
    ap.add_argument("--engine-worker", help=argparse.SUPPRESS)
    ap.add_argument("--loop-worker", help=argparse.SUPPRESS)
    ap.add_argument("--prompt", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.engine_worker:
        return engine_worker(a.engine_worker, a.prompt, a.threads, a.decode)
    if a.loop_worker:
        return loop_worker(a.loop_worker, a.prompt, a.decode)
    if a.report:
        with open(a.report) as f:
            return report(json.load(f), a)
    if a.render:
        return _render()
    import random

    peer_py = None if a.ours_only else ensure_peer()
    work = a.keep or tempfile.mkdtemp(prefix="bench-llm-")
    os.makedirs(work, exist_ok=True)
    models = a.models.split(",") + (["llama1b"] if a.big else [])
    rng = random.Random(0)
    rows = []
    for name in models:
        model_dir = save_model_dir(name, os.path.join(work, name))
        vocab = CONFIGS[name][2]["vocab_size"]
        prompt = " ".join(f"t{rng.randrange(len(SPECIALS), vocab)}" for _ in range(24))
        for quant in a.quant.split(","):
            row = {"model": name, "quant": quant}
            if a.ours_only:
                measured = PEER_MEASURED.get((name, quant))
                row["peer"] = {**measured, "readme": True} if measured else {"error": "not run (--ours-only)"}
            for impl in ("ours",) if a.ours_only else ("ours", "peer"):
                out = os.path.join(work, f"{name}.{quant}.{impl}")
                subprocess.run(["rm", "-rf", out], check=True)
                row[impl] = convert(impl, peer_py, model_dir, out, quant, a.cache, a.rss_limit_mb)
                print(f"{name} {quant} {impl}: {json.dumps(row[impl])}", file=sys.stderr, flush=True)
            if a.convert_only:
                rows.append(row)
                continue
            bundles = {impl: row[impl]["bundle"] for impl in ("ours", "peer")
                       if "error" not in row[impl] and "bundle" in row[impl]}
            for impl, r in engine_runs(bundles, prompt, a.threads, a.decode, a.blocks).items():
                row[impl]["engine"] = r
            ran = {impl: row[impl]["engine"] for impl in bundles if "error" not in row[impl].get("engine", {})}
            for impl, agree in agreement(model_dir, ran, min(32, a.decode)).items():
                row[impl]["agree"] = agree
            print(json.dumps(row), file=sys.stderr, flush=True)
            rows.append(row)
    with open(os.path.join(work, "results.json"), "w") as f:
        json.dump(rows, f, indent=1)
    _merge_results(rows)
    _render()
    report(rows, a)


RESULTS = os.path.join(ROOT, "bench", "results", "llm.json")


def _merge_results(rows) -> None:
    """bench/results/llm.json: this run's rows replace the same (model, quant) of earlier runs."""
    old = []
    if os.path.exists(RESULTS):
        with open(RESULTS) as f:
            old = json.load(f)["rows"]
    keep = [r for r in old if (r["model"], r["quant"]) not in {(n["model"], n["quant"]) for n in rows}]
    # each row names the run that measured it: rows of several runs live side by side in the file
    run = {"date": time.strftime("%Y-%m-%d"), "command": " ".join(["bench/llm.py"] + sys.argv[1:]),
           "host": {"cpus": os.cpu_count(), "versions": _versions()}}
    slim = [{**r, **run} for r in rows]
    for r in slim:
        for impl in ("ours", "peer"):
            if isinstance(r.get(impl), dict) and isinstance(r[impl].get("engine"), dict):
                r[impl]["engine"] = {k: v for k, v in r[impl]["engine"].items()
                                     if k not in ("text", "prompt_ids", "tokens")}
    with open(RESULTS + ".tmp", "w") as f:
        json.dump({"rows": keep + slim}, f, indent=1)
    os.replace(RESULTS + ".tmp", RESULTS)


def _render() -> None:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import _llm_page

    _llm_page.render(_llm_page.load_results())


def _versions() -> dict:
    from importlib import metadata

    out = {}
    for dist in ("torch", "transformers", "ai-edge-litert", "litert-lm-api"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    py = os.path.join(PEER_VENV, "bin", "python")
    if os.path.exists(py):
        r = subprocess.run([py, "-c", "import importlib.metadata as m; print(m.version('litert-torch'))"],
                           capture_output=True, text=True)
        if r.returncode == 0:
            out["litert-torch (peer)"] = r.stdout.strip()
    return out


def report(rows, a):
    nan = float("nan")

    def pair(o, p, fmt, width):
        return f"{format(o, fmt)}/{format(p, fmt):<{width}s}"

    def ratio(o, p, fmt="5.2f"):
        return format(o / p if p else nan, fmt)

    print(f"cache {a.cache}, prefill 32, engine CPU threads {a.threads}, {a.blocks} runs each, "
          f"decode {a.decode} tokens")
    print(f"{'model':8s} {'quant':13s} {'conv s ours/peer':>17s} {'x faster':>8s} {'rss MB ours/peer':>17s} "
          f"{'ratio':>5s} {'hwm MB ours':>11s} {'cpu s ours/peer':>17s} {'x less':>6s} "
          f"{'MB ours/peer':>15s} {'ratio':>5s} {'prefill ms':>13s} {'prefill wall':>13s} "
          f"{'decode ms/tok':>15s} {'ratio':>5s} "
          f"{'agree ours/peer':>15s}")
    for r in rows:
        o, p = r["ours"], r["peer"]
        if "error" in o:
            print(f"{r['model']:8s} {r['quant']:13s} ours: {o['error']}  peer: {p.get('error', 'ok')}")
            continue
        if "error" in p:  # ours alone (the peer failed or was not run)
            p = {"wall_s": nan, "peak_rss_mb": nan, "cpu_s": nan, "size_mb": nan, "note": p["error"]}
        oe, pe = o.get("engine", {}), p.get("engine", {})
        dec = (f"{oe['decode_ms']:6.2f}/{pe['decode_ms']:<6.2f} {oe['decode_ms'] / pe['decode_ms']:5.2f}"
               if "decode_ms" in oe and "decode_ms" in pe
               else f"ours {oe.get('error', '-')} peer {pe.get('error', '-')}")
        pre = f"{oe.get('prefill_ms', nan):6.1f}/{pe.get('prefill_ms', nan):<6.1f}"
        pre_wall = f"{oe.get('prefill_wall_ms', nan):6.1f}/{pe.get('prefill_wall_ms', nan):<6.1f}"
        print(f"{r['model']:8s} {r['quant']:13s} {pair(o['wall_s'], p['wall_s'], '8.1f', 8)} "
              f"{ratio(p['wall_s'], o['wall_s'], '8.2f')} "
              f"{pair(o['peak_rss_mb'], p['peak_rss_mb'], '8.0f', 8)} {ratio(o['peak_rss_mb'], p['peak_rss_mb'])} "
              f"{o.get('vmhwm_mb', nan):11.0f} "
              f"{pair(o['cpu_s'], p['cpu_s'], '8.1f', 8)} {ratio(p['cpu_s'], o['cpu_s'], '6.2f')} "
              f"{pair(o['size_mb'], p['size_mb'], '7.1f', 7)} {ratio(o['size_mb'], p['size_mb'], '5.3f')} "
              f"{pre:>13s} {pre_wall:>13s} {dec:>21s} "
              f"{o.get('agree', nan):7.2f}/{p.get('agree', nan):<7.2f}{'  (peer: README)' if p.get('readme') else ''}"
              f"{'  (peer: ' + p['note'] + ')' if p.get('note') else ''}")
    print("goals ours/peer: x faster >= 3, rss ratio <= 0.7, size ratio <= 1.01, decode ratio <= 0.90, "
          "float agree 1.00")


if __name__ == "__main__":
    main()
