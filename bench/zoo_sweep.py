"""Every architecture family of timm, and transformers' image, audio and text classification models, through both
outputs: one model per timm family (the family's smallest published model by parameter count, its default input
size, random weights) and per transformers model type (a small config: 2 layers, width 64, where it builds; else the
default config), each in a fresh process with a time limit. For each: torch eager
is the reference; ``tpu_export.convert(model, (x,), targets=["cpu", "cpu-xla"])`` captures once and writes the
.tflite (run in the LiteRT interpreter, XNNPACK) and the StableHLO artifact (run on PJRT CPU, the TPU path's
lowering); the rel err of each against eager, the conversion's seconds, or the first line of the error.

    .venv/bin/python bench/zoo_sweep.py [--set timm|hf|all] [--families a,b] [--timeout 600] [--resume]
                                        [--table-only]

Results: bench/results/zoo_sweep.json ({family: row}, rows of earlier runs kept unless rerun); the docs page
docs/zoo_sweep.md is generated from it (``--table-only`` regenerates the page alone).

timm's model code is pure Python; it and torchvision 0.28 (which timm imports, and whose C++ ops do not load beside
the CPU torch) install into a side folder on first use, not into the venv:

    .venv/bin/python -m pip install --no-deps --target .bench-venv-timm timm==1.0.31 torchvision==0.28.0 pillow

The worker declares torchvision's two ops (nms, qnms) as schemas only, so its import succeeds; no classification
model calls them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

SIDE = os.path.join(ROOT, ".bench-venv-timm")
TIMM = "1.0.31"
RESULTS = os.path.join(ROOT, "bench", "results", "zoo_sweep.json")
PAGE = os.path.join(ROOT, "docs", "zoo_sweep.md")
# A row is correct when both outputs are within this of torch eager (float32 through XNNPACK / XLA:CPU; max abs
# error over the output's max abs value)
TOL = 1e-3
# a reference output this small checks nothing (zeros against zeros): such a row is not counted as correct
VACUOUS = 1e-6


def _side_install():
    if not os.path.isdir(os.path.join(SIDE, "timm")):
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", SIDE,
                        f"timm=={TIMM}", "torchvision==0.28.0", "pillow"], check=True)


def _import_timm():
    import torch

    lib = torch.library.Library("torchvision", "DEF")  # schemas only, for torchvision's register_fake calls
    for op in ("nms", "qnms"):
        lib.define(f"{op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _import_timm.lib = lib  # the definitions live as long as the Library object
    sys.path.insert(0, SIDE)
    import timm

    return timm


def pick_models(families=None) -> dict:
    """{family (timm's module): its smallest published model by parameter count}, built on the meta device."""
    import torch

    timm = _import_timm()
    picked = {}
    for fam in timm.list_modules():
        if families and fam not in families:
            continue
        best = None
        for name in timm.list_models(module=fam):
            if name.startswith("test_"):  # timm's reduced-width test variants: not a published architecture
                continue
            try:
                with torch.device("meta"):
                    m = timm.create_model(name, pretrained=False)
            except Exception:  # noqa: BLE001 - a model that does not build on meta is skipped for the pick
                continue
            n = sum(p.numel() for p in m.parameters())
            if best is None or n < best[1]:
                best = (name, n)
        if best is not None:
            picked[fam] = {"model": best[0], "params": best[1]}
    return picked


# transformers: the classification heads over a vision, audio or text backbone (mapping -> the input it takes)
HF_MAPPINGS = {"MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES": "image",
               "MODEL_FOR_AUDIO_CLASSIFICATION_MAPPING_NAMES": "audio",
               "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES": "text"}
# a small config: these sizes where the config has them (lists of per-stage depths become ones)
_SMALL = {"num_hidden_layers": 2, "num_layers": 2, "hidden_size": 64, "num_attention_heads": 2,
          "num_key_value_heads": 2, "intermediate_size": 128, "encoder_layers": 2, "d_model": 64,
          "encoder_attention_heads": 2, "encoder_ffn_dim": 128}
# mixture-of-experts fields some defaults leave unset (DeepSeek-V2's config), which its forward then fails on
_SMALL_MOE = {"n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 64}


def hf_models() -> dict:
    """{"hf:<model_type>": {"model": class name, "kind": image/audio/text}} from transformers' auto mappings."""
    from transformers.models.auto import modeling_auto

    out = {}
    for mapping, kind in HF_MAPPINGS.items():
        for model_type, cls in getattr(modeling_auto, mapping).items():
            out.setdefault(f"hf:{model_type}", {"model": cls if isinstance(cls, str) else cls[0], "kind": kind})
    return out


class _Logits:
    """forward(x) -> the head's logits (else its first output), the one input given by its name."""

    def __new__(cls, model, input_name):
        import torch

        class Logits(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.model = model

            def forward(self, x):
                out = self.model(**{input_name: x})
                return out.logits if getattr(out, "logits", None) is not None else out[0]

        return Logits().eval()


MAX_PARAMS = 1e9  # a model past this is not built (memory, and minutes per row)


def _config(config_cls, small: bool):
    """transformers' default config, or the small one (a config may refuse a field: funnel's layer count)."""
    config = config_cls()
    if small:
        _shrink(config)
    return config


def _shrink(config) -> None:
    """The small config in place, nested configs too (Gemma 3's text and vision towers)."""
    import transformers

    for sub in list(vars(config).values()):
        if isinstance(sub, transformers.PretrainedConfig):
            _shrink(sub)
    for k, v in _SMALL.items():
        if isinstance(getattr(config, k, None), int):
            setattr(config, k, v)
    if hasattr(config, "vocab_size") and config.vocab_size is None:
        config.vocab_size = 1000  # ESM's default leaves it to the checkpoint
    if hasattr(config, "num_experts_per_tok") and config.num_experts_per_tok is None:
        for k, v in _SMALL_MOE.items():
            setattr(config, k, v)
    for k in ("depths", "num_layers_per_stage"):
        if isinstance(getattr(config, k, None), list):
            setattr(config, k, [1] * len(getattr(config, k)))


def _hf_build(model_type: str, cls_name: str):
    """(module returning logits, sample input): a small config first, the default config if that fails."""
    import torch
    import transformers

    config_cls = transformers.CONFIG_MAPPING[model_type]
    errors = []
    for small in (True, False):
        try:
            config = _config(config_cls, small)
            with torch.device("meta"):  # a published default can be hundreds of billions of parameters
                n = sum(p.numel() for p in getattr(transformers, cls_name)(config).parameters())
            if n > MAX_PARAMS:
                raise ValueError(f"this config has {n / 1e9:.1f} B parameters; not built")
            torch.manual_seed(0)
            model = _reinit(getattr(transformers, cls_name)(config)).eval()
            if getattr(model, "_can_set_experts_implementation", lambda: False)():
                model.set_experts_implementation("batched_mm")  # what the converter's error says to do
            name = model.main_input_name
            x = _hf_input(name, config)
            with torch.no_grad():
                model(**{name: x})
            return _Logits(model, name), x, ("small" if small else "default")
        except Exception as e:  # noqa: BLE001 - the next config is tried; both errors are reported
            errors.append(f"{'small' if small else 'default'} config: {type(e).__name__}: {str(e)[:120]}")
    raise RuntimeError("does not build: " + "; ".join(errors))


def _reinit(model):
    """Weights that make the check mean something: transformers' default init leaves some conv nets' logits at 0 or
    1e-30 (0 against 0 proves nothing). Each weight matrix or kernel is redrawn with std 1/sqrt(fan_in), biases
    small, BatchNorm statistics away from 0 and 1."""
    import torch

    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for m in model.modules():
            for name, p in m.named_parameters(recurse=False):
                if p.dim() >= 2 and name.endswith("weight"):
                    fan_in = p[0].numel()
                    p.copy_(torch.randn(p.shape, generator=g) / fan_in ** 0.5)
                elif name == "bias":
                    p.copy_(0.1 * torch.randn(p.shape, generator=g))
            if isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and m.running_mean is not None:
                m.running_mean.copy_(0.1 * torch.randn(m.running_mean.shape, generator=g))
                m.running_var.copy_(0.5 + torch.rand(m.running_var.shape, generator=g))
    return model


def _hf_input(name: str, config):
    import torch

    g = torch.Generator().manual_seed(1)
    if name == "input_ids":
        ids = torch.randint(0, min(int(getattr(config, "vocab_size", 1000) or 1000), 1000), (1, 16), generator=g)
        eos = getattr(config, "eos_token_id", None)
        if isinstance(eos, int) and getattr(config, "is_encoder_decoder", False):
            ids[0, -1] = eos  # BART-style classifiers pool the hidden state at the <eos> token
        return ids
    if name == "pixel_values" or (name == "inputs" and hasattr(config, "image_size")):  # perceiver's images
        size = getattr(config, "image_size", 224)
        size = tuple(size) if isinstance(size, (list, tuple)) else (size, size)
        return torch.randn(1, getattr(config, "num_channels", 3), *size, generator=g)
    if name == "input_values" and hasattr(config, "max_length") and hasattr(config, "num_mel_bins"):
        return torch.randn(1, config.max_length, config.num_mel_bins, generator=g)  # AST: a spectrogram
    if name == "input_values":
        return torch.randn(1, 16000, generator=g)
    if name == "input_features" and hasattr(config, "feature_projection_input_dim"):
        return torch.randn(1, 200, config.feature_projection_input_dim, generator=g)  # w2v-BERT: stacked fbanks
    if name == "input_features":
        frames = 2 * getattr(config, "max_source_positions", 1500)
        return torch.randn(1, getattr(config, "num_mel_bins", 80), frames, generator=g)
    raise ValueError(f"no sample input for {name!r}")


def worker(name: str) -> dict:
    """One model: eager reference, one convert to both outputs, each run on its runtime."""
    import tempfile

    import numpy as np
    import torch

    torch.manual_seed(0)
    row = {}
    if name.startswith("hf:"):
        model_type, cls_name = name[3:].split("/")
        model, x, row["config"] = _hf_build(model_type, cls_name)
        row["params"] = sum(p.numel() for p in model.parameters())
    else:
        timm = _import_timm()
        model = timm.create_model(name, pretrained=False).eval()
        size = tuple(model.pretrained_cfg.get("input_size", (3, 224, 224)))
        x = torch.randn(1, *size, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = model(x)
    want = want[0] if isinstance(want, (tuple, list)) else want
    row["ref_max_abs"] = float(f"{want.abs().max().item():.3g}")
    import tpu_export
    from tpu_export import tpu_backend
    from tpu_export.converter.numerics import rel_err

    row["input"] = list(x.shape)
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        written = tpu_export.convert(model, (x,), targets=["cpu", "cpu-xla"], out_dir=tmp)
        row["convert_s"] = round(time.perf_counter() - t0, 1)
        from ai_edge_litert.interpreter import Interpreter

        interp = Interpreter(model_path=written["cpu"])
        runner = interp.get_signature_runner()
        (in_name,) = runner.get_input_details()
        feed = x.numpy().astype(runner.get_input_details()[in_name]["dtype"])  # int64 ids run as int32
        outs = runner(**{in_name: feed})
        got = outs[sorted(outs)[0]] if len(outs) == 1 else outs[min(outs)]
        row["edge_rel_err"] = float(f"{rel_err(np.asarray(got), want):.2e}")
        out = tpu_backend.load(written["cpu-xla"])(feed)
        leaves = torch.utils._pytree.tree_leaves(out)
        row["tpu_rel_err"] = float(f"{rel_err(np.asarray(leaves[0]), want):.2e}")
    return row


def _save_row(fam: str, row: dict, machine: dict, results_path: str = RESULTS) -> None:
    """The row merged into the results file as it is now (another sweep may be writing other rows)."""
    os.makedirs(os.path.dirname(results_path), exist_ok=True)
    now = json.load(open(results_path)) if os.path.exists(results_path) else {}
    now[fam] = row
    if machine:
        now["_machine"] = machine
    tmp = f"{results_path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(now, f, indent=1, sort_keys=True)
    os.replace(tmp, results_path)


def _run_one(name: str, timeout: float) -> dict:
    import shutil
    import tempfile

    from bench._worker_json import run_json

    t0 = time.perf_counter()
    tmp = tempfile.mkdtemp(prefix="zoo-sweep-")  # the worker's outputs: removed even when it is killed
    try:
        r = run_json([sys.executable, os.path.abspath(__file__), "--one", name], timeout=timeout, cwd=ROOT,
                     err_chars=300, extra_env={"TMPDIR": tmp})
    except subprocess.TimeoutExpired:
        r = {"error": f"timed out after {timeout:.0f} s"}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    r["process_s"] = round(time.perf_counter() - t0, 1)
    return r


def _status(r: dict, key: str) -> str:
    if key in r and r.get("ref_max_abs", 1.0) < VACUOUS:
        return "vacuous"
    if key in r:
        return "ok" if r[key] <= TOL else f"wrong ({r[key]:.1e})"
    return "error"


def _unbuilt(r: dict) -> bool:
    """transformers' own model does not build from its config here (not a conversion result)."""
    return "does not build" in (r.get("error") or "")


def _table(rows) -> list[str]:
    out = ["| family | model | params | input | edge | TPU path | convert s | error |",
           "|---|---|---|---|---|---|---|---|"]
    for fam, r in rows:
        err = (r.get("error") or "").replace("|", "\\|")
        model = r.get("model", "").split("/")[-1]
        out.append(f"| {fam} | {model} | {r.get('params', 0) / 1e6:.1f} M | "
                   f"{'x'.join(map(str, r.get('input', [])[1:]))} | {_status(r, 'edge_rel_err')} | "
                   f"{_status(r, 'tpu_rel_err')} | {r.get('convert_s', '')} | {err} |")
    return out


def render_page(results: dict) -> str:
    """docs/zoo_sweep.md from the results file's rows."""
    rows = sorted((k, v) for k, v in results.items() if not k.startswith("_"))
    machine = results.get("_machine", {})
    lines = [
        "# Model-zoo sweep: timm and transformers through both outputs",
        "",
        "<!-- generated by bench/zoo_sweep.py from bench/results/zoo_sweep.json; do not edit -->",
        "",
        f"One model per architecture family of timm {TIMM} (the family's smallest published model, its default "
        "input size) and per model type of transformers' image, audio and text classification heads (a small "
        "config: 2 layers, width 64, where the config takes it; else the default config), random weights, batch 1, "
        "float32. Each is converted once by `tpu_export.convert(model, (x,), targets=[\"cpu\", \"cpu-xla\"])` in "
        "a fresh process: the `.tflite` runs in the LiteRT interpreter (XNNPACK), the StableHLO artifact (the TPU "
        f"path's lowering) on PJRT CPU, each against torch eager. ok: max abs error <= {TOL:g} of the output's max "
        "abs value. transformers' models get their weights redrawn (std 1/sqrt(fan_in), BatchNorm statistics away "
        "from 0 and 1): their default init leaves some conv nets' logits near 0. A row whose reference output is "
        f"under {VACUOUS:g} is marked vacuous and not counted.",
        "",
        f"Command: `.venv/bin/python bench/zoo_sweep.py`. Machine: {machine.get('cpu', '?')}, "
        f"{machine.get('date', '?')}.",
        "",
    ]
    for title, part in (("timm", [r for r in rows if not r[0].startswith("hf:")]),
                        ("transformers", [r for r in rows if r[0].startswith("hf:")])):
        if not part:
            continue
        built = [r for r in part if not _unbuilt(r[1])]
        good = sum(1 for _, r in built if _status(r, "edge_rel_err") == "ok" and _status(r, "tpu_rel_err") == "ok")
        lines += [f"## {title}", "", f"**{good} of {len(built)} correct on both outputs**"
                  + (f" ({len(part) - len(built)} more do not build from a config here: listed last)."
                     if len(built) < len(part) else "."), ""]
        lines += _table([r for r in part if not _unbuilt(r[1])] + [r for r in part if _unbuilt(r[1])]) + [""]
    return "\n".join(lines)


def write_page(results: dict) -> str:
    text = render_page(results)
    with open(PAGE, "w") as f:
        f.write(text)
    return text


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--families", default=None, help="comma-separated timm modules (default: all)")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--set", default="all", choices=["timm", "hf", "all"],
                    help="timm's families, transformers' classification models, or both")
    ap.add_argument("--table-only", action="store_true")
    ap.add_argument("--resume", action="store_true", help="skip the families the results file already has")
    ap.add_argument("--results", default=RESULTS, help="the results file (default: the committed one)")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        try:
            print(json.dumps(worker(a.one)))
        except Exception as e:  # noqa: BLE001 - the row records the error's first line (and its op, if listed)
            lines = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()] or [""]
            head = " ".join(lines[:2]) if lines[0].endswith(":") else lines[0]
            print(json.dumps({"error": f"{type(e).__name__}: {head}"[:300]}))
        return
    results = json.load(open(a.results)) if os.path.exists(a.results) else {}
    if not a.table_only:
        _side_install()
        fams = set(a.families.split(",")) if a.families else None
        picked = {}
        if a.set in ("hf", "all"):
            picked.update({k: {"model": f"{k}/{v['model']}", "kind": v["kind"]} for k, v in hf_models().items()
                           if fams is None or k in fams})
        if a.set in ("timm", "all"):
            picks = results.get("_timm_picks")  # each family's pick, made once (building every model takes minutes)
            if picks is None:
                picks = pick_models()
                _save_row("_timm_picks", picks, results.get("_machine", {}), a.results)
            picked.update({f: p for f, p in picks.items() if fams is None or f in fams})
        import platform

        results["_machine"] = {"cpu": f"{os.cpu_count()} cores, {platform.machine()}",
                               "date": time.strftime("%Y-%m-%d")}
        for fam, p in picked.items():
            if a.resume and fam in results:
                continue  # a resumed run keeps the rows it has
            r = {**p, **_run_one(p["model"], a.timeout)}
            results[fam] = r
            print(fam, json.dumps(r), flush=True)
            _save_row(fam, r, results["_machine"], a.results)
    if a.results == RESULTS:
        print(write_page(json.load(open(RESULTS)) if os.path.exists(RESULTS) else results))


if __name__ == "__main__":
    main()
