"""`tpu-export demo`: the built-in CNN and transformer, converted to both outputs and checked."""

from __future__ import annotations

import os
import sys
import time

import torch
import torch.utils._pytree as pytree

from .demo_models import DEMO_MODELS

__all__ = ["run_demo", "max_rel_err"]

DEFAULT_TARGETS = ("tpu-v6e", "android")


def max_rel_err(got, want) -> float:
    worst = 0.0
    for g, w in zip(pytree.tree_leaves(got), pytree.tree_leaves(want)):
        g, w = torch.as_tensor(g).double(), torch.as_tensor(w).double()
        worst = max(worst, ((g - w).abs().max() / w.abs().max().clamp_min(1e-6)).item())
    return worst


def _load(path):
    if path.endswith(".tflite"):
        import litert_torch

        return litert_torch.load(path)
    import tpu_backend

    return tpu_backend.load(path)


def run_demo(out_dir: str = "tpu-export-demo", quiet: bool = False, targets=None) -> int:
    from .cli import _progress
    from .convert import convert

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
            got = _load(path)(*args)
            size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs) \
                if os.path.isdir(path) else os.path.getsize(path)
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
