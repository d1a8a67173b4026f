"""tpu-export: the command-line front end over tpu_export.convert and the backends' loaders."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
import time

from .cli_lm import add_lm_commands

__all__ = ["main"]

EPILOG = """examples:
  tpu-export demo
  tpu-export targets
  tpu-export convert model.pt2 --target tpu-v6e --topology 2x2 --target android -o out/
  tpu-export convert model.pt2 --target web --target iot:calibration=cal.npz,ram-kib=256 \
      --target tpu-v6e:topology=2x2 -o out/
  tpu-export convert mypkg.models:build --target web --dynamic-batch -o out/
  tpu-export inspect out/model.tflite
  tpu-export inspect out/model.tpuexp
  tpu-export run out/model.tpuexp --input image=x.npy --save-outputs outs.npz
  tpu-export ops
  tpu-export doctor
  tpu-export convert-lm my_llm_dir/ --target android --target tpu-v6e --prefill 32,128 --cache 1024 -o out/
  tpu-export generate out/android/model.litertlm --prompt "Once upon a time" --max-new-tokens 64
  tpu-export generate out/tpu-v6e --prompt "Hi" --temperature 0.8 --top-p 0.9 --seed 1 --chat
"""


class CliError(Exception):
    pass


def _progress(quiet: bool):
    t0 = time.perf_counter()

    def say(msg: str) -> None:
        if not quiet:
            print(f"[{time.perf_counter() - t0:6.1f}s] {msg}", file=sys.stderr, flush=True)

    return say


def load_model_spec(spec: str):
    """MODEL: a .pt2 file, or 'package.module:factory' returning (module, args[, kwargs])."""
    if spec.endswith(".pt2") or os.path.isfile(spec):
        return spec, None, None
    if ":" not in spec:
        raise CliError(f"MODEL {spec!r} is neither a .pt2 file nor 'package.module:factory'")
    mod_name, fn_name = spec.split(":", 1)
    sys.path.insert(0, os.getcwd())
    try:
        fn = getattr(importlib.import_module(mod_name), fn_name)
    except (ImportError, AttributeError) as e:
        raise CliError(f"cannot load {spec!r}: {e}") from e
    out = fn()
    if not isinstance(out, tuple) or len(out) not in (2, 3):
        raise CliError(f"{spec} must return (module, sample_args) or (module, sample_args, sample_kwargs)")
    return out[0], out[1], (out[2] if len(out) == 3 else None)


def cmd_convert(a) -> int:
    from .multi_target import convert

    targets = dict(_target_spec(t) for t in a.target)
    if len(targets) != len(a.target):
        raise CliError("a target is named twice; give each --target once (its options after a colon)")
    module, args, kwargs = load_model_spec(a.model)
    dyn, dims = None, None
    if a.model.lower().endswith(".onnx"):
        if a.dynamic_batch:
            raise CliError("an .onnx file's named dims (dim_param) are dynamic already; fix one with --dim NAME=SIZE")
        dims = dict(_dim_spec(d) for d in a.dim or ())
    elif a.dim:
        raise CliError("--dim sets the named dims of an .onnx MODEL; this MODEL is not one")
    if a.dynamic_batch:
        import torch

        if args is None:
            raise CliError("--dynamic-batch needs a factory MODEL (a .pt2 carries its own dynamic shapes)")
        batch = torch.export.Dim("batch", min=1, max=a.max_batch)
        dyn = tuple({0: batch} if isinstance(x, torch.Tensor) else None for x in args)
    shared = {}
    for key in _SHARED_KEYS:
        value = getattr(a, key.replace("-", "_"))  # argparse's dest for --KEY
        if value not in (None, False):
            shared[_OPTION[key][0]] = _OPTION[key][1](str(value), key)
    if a.no_aot:
        shared["aot"] = False
    written = convert(module, args, kwargs, targets=targets, out_dir=a.output, dynamic_shapes=dyn,
                      progress=_progress(a.quiet), dim_sizes=dims, **shared)
    for t, p in written.items():
        print(f"{t}: {p}")
    return 0


def _dim_spec(item: str) -> tuple[str, int]:
    """'batch=1' -> ("batch", 1): a size for an .onnx input's named dim."""
    name, eq, size = item.partition("=")
    if not eq or not name or not size.isdigit() or int(size) < 1:
        raise CliError(f"--dim takes NAME=SIZE with a positive size (e.g. --dim batch=1), got {item!r}")
    return name, int(size)


