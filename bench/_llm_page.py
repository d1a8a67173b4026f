"""docs/llm_bench.md, rendered from bench/results/llm.json (bench/llm.py --render; tests/test_llm_bench_page.py
checks the page is current): a summary line and a table per model x quantization, ours against the peer, with the
goals. Kept out of bench/llm.py, which measures."""

from __future__ import annotations

import json
import os

from llm import CONFIGS, PEER_RECIPES, RESULTS, ROOT

PAGE = os.path.join(ROOT, "docs", "llm_bench.md")
PEER_NAME = "litert-torch 0.10.0"
# (figure, goal on ours / peer, the goal's words); None: reported, no goal
GOALS = {"wall_s": (1 / 3, "<= 1/3"), "cpu_s": (1 / 3, "<= 1/3"), "peak_rss_mb": (0.7, "<= 0.70"),
         "size_mb": (1.01, "<= 1.01"), "decode_ms": (0.9, "<= 0.90")}
DESCRIPTIONS = {
    "llama": "Llama-style ~110 M: vocab 32000 untied, hidden 768, 10 layers, GQA 12 / 4 heads of 64",
    "gemma3": "Gemma-3-style ~100 M: vocab 65536 tied, hidden 640, 10 layers, 4 heads / 1 KV head of 256, sliding "
              "window 512 on 5 of every 6 layers",
    "deepseek_v3": "DeepSeek-V3-style ~110 M: multi-head latent attention (latent 256, rope key 32, 12 heads of "
                   "64 + 32, V 64), 4 routed experts of 512 (top-2) and a shared one, 8 layers, the first dense",
    "lfm2": "LFM2-style ~118 M hybrid: short convolutions (L_cache 3) on 7 of 10 layers, GQA 12 / 4 heads of 64 "
            "on the other 3",
    "tiny": "a 2-layer Llama-style smoke test of the script",
    "llama1b": "Llama-style 0.84 B: TinyLlama's widths (hidden 2048, 32 / 4 heads of 64), 16 layers",
}


def _num(v, digits: int) -> str:
    return "—" if v is None else f"{v:,.{digits}f}"


def _engine_of(side: dict) -> dict:
    e = side.get("engine") if isinstance(side, dict) else None
    return e if isinstance(e, dict) and "error" not in e else {}


def _runtime(side: dict) -> str | None:
    e = _engine_of(side)
    return (e.get("runtime") or "engine") if e else None


def _figures(side: dict) -> dict:
    """The figures a row compares, None where not measured."""
    if not isinstance(side, dict) or "error" in side:
        return {}
    e = _engine_of(side)
    return {"wall_s": side.get("wall_s"), "cpu_s": side.get("cpu_s"), "peak_rss_mb": side.get("peak_rss_mb"),
            "size_mb": side.get("size_mb"), "prefill_ms": e.get("prefill_ms"), "decode_ms": e.get("decode_ms"),
            "agree": side.get("agree")}


def _row_table(r: dict) -> list[str]:
    o, p = r.get("ours", {}), r.get("peer", {})
    fo, fp = _figures(o), _figures(p)
    same_runtime = _runtime(o) is not None and _runtime(o) == _runtime(p)
    lines = [f"| {r['model']} {r['quant']} | ours | {PEER_NAME} | ours / peer | goal | met |",
             "|---|---|---|---|---|---|"]
    names = {"wall_s": ("conversion wall s", 1), "cpu_s": ("conversion CPU s (user + sys)", 1),
             "peak_rss_mb": ("conversion peak RSS MB (process tree)", 0), "size_mb": ("bundle MB", 1),
             "prefill_ms": ("prefill ms (24-token prompt)", 1), "decode_ms": ("decode ms / token", 2),
             "agree": ("greedy tokens equal to transformers' generate (of 32)", 2)}
    for key, (label, digits) in names.items():
        ov, pv = fo.get(key), fp.get(key)
        # agreement is each side's against transformers, not a quantity to divide
        comparable = key != "agree" and (key not in ("prefill_ms", "decode_ms") or same_runtime)
        ratio = ov / pv if comparable and ov is not None and pv else None
        goal, words = GOALS.get(key, (None, ""))
        if key == "agree" and r["quant"] == "float":
            words = "1.00 both"
            met = "" if ov is None else ("yes" if ov == 1 and pv in (1, None) else "no")
        else:
            met = "" if goal is None or ratio is None else ("yes" if ratio <= goal else "no")
        if key in ("prefill_ms", "decode_ms") and _runtime(o) == "tflite loop":
            label += " ¹"
        lines.append(f"| {label} | {_num(ov, digits)} | {_num(pv, digits)} | "
                     f"{'—' if ratio is None else f'{ratio:.2f}'} | {words} | {met} |")
    return lines


