"""`tpu-export demo`: the built-in CNN and transformer, converted to both outputs and checked."""

from __future__ import annotations

import os
import sys
import time

import torch

from tpu_export.converter._torch_compat import tree_leaves

from .demo_models import DEMO_MODELS

__all__ = ["run_demo", "max_rel_err"]

DEFAULT_TARGETS = ("tpu-v6e", "android")


def max_rel_err(got, want) -> float:
    worst = 0.0
    for g, w in zip(tree_leaves(got), tree_leaves(want)):
        g, w = torch.as_tensor(g).double(), torch.as_tensor(w).double()
        worst = max(worst, ((g - w).abs().max() / w.abs().max().clamp_min(1e-6)).item())
    return worst


def _run(path, args):
    """Run an artifact on the torch sample. Mobile targets take images NHWC by default, so an
    NCHW sample whose channel-last shape is what the .tflite asks for is permuted first (and a
    4-D NHWC output permuted back)."""
    from .cli import _load_artifact

    model = _load_artifact(path)
    if not path.endswith(".tflite"):
        return model(*args)
    from ai_edge_litert.interpreter import Interpreter

    runner = Interpreter(model_path=path).get_signature_runner()
    wanted = [tuple(d["shape"]) for d in runner.get_input_details().values()]
    feed = []
    for x in args:
        nhwc = tuple(x.permute(0, 2, 3, 1).shape) if x.dim() == 4 else None
        feed.append(x.permute(0, 2, 3, 1).contiguous() if nhwc in wanted and tuple(x.shape) not in wanted else x)
    return model(*feed)


def run_demo(out_dir: str = "tpu-export-demo", quiet: bool = False, targets=None) -> int:
    from tpu_export.targets.files import artifact_size

    from .cli import _progress
    from .multi_target import convert

    targets = list(targets or DEFAULT_TARGETS)
    say = _progress(quiet)
    rows = []
    for name, build in DEMO_MODELS.items():
        module, args = build()
        with torch.no_grad():
            want = module(*args)
        t0 = time.perf_counter()
        written = convert(module, args, targets=targets, out_dir=os.path.join(out_dir, name),
                          progress=lambda m, n=name: say(f"{n}: {m}"))
        total = time.perf_counter() - t0
        for target, path in written.items():
            got = _run(path, args)
            size = artifact_size(path)
            rows.append((name, target, path, size, max_rel_err(got, want), total))
    print(f"{'model':12s} {'target':9s} {'size':>10s} {'max rel err':>12s} {'convert s':>9s}  artifact")
    bad = 0
    for name, target, path, size, err, secs in rows:
        ok = err <= 1e-4
        bad += not ok
        print(f"{name:12s} {target:9s} {size:10,d} {err:12.2e} {secs:9.2f}  {path}{'' if ok else '  MISMATCH'}")
    print("all outputs match torch eager (rel err <= 1e-4)" if not bad else f"{bad} artifact(s) do not match torch",
          file=sys.stderr if bad else sys.stdout)
    return 1 if bad else 0