def _bool(text: str, key: str) -> bool:
    if text.lower() in ("1", "true", "on", "yes"):
        return True
    if text.lower() in ("0", "false", "off", "no"):
        return False
    raise CliError(f"{key} takes on or off{' or auto' if key == 'use-pallas' else ''}, got {text!r}")


def _kib(text: str, key: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise CliError(f"{key} takes a number of KiB, got {text!r}") from None


# CLI key -> (option name, parser of its text); a --target NAME:KEY=VALUE item and the --KEY flag share them
_OPTION = {
    "topology": ("topology", lambda v, k: v),
    "use-pallas": ("use_pallas", lambda v, k: "auto" if v == "auto" else _bool(v, k)),
    "dtype": ("dtype", lambda v, k: v),
    "precision": ("precision", lambda v, k: v),
    "aot": ("aot", _bool),
    "quantize": ("quant_config", lambda v, k: v),
    "calibration": ("calibration_data", lambda v, k: _load_calibration(v)),
    "verify": ("verify_inputs", lambda v, k: _load_calibration(v)),
    "strict": ("strict_ops", _bool),
    "channel-last": ("channel_last_io", _bool),
    "flash-kib": ("flash_kib", _kib),
    "ram-kib": ("ram_kib", _kib),
}
# the keys that are also --KEY flags, given once for every target of the call
_SHARED_KEYS = ("topology", "use-pallas", "dtype", "precision", "quantize", "calibration", "strict", "channel-last")


def _target_spec(item: str) -> tuple[str, dict]:
    """'iot:calibration=cal.npz,ram-kib=256' -> ("iot", {"calibration_data": [...], "ram_kib": 256.0})."""
    name, _, rest = item.partition(":")
    opts = {}
    for part in filter(None, rest.split(",")):
        key, eq, value = part.partition("=")
        if key not in _OPTION:
            raise CliError(f"--target {item}: unknown key {key!r}; keys: {', '.join(_OPTION)}")
        if not eq and _OPTION[key][1] is not _bool:
            raise CliError(f"--target {item}: {key} needs a value ({key}=...)")
        opts[_OPTION[key][0]] = _OPTION[key][1](value if eq else "on", key)
    return name, opts


def _load_calibration(path):
    import numpy as np

    with np.load(path, allow_pickle=False) as z:
        keys = sorted(z.files)
        arrays = [z[k] for k in keys]
    # each array's first dim indexes calibration samples: one tuple of args per sample
    n = arrays[0].shape[0]
    return [tuple(arr[i] for arr in arrays) for i in range(n)]


def cmd_run(a) -> int:
    import numpy as np

    inputs = {}
    for item in a.input or []:
        if "=" not in item:
            raise CliError(f"--input takes NAME=file.npy, got {item!r}")
        name, path = item.split("=", 1)
        inputs[name] = np.load(path, allow_pickle=False)
    model = _load_artifact(a.artifact, use_compiled=a.use_compiled, isolate=a.isolate,
                           isolate_timeout=a.isolate_timeout)
    out = model(signature_name=a.signature, **inputs)
    from tpu_export.converter._torch_compat import tree_flatten_with_path

    leaves, _ = tree_flatten_with_path(out)
    named = {}
    for path, v in leaves:
        key = "_".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path) or "output_0"
        named[key] = v.numpy() if hasattr(v, "numpy") else np.asarray(v)
    if a.save_outputs:
        np.savez(a.save_outputs, **named)
    for k, v in named.items():
        print(f"{k}: shape={list(v.shape)} dtype={v.dtype} values={np.array2string(v.ravel()[:8], precision=5)}")
    return 0


def _load_artifact(path, use_compiled=False, isolate=False, isolate_timeout=30.0):
    if path.endswith(".tflite"):
        if use_compiled or isolate:
            raise CliError("--use-compiled and --isolate apply to TPU artifacts, not a .tflite (which is checked "
                           "structurally before the interpreter sees it)")
        from tpu_export import litert_torch

        return litert_torch.load(path)
    from tpu_export import tpu_backend

    return tpu_backend.load(path, use_compiled=use_compiled, isolate=isolate, isolate_timeout=isolate_timeout)


def cmd_inspect(a) -> int:
    if a.artifact.endswith(".litertlm"):
        from tpu_export.targets.lm_describe import describe_litertlm

        print(describe_litertlm(a.artifact))
        return 0
    from tpu_export.targets.describe import describe

    print(describe(a.artifact, isolate=a.isolate))
    return 0


