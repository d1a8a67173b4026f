"""A .litertlm past 2 GB: convert-lm of a Llama-style model directory whose .tflite is in the large-model
form, then a few greedy decode steps in Google's LiteRT-LM engine, beside transformers' greedy tokens.

    .venv/bin/python bench/large_lm.py [--models llama0.6b] [--quant none|dynamic_int8|dynamic_int4_block32]

The models are bench/large.py's (random init, seeded, saved once under --work) plus llama0.6b (0.57 B float32,
2.28 GB: just past the flatbuffer's 2 GiB, with a 256-id vocabulary); the directory gets the tests' byte-level
tokenizer (256 ids) since a bundle needs one (with bench/large.py's 32000-id models most greedy tokens are ids the
tokenizer cannot print, so the text comparison says little there). Three fresh processes per model, one after the other:
convert (targets.lm.convert_lm to the android target, prefill 32, cache 256: wall time and peak RSS = VmHWM),
the engine (load, prefill, NEW decode steps: times and peak RSS) and transformers' greedy reply to the same
prompt (its text must be the engine's). Memory: the conversion stays under ~1 GiB (the directory is read into a
file-backed spool), the engine about the bundle's size, transformers' reference the float32 weights (skip it with
--no-reference for the 3B). Disk: the spool (float32 weights), the spill file of folded weights, the outputs and
the engine's XNNPACK cache beside the bundle (as large as a float bundle): ~4.5x the float32 weights at the peak.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench.large import CONFIGS, _peak_rss  # noqa: E402

# 0.57 B float32, 2.28 GB (2.12 GiB): past 2 GiB, so buffer offsets past 2**31 too. A 256-id vocabulary, the tests'
# byte-level tokenizer's: every greedy token prints, so the engine's text = transformers' tokens, compared.
CONFIGS.setdefault("llama0.6b", dict(vocab_size=256, hidden_size=1024, intermediate_size=4096, num_hidden_layers=34,
                                     num_attention_heads=16, num_key_value_heads=16))
# 0.97 B float32, 3.88 GB: TinyLlama's widths (GQA 32/4 heads) with the same 256-id vocabulary
CONFIGS.setdefault("llama1.0b_v256", dict(vocab_size=256, hidden_size=2048, intermediate_size=5632,
                                          num_hidden_layers=22, num_attention_heads=32, num_key_value_heads=4))
PROMPT = "the quick brown fox jumps over the lazy dog"
NEW = 8
CACHE = 256


def prepare(name: str, work: str) -> str:
    """The model directory with a tokenizer and an eos the bundle needs (the tests' tokenizer: ids < 256)."""
    from bench.large import ensure_model
    from tests.llm_models import SPECIAL, tiny_tokenizer

    folder = ensure_model(name, work)
    if not os.path.isfile(os.path.join(folder, "tokenizer.json")):
        import transformers

        tiny_tokenizer().save_pretrained(folder)
        ids = {k: i for k, (_, i) in SPECIAL.items()}
        transformers.GenerationConfig(bos_token_id=ids["bos"], eos_token_id=ids["eos"],
                                      pad_token_id=ids["pad"]).save_pretrained(folder)
    return folder


def convert(folder: str, out: str, quant: str) -> dict:
    from tpu_export.targets.lm import convert_lm

    t0 = time.perf_counter()
    lines = []

    def say(msg):
        lines.append(msg)
        print(f"[{time.perf_counter() - t0:7.1f}s] {msg}", file=sys.stderr, flush=True)

    written = convert_lm(folder, ["android"], out, prefill_lengths=(32,), cache_len=CACHE,
                         quantize=None if quant == "none" else quant, progress=say)["android"]
    dt = time.perf_counter() - t0
    tfl, bundle = written["model.tflite"], written["model.litertlm"]
    from tpu_export.edge.builder import schema
    from tpu_export.edge.tflite_check import map_tflite

    data = map_tflite(tfl)  # the tables only: the large form keeps no weight bytes inside them
    m = schema().Model.GetRootAs(data, 0)
    large = any(m.Buffers(i).Offset() > 1 for i in range(m.BuffersLength()))
    del m
    data.close()
    return {"convert_s": round(dt, 1), "convert_peak_rss_gb": round(_peak_rss() / 2**30, 2),
            "tflite_gb": round(os.path.getsize(tfl) / 2**30, 3),
            "litertlm_gb": round(os.path.getsize(bundle) / 2**30, 3),
            "large_form": large, "streamed": any("streamed" in m for m in lines)}


def engine(bundle: str) -> dict:
    import litert_lm

    t0 = time.perf_counter()
    eng = litert_lm.Engine(bundle, max_num_tokens=CACHE)
    session = eng.create_session(apply_prompt_template=False, sampler_config=litert_lm.SamplerConfig(top_k=1),
                                 max_output_tokens=NEW)
    t1 = time.perf_counter()
    session.run_prefill([PROMPT])
    t2 = time.perf_counter()
    text = session.run_decode().texts[0]
    t3 = time.perf_counter()
    return {"engine_load_s": round(t1 - t0, 1), "prefill_s": round(t2 - t1, 2), "decode_s": round(t3 - t2, 2),
            "engine_peak_rss_gb": round(_peak_rss() / 2**30, 2), "engine_text": text}


def reference(folder: str) -> dict:
    import torch
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(folder)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32).eval()
    ids = tok(PROMPT, return_tensors="pt").input_ids
    with torch.no_grad():
        new = model.generate(ids, do_sample=False, max_new_tokens=NEW)[0, ids.shape[1]:].tolist()
    eos = model.generation_config.eos_token_id
    if eos in new:  # the engine stops at the stop token and does not print it
        new = new[:new.index(eos)]
    return {"transformers_text": tok.decode(new, skip_special_tokens=False), "transformers_tokens": new}


