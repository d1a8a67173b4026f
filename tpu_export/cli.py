"""tpu-export: the command-line front end over tpu_export.convert and the backends' loaders."""

from __future__ import annotations

import argparse
import contextlib
import difflib
import importlib
import os
import re
import sys
import textwrap
import threading
import time

from .cli_check import (
    KEY_OPTION,
    CliError,
    check_key,
    check_options,
    check_scheme,
    check_target_name,
    cli_words,
    did_you_mean,
    keys_of,
)
from .cli_lm import add_lm_commands

__all__ = ["main"]

EPILOG = """examples:
  tpu-export demo
  tpu-export convert model.pt2 --target android --target tpu-v6e -o out
  tpu-export inspect out/android/android.tflite

`tpu-export COMMAND --help` shows a command's options, their defaults and its examples.
"""


class _Progress:
    """The CLI's progress callback: a line per step on stderr, each with the time since the command started. On a
    terminal a long step's heartbeat redraws one status line in place (its elapsed time, every second); piped or
    redirected, each beat is a line of its own (every 10 s), so a log shows them all."""

    def __init__(self, quiet: bool, stream=None):
        self._t0 = time.perf_counter()
        self._quiet = quiet
        self._stream = sys.stderr if stream is None else stream
        self._live = not quiet and bool(getattr(self._stream, "isatty", lambda: False)())
        self._status = False  # a status line is on screen, to be cleared before the next line
        self._lock = threading.Lock()

    def _stamp(self) -> str:
        return f"[{time.perf_counter() - self._t0:6.1f}s]"

    def __call__(self, msg: str) -> None:
        if self._quiet:
            return
        with self._lock:
            clear = "\r\033[K" if self._status else ""
            self._status = False
            self._stream.write(f"{clear}{self._stamp()} {cli_words(msg)}\n")
            self._stream.flush()

    def beat(self, what: str, seconds: float) -> None:
        if self._quiet:
            return
        if not self._live:
            return self(f"{what}: {seconds:.0f} s")
        with self._lock:
            self._stream.write(f"\r\033[K{self._stamp()} {what}: {seconds:.0f} s")
            self._stream.flush()
            self._status = True

    @property
    def every(self) -> float | None:
        """The heartbeat period this display wants: a second on a terminal, the default in a log."""
        return 1.0 if self._live else None


def _progress(quiet: bool, stream=None) -> _Progress:
    return _Progress(quiet, stream)


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


def _is_factory(spec: str) -> bool:
    return not (spec.endswith(".pt2") or os.path.isfile(spec))


def cmd_convert(a) -> int:
    # Everything the command line says is checked first, before the model's module is imported (which can
    # take many seconds): target names, their keys and values, the shared flags, what each target takes.
    items = [(item, *_target_spec(item)) for item in a.target]
    if len({name for _, name, _ in items}) != len(items):
        raise CliError("a target is named twice; give each --target once (its options after a colon)")
    shared = _shared_flags(a)
    check_options(items, shared)
    onnx = a.model.lower().endswith(".onnx")
    if onnx and a.dynamic_batch:
        raise CliError("--dynamic-batch: an .onnx file's named dims (dim_param) are dynamic already; fix one with "
                       "--dim NAME=SIZE")
    if a.dim and not onnx:
        raise CliError("--dim sets the named dims of an .onnx MODEL; this MODEL is not one")
    if a.dynamic_batch and not _is_factory(a.model):
        raise CliError("--dynamic-batch needs a factory MODEL (a .pt2 carries its own dynamic shapes)")
    dims = dict(_dim_spec(d) for d in a.dim or ()) if onnx else None
    if a.max_rel_err is not None:
        if not a.max_rel_err > 0:
            raise CliError(f"--max-rel-err takes a positive number, got {a.max_rel_err}")
        if not ("quant_config" in shared or any("quant_config" in o for _, _, o in items)):
            raise CliError("--max-rel-err keeps the most sensitive ops float within a quantized model; give "
                           "--quantize dynamic_int8 (or weight_only_int8, dynamic_int4_block32, weight_only_int4)")

    module, args, kwargs = load_model_spec(a.model)
    dyn = None
    if a.dynamic_batch:
        import torch

        if args is None:
            raise CliError("--dynamic-batch needs a factory MODEL (a .pt2 carries its own dynamic shapes)")
        batch = torch.export.Dim("batch", min=1, max=a.max_batch)
        dyn = tuple({0: batch} if isinstance(x, torch.Tensor) else None for x in args)
    from .multi_target import convert

    written = convert(module, args, kwargs, targets={name: opts for _, name, opts in items}, out_dir=a.output,
                      dynamic_shapes=dyn, progress=_progress(a.quiet), dim_sizes=dims, enable_x64=a.enable_x64,
                      max_rel_err=a.max_rel_err, **{option: value for option, (_, value) in shared.items()})
    for t, p in written.items():
        print(f"{t}: {p}")
    return 0