def cmd_targets(a) -> int:
    from tpu_export.targets import TARGETS

    for t in TARGETS.values():
        print(f"{t.name:10s} {t.backend:5s} {t.summary}")
    return 0


def cmd_ops(a) -> int:
    from .op_support import coverage_text

    print(coverage_text())
    return 0


def cmd_doctor(a) -> int:
    from .doctor import run_doctor

    return run_doctor()


def cmd_demo(a) -> int:
    from .demo import run_demo

    return run_demo(out_dir=a.output, quiet=a.quiet, targets=a.target)


def _isolate_flag(p) -> None:
    p.add_argument("--isolate", action="store_true",
                   help="TPU artifacts from untrusted sources: parse each signature's StableHLO in a child process "
                        "first (jaxlib's parser can crash or hang on a hostile file); ~0.8 s more per load")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tpu-export",
                                description="torch.export once -> TPU (StableHLO) and LiteRT artifacts",
                                epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)

    c = sub.add_parser("convert", help="convert a model for one or more targets", epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    c.add_argument("model", help="a .pt2 file (torch.export.save), an .onnx file, or package.module:factory "
                                 "returning (module, args)")
    c.add_argument("--target", action="append", required=True, metavar="NAME[:KEY=VALUE,...]",
                   help="repeatable; see `tpu-export targets`. Options after a colon apply to that target only "
                        f"(keys: {', '.join(_OPTION)}; e.g. iot:calibration=cal.npz,ram-kib=256); the flags "
                        "below apply to every target that takes them")
    c.add_argument("-o", "--output", required=True, help="output directory")
    c.add_argument("--topology", help="TPU topology for AOT compiles, e.g. 2x2")
    c.add_argument("--use-pallas", choices=["auto", "on", "off"])
    c.add_argument("--dtype", choices=["float32", "bfloat16"])
    c.add_argument("--precision", choices=["highest", "high", "default"],
                   help="TPU targets: a float32 matmul's or convolution's MXU passes: highest (default: float32-exact, "
                        "the slowest compile), high (bf16_3x) or default (one bf16 pass: ~5x faster to compile)")
    c.add_argument("--quantize", metavar="SCHEME",
                   help="dynamic_int8, weight_only_int8, weight_only_int4, dynamic_int4_block32, fp16, "
                        "static_int8")
    c.add_argument("--calibration", metavar="FILE.npz", help="calibration inputs for static_int8 (first dim = sample)")
    c.add_argument("--dynamic-batch", action="store_true", help="export dim 0 of every input as dynamic")
    c.add_argument("--max-batch", type=int, default=1024)
    c.add_argument("--dim", action="append", metavar="NAME=SIZE",
                   help="repeatable; .onnx MODEL: give a named input dim (dim_param) a fixed size; the other "
                        "named dims stay dynamic")
    c.add_argument("--channel-last", action="store_true", help="edge: NHWC image inputs/outputs")
    c.add_argument("--strict", action="store_true", help="fail if any op falls back off the target's accelerator")
    c.add_argument("--cache-dir", metavar="DIR",
                   help="TPU targets: keep each AOT-compiled executable in DIR and reuse it when the same program is "
                        "compiled again for the same slice and libtpu (report.json says compile_cache: hit); "
                        "default: $TPU_EXPORT_AOT_CACHE, else ~/.cache/tpu-export/aot; 'none': no cache")
    c.add_argument("--no-aot", action="store_true",
                   help="TPU targets: write the portable StableHLO artifact without TPU executables (seconds instead "
                        "of minutes); a TPU host compiles it when it loads it")
    c.add_argument("--quiet", action="store_true")
    c.set_defaults(fn=cmd_convert)

    add_lm_commands(sub)

    r = sub.add_parser("run", help="run an artifact (.tflite or TPU artifact) on .npy inputs")
    r.add_argument("artifact")
    r.add_argument("--input", action="append", metavar="NAME=file.npy")
    r.add_argument("--signature", default="serving_default")
    r.add_argument("--save-outputs", metavar="FILE.npz")
    r.add_argument("--use-compiled", action="store_true",
                   help="run the artifact's stored TPU executable when it matches this TPU and jaxlib/libtpu "
                        "(machine code: only for artifacts you trust as code); default: compile the StableHLO")
    _isolate_flag(r)
    r.add_argument("--isolate-timeout", type=float, default=30.0, metavar="S",
                   help="with --isolate: seconds the child may spend parsing one signature (default 30)")
    r.set_defaults(fn=cmd_run)

    i = sub.add_parser("inspect", help="signatures, op histogram, sizes, cost/memory report")
    i.add_argument("artifact")
    _isolate_flag(i)
    i.set_defaults(fn=cmd_inspect)

    d = sub.add_parser("demo", help="convert the built-in CNN and transformer to both outputs and check them")
    d.add_argument("-o", "--output", default="tpu-export-demo")
    d.add_argument("--target", action="append", help="default: tpu-v6e and android")
    d.add_argument("--quiet", action="store_true")
    d.set_defaults(fn=cmd_demo)

    t = sub.add_parser("targets", help="list the deployment targets")
    t.set_defaults(fn=cmd_targets)

    o = sub.add_parser("ops", help="the core ATen op support table of both backends")
    o.set_defaults(fn=cmd_ops)

    dr = sub.add_parser("doctor", help="versions of torch, jax, libtpu, LiteRT and LiteRT-LM, and which installed "
                                       "distribution `import litert_torch` loads (exit 1 when two provide it)")
    dr.set_defaults(fn=cmd_doctor)
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from tpu_export.tpu_backend.aot import prepare_cpu_host

    prepare_cpu_host()  # before jax starts: quiet, concurrent-safe libtpu on hosts without a TPU
    import warnings

    with warnings.catch_warnings():  # the filters and the one-line format end with this command
        # torch's own pytree deprecation notice fires inside torch.export; it is not the user's to fix
        warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=FutureWarning)
        warnings.showwarning = _show_warning
        try:
            with _aot_cache(getattr(args, "cache_dir", None)):
                code = args.fn(args)
            if argv is None:  # the console script: the process ends next
                _skip_exit_collections()
            return code
        except KeyboardInterrupt:
            print("tpu-export: interrupted; nothing partial was left behind", file=sys.stderr)
            return 130
        except Exception as e:  # noqa: BLE001 - one line for the user; the traceback with TPU_EXPORT_DEBUG=1
            if os.environ.get("TPU_EXPORT_DEBUG"):
                raise
            _print_error(e, verbose=getattr(args, "verbose", False))
            return 2 if isinstance(e, CliError) else 1