def _row_notes(r: dict) -> list[str]:
    o, p = r.get("ours", {}), r.get("peer", {})
    notes = []
    if "error" in o:
        notes.append(f"- Ours failed: {o['error']}")
    if isinstance(p, dict) and "error" in p:
        notes.append(f"- {PEER_NAME}: {p['error']}" if p["error"].startswith("not run") else
                     f"- {PEER_NAME} failed to convert: `{p['error']}`")
    if isinstance(p, dict) and p.get("readme"):
        notes.append(f"- {PEER_NAME}'s conversion figures are from an earlier run of this script (its engine "
                     "figures were not rerun).")
    for impl, side in (("ours", o), ("peer", p)):
        e = side.get("engine") if isinstance(side, dict) else None
        if isinstance(e, dict) and "error" in e:
            notes.append(f"- {impl}: the engine run failed: {e['error']}")
    if _runtime(o) == "tflite loop":
        notes.append("- ¹ No engine run for ours: the LiteRT-LM engine carries only KV caches between calls, so "
                     "convert-lm writes no .litertlm for this model. Its prefill and decode figures are our .tflite "
                     "run by `tpu_export.generate`'s loop on the LiteRT interpreter (XNNPACK, its default "
                     "threads); the bundle size is the .tflite's. They are not comparable with an engine figure, "
                     "so no ratio is given.")
    cache, plain = o.get("cache_bytes_per_token"), o.get("plain_kv_bytes_per_token")
    if cache and plain:
        notes.append(f"- Cache per token (float32, all layers): {cache:,} bytes of latent and rope key, "
                     f"{cache / plain:.2f}x the {plain:,} bytes a plain K/V cache of the same heads holds.")
    elif cache:
        kw = CONFIGS.get(r["model"], (None, None, {}))[2]
        layers = kw.get("layer_types")
        if layers and "conv" in layers:
            n_conv, n_att = layers.count("conv"), len(layers) - layers.count("conv")
            notes.append(f"- Cache per token (float32): {cache:,} bytes, the K/V of the {n_att} attention layers; "
                         f"the {n_conv} convolution layers keep a fixed window of {kw['hidden_size']} x "
                         f"{kw['conv_L_cache'] - 1} values each, not per token.")
        else:
            notes.append(f"- Cache per token (float32, K and V of every layer): {cache:,} bytes.")
    return notes


def _ratio_cell(r: dict, key: str) -> str:
    o, p = r.get("ours", {}), r.get("peer", {})
    ov, pv = _figures(o).get(key), _figures(p).get(key)
    if key == "decode_ms" and (_runtime(o) is None or _runtime(o) != _runtime(p)):
        return "no engine run (ours)" if _runtime(o) == "tflite loop" else "—"
    return "—" if ov is None or not pv else f"{ov / pv:.2f}"


def _order(rows: list) -> list:
    models, quants = list(CONFIGS), list(PEER_RECIPES)
    return sorted(rows, key=lambda r: (models.index(r["model"]) if r["model"] in models else len(models),
                                       quants.index(r["quant"]) if r["quant"] in quants else len(quants)))


def render_page(results: dict) -> str:
    rows = _order(results.get("rows", []))
    lines = [
        "# LLMs on the edge against litert-torch's export_hf",
        "",
        "<!-- generated by bench/llm.py --render from bench/results/llm.json; do not edit -->",
        "",
        f"`tpu-export convert-lm --target android` against {PEER_NAME}'s `export_hf` (in its own venv), both",
        "converting the same seeded random-init model directory at prefill 32 and cache 1024, each conversion in a",
        "fresh process: wall and CPU time (user + sys), peak resident memory of its whole process tree, bundle size.",
        "Then each bundle in the LiteRT-LM engine (CPU, `--threads`: 1), a fresh process per run, ours and the peer's",
        "alternating, medians of the runs: prefill of a 24-token prompt, decode ms per token (the engine's own",
        "benchmark figures), and the first 32 greedy tokens against transformers' `generate(do_sample=False)` on the",
        "ids the engine fed. The host is a shared 2-core machine: conversion CPU time is the steadier figure, and",
        "decode ratios within 10-20% of 1 are inside its run-to-run spread.",
        "",
        "Goals, ours / peer: conversion time <= 1/3, peak RSS <= 0.70, bundle size <= 1.01, decode ms per token",
        "<= 0.90, float greedy agreement 1.00 on both sides.",
        "",
        "| model | quant | conversion wall, ours / peer | CPU | peak RSS | size | decode | agreement ours / peer "
        "| measured |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        fo, fp = _figures(r.get("ours", {})), _figures(r.get("peer", {}))
        cells = " | ".join(_ratio_cell(r, k) for k in ("wall_s", "cpu_s", "peak_rss_mb", "size_mb", "decode_ms"))
        agree = f"{_num(fo.get('agree'), 2)} / {_num(fp.get('agree'), 2)}"
        lines.append(f"| {r['model']} | {r['quant']} | {cells} | {agree} | {r.get('date', 'not recorded')} |")
    for r in rows:
        lines += ["", f"## {r['model']}, {r['quant']}", "", DESCRIPTIONS.get(r["model"], r["model"]) + ".", ""]
        if r.get("command"):
            host = r.get("host", {})
            versions = ", ".join(f"{k} {v}" for k, v in sorted(host.get("versions", {}).items()))
            lines += [f"Measured {r.get('date', '')} by `{r['command']}` on {host.get('cpus', '?')} CPUs"
                      + (f" ({versions})" if versions else "") + ".", ""]
        else:
            lines += ["Measured by an earlier version of bench/llm.py that recorded no command or date.", ""]
        lines += _row_table(r)
        notes = _row_notes(r)
        if notes:
            lines += [""] + notes
    lines += ["", "Rerun: `.venv/bin/python bench/llm.py --models MODELS --quant QUANTS` (rows replace the same model "
                  "and quant in bench/results/llm.json), then `.venv/bin/python bench/llm.py --render`.", ""]
    return "\n".join(lines)


def render(results: dict) -> None:
    with open(PAGE + ".tmp", "w", encoding="utf-8") as f:
        f.write(render_page(results))
    os.replace(PAGE + ".tmp", PAGE)


def load_results() -> dict:
    if not os.path.exists(RESULTS):
        return {"rows": []}
    with open(RESULTS, encoding="utf-8") as f:
        return json.load(f)