def _shared_flags(a) -> dict:
    """{option: (flag, value)} of the --KEY flags given: each goes to every target of the call that takes it."""
    shared = {}
    for key in _SHARED_KEYS:
        value = getattr(a, key.replace("-", "_"), None)  # argparse's dest for --KEY
        if value in (None, False):
            continue
        flag = f"--{key}" if value is True else f"--{key} {value}"
        try:
            shared[_OPTION[key][0]] = (flag, _OPTION[key][1](str(value), key))
        except CliError as e:
            raise CliError(f"{flag}: {e}") from None
    if getattr(a, "no_aot", False):
        shared["aot"] = ("--no-aot", False)
    return shared


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
        value = float(text)
    except ValueError:
        raise CliError(f"{key} takes a number of KiB, got {text!r}") from None
    if not value > 0:
        raise CliError(f"{key} takes a positive number of KiB, got {text!r}")
    return value


def _slots(text: str, key: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 1024:
        raise CliError(f"{key} takes a number of requests from 1 to 1024, got {text!r}")
    return int(text)


def _choice(*choices):
    def parse(text: str, key: str) -> str:
        if text not in choices:
            raise CliError(f"{key} takes {', '.join(choices)}, got {text!r}{did_you_mean(text, choices)}")
        return text

    return parse


def _scheme(text: str, key: str) -> str:
    return check_scheme(text)


# CLI key -> (option name, parser of its text); a --target NAME:KEY=VALUE item and the --KEY flag share them
_OPTION = {
    "topology": (KEY_OPTION["topology"], lambda v, k: v),
    "use-pallas": (KEY_OPTION["use-pallas"], lambda v, k: "auto" if v == "auto" else _bool(v, k)),
    "dtype": (KEY_OPTION["dtype"], _choice("float32", "bfloat16")),
    "precision": (KEY_OPTION["precision"], _choice("highest", "high", "default")),
    "aot": (KEY_OPTION["aot"], _bool),
    "quantize": (KEY_OPTION["quantize"], _scheme),
    "calibration": (KEY_OPTION["calibration"], lambda v, k: _load_calibration(v)),
    "verify": (KEY_OPTION["verify"], lambda v, k: _load_calibration(v)),
    "strict": (KEY_OPTION["strict"], _bool),
    "channel-last": (KEY_OPTION["channel-last"], _bool),
    "flash-kib": (KEY_OPTION["flash-kib"], _kib),
    "ram-kib": (KEY_OPTION["ram-kib"], _kib),
    "slots": (KEY_OPTION["slots"], _slots),
}
assert list(_OPTION) == list(KEY_OPTION)
# the keys that are also --KEY flags, given once for every target of the call
_SHARED_KEYS = ("topology", "use-pallas", "dtype", "precision", "quantize", "calibration", "strict", "channel-last")


def _target_spec(item: str) -> tuple[str, dict]:
    """'iot:calibration=cal.npz,ram-kib=256' -> ("iot", {"calibration_data": [...], "ram_kib": 256.0}); an
    unknown target or key, a key the target does not take or a bad value is a CliError naming the item."""
    name, _, rest = item.partition(":")
    target = check_target_name(item, name)
    opts = {}
    for part in filter(None, rest.split(",")):
        key, eq, value = part.partition("=")
        check_key(item, key, target)
        option, parse = _OPTION[key]
        if not eq and parse is not _bool:
            raise CliError(f"--target {item}: {key} needs a value ({key}=...)")
        try:
            opts[option] = parse(value if eq else "on", key)
        except CliError as e:
            raise CliError(f"--target {item}: {e}") from None
    return name, opts


def _load_calibration(path):
    """FILE.npz -> a list of samples (tuples of arrays in the order of the file's sorted array names); each
    array's first dim indexes the samples."""
    import numpy as np

    try:
        with np.load(path, allow_pickle=False) as z:
            keys = sorted(z.files)
            arrays = [z[k] for k in keys]
    except (OSError, ValueError) as e:
        raise CliError(f"cannot read {path} as a .npz of sample inputs: {e}") from None
    if not arrays or any(a.ndim == 0 for a in arrays) or len({a.shape[0] for a in arrays}) != 1:
        raise CliError(f"{path}: give one array per model input, each with the samples along its first dim "
                       "(the same count in every array)")
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
    from tpu_export.targets.describe import describe, inspect_data, resolve_artifact

    path = resolve_artifact(a.artifact)
    if a.json:
        import json

        print(json.dumps(inspect_data(path, isolate=a.isolate), indent=2, default=str))
    else:
        print(describe(path, isolate=a.isolate))
    if a.overlays:
        importlib.import_module("tpu_export.cli_explore").write_inspect_overlays(path)
    return 0


def cmd_targets(a) -> int:
    from tpu_export.targets import TARGETS

    for t in TARGETS.values():
        print(f"{t.name:10s} {t.backend:5s} {t.summary}")
    groups: dict[tuple, list] = {}
    for t in TARGETS.values():
        groups.setdefault(tuple(keys_of(t)), []).append(t.name)
    print("\nkeys of --target NAME:KEY=VALUE (and of the --KEY flags):")
    for keys, names in groups.items():
        print(f"  {', '.join(names)}: {', '.join(keys)}")
    return 0


def cmd_ops(a) -> int:
    from .op_support import coverage_text

    print(coverage_text())
    return 0


def cmd_doctor(a) -> int:
    from .doctor import run_doctor

    return run_doctor()


def cmd_demo(a) -> int:
    for name in a.target or ():
        if ":" in name:
            raise CliError(f"--target {name}: demo takes target names only (options are for `tpu-export convert`)")
        check_target_name(name, name)
    from .demo import run_demo

    return run_demo(out_dir=a.output, quiet=a.quiet, targets=a.target)


class _HelpFormatter(argparse.HelpFormatter):
    """Descriptions wrap, examples keep their lines; each flag's help ends with its default unless it says it."""

    def _fill_text(self, text, width, indent):
        if text.startswith("examples:"):
            return "".join(indent + line for line in text.splitlines(keepends=True))
        text = " ".join(text.split())
        return textwrap.fill(text, width, initial_indent=indent, subsequent_indent=indent, break_on_hyphens=False)

    def _split_lines(self, text, width):
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)

    def add_argument(self, action):
        super().add_argument(action)
        # argparse measures a subcommand's name at its parent's indent: room for the indent its line has
        subactions = getattr(action, "_get_subactions", list)() if action.help is not argparse.SUPPRESS else ()
        for subaction in subactions:
            width = len(self._format_action_invocation(subaction)) + self._current_indent + 2 * self._indent_increment
            self._action_max_length = max(self._action_max_length, width)

    def _get_help_string(self, action):
        text = action.help or ""
        if not action.option_strings or action.default is argparse.SUPPRESS or action.required or "default" in text:
            return text
        if action.nargs == 0 and action.const is True and action.default is False:  # store_true
            return f"{text} (default: off)"
        if action.default is None:
            return text
        return f"{text} (default: %(default)s)"