def _skip_exit_collections():
    """Every output is written, closed and published by now; what is left is the interpreter's shutdown, whose
    collections walk every object torch, transformers and jax made (2-3 s after a 1B LLM conversion on this
    2-core host, 0.6 s frozen). Freezing moves them out of the collector's sight; atexit handlers and the
    flush of stdout/stderr still run. Only for the console script: a caller of main([...]) keeps its process."""
    import gc

    gc.freeze()


@contextlib.contextmanager
def _aot_cache(folder):
    """--cache-dir DIR: the AOT compile cache for this command, as $TPU_EXPORT_AOT_CACHE is read by every
    compile_for the targets make (restored after, for in-process callers)."""
    if folder is None:
        yield
        return
    from tpu_export.tpu_backend.compile_cache import ENV, OFF

    off = folder.lower() == OFF
    if not off and os.path.exists(folder) and not os.path.isdir(folder):
        raise CliError(f"--cache-dir {folder}: exists and is not a directory; give a folder (it is created if missing)")
    before = os.environ.get(ENV)
    os.environ[ENV] = folder if off else os.path.abspath(folder)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = before


def _show_warning(message, category, filename, lineno, file=None, line=None):
    """A warning is one line too: what it says, not the source line that raised it."""
    text = " ".join(str(message).split())
    print(f"tpu-export: warning: {text}", file=sys.stderr if file is None else file)


def _print_error(e: BaseException, verbose: bool = False) -> None:
    """``tpu-export: error: <first line>``; a list the error carries (the ops that failed to
    lower, one per line) follows it. torch's tracebacks and logs never do, unless ``--verbose``: then the
    chain of causes follows, each with its traceback, innermost last."""
    msg = str(e).strip() or type(e).__name__
    first, _, rest = msg.partition("\n")
    print(f"tpu-export: error: {first}", file=sys.stderr)
    if rest and not isinstance(e, CliError):
        print(rest, file=sys.stderr)
    cause = e.__cause__ or (None if e.__suppress_context__ else e.__context__)
    if verbose and cause is not None:
        import traceback

        print("tpu-export: the cause (--verbose):", file=sys.stderr)
        traceback.print_exception(cause, file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