def _run(step: str, *args) -> dict:
    env = dict(os.environ, PYTHONWARNINGS="ignore", TF_CPP_MIN_LOG_LEVEL="3")
    r = subprocess.run([sys.executable, os.path.abspath(__file__), "--step", step, *args], capture_output=True,
                       text=True, env=env)
    progress = [line for line in r.stderr.splitlines() if line.startswith("[")]
    if r.returncode != 0:
        return {f"{step}_error": (r.stderr.strip().splitlines() or ["?"])[-1], f"{step}_progress": progress[-5:]}
    out = json.loads(r.stdout.strip().splitlines()[-1])
    if progress:
        out[f"{step}_progress"] = progress
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="llama0.6b")
    ap.add_argument("--quant", default="none")
    ap.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "tpu-export-bench-large"))
    ap.add_argument("--no-reference", action="store_true",
                    help="skip transformers' reply (it loads the model in float32: 12 GB for the 3B)")
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    rows = []
    for name in a.models.split(","):
        subprocess.run([sys.executable, os.path.abspath(__file__), "--step", "prepare", name, a.work], check=True)
        folder = os.path.join(a.work, name)
        wbytes = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder) if f.endswith(".safetensors"))
        out = os.path.join(a.work, f"{name}-lm-{a.quant}")
        row = {"model": name, "quant": a.quant, "weights_gb": round(wbytes / 2**30, 2)}
        row.update(_run("convert", folder, out, a.quant))
        bundle = os.path.join(out, "android", "model.litertlm")
        if os.path.isfile(bundle):
            row.update(_run("engine", bundle))
            if not a.no_reference:
                row.update(_run("reference", folder))
                row["same_text"] = row.get("engine_text") == row.get("transformers_text")
        print(json.dumps(row, indent=1), flush=True)
        rows.append(row)
    record(rows)


def record(rows) -> None:
    """Append this run to bench/results/large_lm.json; a failed step is a cell naming its error."""
    from bench.render_pages import append_run

    keys = [("model", "model", None), ("quant", "quant", None), ("weights_gb", "weights GiB", ".2f"),
            ("convert_s", "convert s", ".1f"), ("convert_peak_rss_gb", "convert peak RSS GiB", ".2f"),
            ("x_weights", "x weights", ".2f"), ("litertlm_gb", ".litertlm GiB", ".2f"),
            ("large_form", ".tflite large form", None), ("engine_load_s", "engine load s", ".1f"),
            ("prefill_s", "prefill s", ".2f"), ("decode_s", "8 decode steps s", ".2f"),
            ("engine_peak_rss_gb", "engine peak RSS GiB", ".2f"), ("same_text", "engine text = transformers'", None),
            ("error", "failed", None)]
    table, xs = [], []
    for r in rows:
        row = {k: r.get(k) for k, _, _ in keys if k in r}
        if r.get("convert_peak_rss_gb") and r.get("weights_gb"):
            row["x_weights"] = r["convert_peak_rss_gb"] / r["weights_gb"]
            xs.append(row["x_weights"])
        for k in ("large_form", "same_text"):
            if k in row:
                row[k] = "yes" if row[k] else "no"
        errors = [f"{k}: {v}" for k, v in r.items() if k.endswith("_error")]
        if errors:
            row["error"] = "; ".join(errors)
        table.append(row)
    columns = [{"key": k, "label": label, **({"fmt": fmt} if fmt else {})} for k, label, fmt in keys]
    headline = (f"convert peak RSS {min(xs):.2f}-{max(xs):.2f}x the weights" if xs else "no conversion finished")
    append_run("large_lm", columns, table, headline)


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--step":
        step, args = sys.argv[2], sys.argv[3:]
        if step == "prepare":
            prepare(*args)
        else:
            print(json.dumps({"convert": convert, "engine": engine, "reference": reference}[step](*args)))
    else:
        main()