class _Parser(argparse.ArgumentParser):
    """argparse's parser, whose invalid-choice errors (a subcommand, --dtype, ...) name the closest choice."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message):
        m = re.match(r"argument (.+?): invalid choice: '(.*)' \(choose from (.*)\)$", message)
        if m:
            message += did_you_mean(m.group(2), re.findall(r"'([^']*)'", m.group(3)))
        super().error(message)


def examples(*lines: str) -> str:
    """A subcommand's epilog: its example command lines (a line starting with # says what the next one does)."""
    return "examples:\n" + "".join(f"  {line}\n" for line in lines)


def _isolate_flag(p) -> None:
    p.add_argument("--isolate", action="store_true",
                   help="TPU artifacts from untrusted sources: parse each signature's StableHLO in a child process "
                        "first (jaxlib's parser can crash or hang on a hostile file); ~0.8 s more per load")


def _quiet_flag(p) -> None:
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr (errors and warnings still)")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="tpu-export", description="torch.export once -> TPU (StableHLO) and LiteRT artifacts",
                epilog=EPILOG)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    c = sub.add_parser(
        "convert", help="convert a model for one or more targets",
        description="Capture MODEL once with torch.export and write one artifact per --target into OUT: "
                    "OUT/<target>/<target>.tflite for edge targets, OUT/<target>/model.tpuexp for TPU/XLA "
                    "targets, and OUT/summary.json. Everything is checked before the model is imported; "
                    "nothing is written unless every target succeeds.",
        epilog=examples(
            "# out/android/android.tflite (and out/summary.json)",
            "tpu-export convert model.pt2 --target android -o out",
            "# out/tpu-v6e/model.tpuexp (AOT-compiled for a 2x2 slice) and out/android/android.tflite",
            "tpu-export convert mypkg.models:build --target tpu-v6e --topology 2x2 --target android -o out",
            "# out/web/web.tflite + web.js, out/iot/iot.tflite + iot_model.c + iot_model.h (static int8)",
            "tpu-export convert model.pt2 --target web --target iot:calibration=cal.npz,ram-kib=256 -o out",
            "# out/cpu/cpu.tflite from an ONNX model, its named batch dim fixed",
            "tpu-export convert model.onnx --target cpu --dim batch=1 -o out"))
    c.add_argument("model", help="a .pt2 file (torch.export.save), an .onnx file, or package.module:factory "
                                 "returning (module, args) or (module, args, kwargs)")
    c.add_argument("--target", action="append", required=True, metavar="NAME[:KEY=VALUE,...]",
                   help="required, repeatable; `tpu-export targets` lists the names and the keys each takes. "
                        f"Options after a colon apply to that target only (keys: {', '.join(_OPTION)}; "
                        "e.g. iot:calibration=cal.npz,ram-kib=256, android:channel-last=off); the flags below "
                        "apply to every target that takes them")
    c.add_argument("-o", "--output", required=True, metavar="OUT",
                   help="required: output directory (one folder per target is replaced in it)")
    c.add_argument("--topology", help="TPU targets: the slice to AOT-compile for, e.g. 2x2 (default: the chip's "
                                      "own default, 2x2 on v5e/v6e, 2x2x1 on v5p/v7x)")
    c.add_argument("--use-pallas", choices=["auto", "on", "off"],
                   help="TPU/XLA targets: Pallas kernels (auto: where their shape rules expect a gain) (default: "
                        "auto on TPU chips, off on cuda and cpu-xla)")
    c.add_argument("--dtype", choices=["float32", "bfloat16"],
                   help="TPU/XLA targets: the compute and weight dtype (default: float32)")
    c.add_argument("--precision", choices=["highest", "high", "default"],
                   help="TPU targets: a float32 matmul's or convolution's MXU passes: highest (float32-exact, "
                        "the slowest compile), high (bf16_3x) or default (one bf16 pass: ~5x faster to compile) "
                        "(default: highest)")
    c.add_argument("--quantize", metavar="SCHEME",
                   help="edge targets: dynamic_int8, weight_only_int8, weight_only_int4, dynamic_int4_block32, "
                        "fp16 or static_int8 (needs --calibration); TPU/XLA targets: weight_only_int8 "
                        "(default: none, a float model; iot: static_int8)")
    c.add_argument("--max-rel-err", type=float, metavar="E",
                   help="with --quantize dynamic_int8, weight_only_int8, dynamic_int4_block32 or weight_only_int4 on "
                        "android, ios or cpu: keep the ops the output is most sensitive to in float until its "
                        "relative error against torch eager on the sample inputs is at most E (default: none, "
                        "every op quantized)")
    c.add_argument("--calibration", metavar="FILE.npz",
                   help="sample inputs for static_int8 (and iot): one array per model input, sorted by name, "
                        "first dim = sample (default: none)")
    c.add_argument("--dynamic-batch", action="store_true",
                   help="export dim 0 of every input as dynamic (a factory MODEL only)")
    c.add_argument("--max-batch", type=int, default=1024, metavar="N",
                   help="with --dynamic-batch: the largest batch the exported dim allows")
    c.add_argument("--dim", action="append", metavar="NAME=SIZE",
                   help="repeatable; .onnx MODEL: give a named input dim (dim_param) a fixed size (default: the "
                        "named dims stay dynamic)")
    c.add_argument("--channel-last", action="store_true",
                   help="edge targets: NHWC image inputs/outputs (default: on for android, ios, iot; off "
                        "elsewhere; per target: NAME:channel-last=off)")
    c.add_argument("--strict", action="store_true",
                   help="edge targets: fail if any op falls back off the target's accelerator")
    c.add_argument("--enable-x64", action="store_true",
                   help="keep int64/float64 inputs, outputs and math 64-bit (default: off: they become "
                        "int32/float32, as LiteRT and TPUs run them)")
    c.add_argument("--cache-dir", metavar="DIR",
                   help="TPU targets: keep each AOT-compiled executable in DIR and reuse it when the same program is "
                        "compiled again for the same slice and libtpu (report.json says compile_cache: hit); "
                        "'none': no cache (default: $TPU_EXPORT_AOT_CACHE, else ~/.cache/tpu-export/aot)")
    c.add_argument("--no-aot", action="store_true",
                   help="TPU targets: write the portable StableHLO artifact without TPU executables (seconds instead "
                        "of minutes); a TPU host compiles it when it loads it")
    _quiet_flag(c)
    c.add_argument("--verbose", action="store_true",
                   help="on an error, print its chain of causes with their tracebacks after the one-line message")
    c.set_defaults(fn=cmd_convert)

    add_lm_commands(sub)

    r = sub.add_parser(
        "run", help="run a .tflite or TPU artifact on .npy inputs",
        description="Run ARTIFACT on inputs saved with numpy.save and print each output's shape, dtype and first "
                    "values.",
        epilog=examples("tpu-export run out/android/android.tflite --input x=x.npy",
                        "tpu-export run out/tpu-v6e/model.tpuexp --input x=x.npy --save-outputs outs.npz",
                        "tpu-export run downloaded.tpuexp.zip --input x=x.npy --isolate"))
    r.add_argument("artifact", help="a .tflite, a .tpuexp folder or a .zip of one")
    r.add_argument("--input", action="append", metavar="NAME=file.npy",
                   help="repeatable: one per input of the signature (default: none)")
    r.add_argument("--signature", default="serving_default", help="the signature to run")
    r.add_argument("--save-outputs", metavar="FILE.npz", help="also save the outputs, by name (default: not saved)")
    r.add_argument("--use-compiled", action="store_true",
                   help="run the artifact's stored TPU executable when it matches this TPU and jaxlib/libtpu "
                        "(machine code: only for artifacts you trust as code) (default: off, compile the StableHLO)")
    _isolate_flag(r)
    r.add_argument("--isolate-timeout", type=float, default=30.0, metavar="S",
                   help="with --isolate: seconds the child may spend parsing one signature")
    r.set_defaults(fn=cmd_run)

    i = sub.add_parser(
        "inspect", help="signatures, sizes, op histogram, cost/memory report",
        description="A short summary of ARTIFACT: for a .tflite its signatures (input/output names, shapes, "
                    "dtypes), size, op histogram and delegate coverage; for a TPU artifact its signatures, "
                    "weights, platforms, StableHLO ops and each compiled target's compile time, cost and memory "
                    "(a figure XLA does not know: unknown); for a .litertlm its sections. --json prints all of it "
                    "as JSON.",
        epilog=examples("tpu-export inspect out/android/android.tflite",
                        "tpu-export inspect out/tpu-v6e/model.tpuexp",
                        "tpu-export inspect out/android/model.litertlm",
                        "# a target folder: the model file in it, all of it as JSON",
                        "tpu-export inspect out/tpu-v6e --json > tpu-v6e.json"))
    i.add_argument("artifact", help="a .tflite, .litertlm, .tpuexp folder or .zip of one, or a target folder "
                                    "that convert or convert-lm wrote (out/android)")
    i.add_argument("--json", action="store_true",
                   help="print the full description as JSON (the compiled targets' whole report.json included)")
    i.add_argument("--overlays", action="store_true",
                   help="also write Model Explorer overlays beside the artifact for `tpu-export explore --overlay`: "
                        "a .tflite's where each op runs per delegate and per-op latency on this CPU; a TPU "
                        "artifact's XLA cost per op (flops, bytes, estimated time) (default: not written)")
    _isolate_flag(i)
    i.set_defaults(fn=cmd_inspect)

    d = sub.add_parser(
        "demo", help="convert the built-in CNN and transformer and check them",
        description="Convert the built-in CNN and transformer for each target, run every artifact and compare "
                    "it with torch eager.",
        epilog=examples("tpu-export demo", "tpu-export demo --target cpu --target cpu-xla -o /tmp/demo"))
    d.add_argument("-o", "--output", default="tpu-export-demo", metavar="OUT", help="output directory")
    d.add_argument("--target", action="append", metavar="NAME",
                   help="repeatable: a target name (default: tpu-v6e and android)")
    _quiet_flag(d)
    d.set_defaults(fn=cmd_demo)

    t = sub.add_parser("targets", help="list the deployment targets and their keys",
                       description="The deployment targets, their backend, and the --target NAME:KEY=VALUE keys "
                                   "each takes.",
                       epilog=examples("tpu-export targets"))
    t.set_defaults(fn=cmd_targets)

    o = sub.add_parser("ops", help="the core ATen op support table of both backends",
                       description="Which core ATen ops each backend (edge: LiteRT, tpu: StableHLO) lowers.",
                       epilog=examples("tpu-export ops", "tpu-export ops | grep convolution"))
    o.set_defaults(fn=cmd_ops)

    dr = sub.add_parser("doctor", help="versions, and which litert_torch an import finds",
                        description="Versions of torch, jax, libtpu, LiteRT and LiteRT-LM, and which installed "
                                    "distribution `import litert_torch` loads (exit 1 when two provide it).",
                        epilog=examples("tpu-export doctor"))
    dr.set_defaults(fn=cmd_doctor)
    importlib.import_module("tpu_export.cli_serve").add_parser(sub, examples)
    importlib.import_module("tpu_export.cli_debug").add_parser(sub, examples)
    importlib.import_module("tpu_export.cli_explore").add_parser(sub, examples)
    p.commands = sub.choices  # name -> its parser (main's "unrecognized arguments" hint)
    return p


def main(argv=None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:
        _unrecognized(parser.commands[args.command], extra)
    from tpu_export.tpu_backend.aot import prepare_cpu_host

    prepare_cpu_host()  # before jax starts: quiet, concurrent-safe libtpu on hosts without a TPU
    import functools
    import warnings

    with warnings.catch_warnings():  # the filters and the one-line format end with this command
        # torch's own pytree deprecation notice fires inside torch.export; it is not the user's to fix
        warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=FutureWarning)
        warnings.showwarning = functools.partial(_show_warning, command=args.command)
        try:
            with _aot_cache(getattr(args, "cache_dir", None)):
                code = args.fn(args)
            if argv is None:  # the console script: the process ends next
                _skip_exit_collections()
            return code
        except KeyboardInterrupt:
            print("tpu-export: interrupted; nothing partial was left behind", file=sys.stderr)
            return 130
        except BrokenPipeError:  # stdout's reader went away (`tpu-export inspect X --json | head`): not a failure
            if argv is None:  # the console script: nothing more may reach the closed pipe at exit
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 0
        except Exception as e:  # noqa: BLE001 - one line for the user; the traceback with TPU_EXPORT_DEBUG=1
            if os.environ.get("TPU_EXPORT_DEBUG"):
                raise
            _print_error(e, verbose=getattr(args, "verbose", False), command=args.command)
            return e.exit_code if isinstance(e, CliError) else 1


def _unrecognized(sub: argparse.ArgumentParser, extra: list) -> None:
    """argparse's "unrecognized arguments" error from the subcommand's parser, with the closest of its flags."""
    flags = [s for action in sub._actions for s in action.option_strings]
    hints = []
    for word in extra:
        flag = word.partition("=")[0]
        close = difflib.get_close_matches(flag, flags, n=1, cutoff=0.6) if flag.startswith("--") else []
        if close:
            hints.append(f"{flag}: did you mean {close[0]}?")
    sub.error(f"unrecognized arguments: {' '.join(extra)}" + (f" ({'; '.join(hints)})" if hints else ""))


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


# The library's advice in the CLI's words, for the commands that have the flag (convert: --enable-x64)
_FLAG_WORDS = {"convert": [(re.compile(r"\benable_x64=True\b"), "--enable-x64")]}


def _cli_text(text: str, command: str | None) -> str:
    for pattern, flag in _FLAG_WORDS.get(command, ()):
        text = pattern.sub(flag, text)
    return text


def _show_warning(message, category, filename, lineno, file=None, line=None, *, command=None):
    """A warning is one line too: what it says, not the source line that raised it."""
    text = _cli_text(" ".join(str(message).split()), command)
    print(f"tpu-export: warning: {text}", file=sys.stderr if file is None else file)


def _print_error(e: BaseException, verbose: bool = False, command: str | None = None) -> None:
    """``tpu-export: error: <first line>``; a list the error carries (the ops that failed to
    lower, one per line) follows it. torch's tracebacks and logs never do, unless ``--verbose``: then the
    chain of causes follows, each with its traceback, innermost last."""
    msg = _cli_text(str(e).strip() or type(e).__name__, command)
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
