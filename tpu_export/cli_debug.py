"""``tpu-export debug MODEL``: find the smallest part of a model that fails to convert to LiteRT or converts to
numbers that differ from torch (litert_torch.debug.find_culprits), printed as runnable Python snippets."""

from __future__ import annotations

import os

__all__ = ["add_parser", "cmd_debug"]


def cmd_debug(a) -> int:
    """Run find_culprits on MODEL; exit 0 when nothing fails, 1 when culprits were found."""
    from .cli import CliError, load_model_spec

    if a.atol is not None and a.atol < 0:
        raise CliError(f"--atol takes a tolerance >= 0, got {a.atol}")
    if a.rtol < 0:
        raise CliError(f"--rtol takes a tolerance >= 0, got {a.rtol}")
    if a.max_granularity is not None and a.max_granularity < 1:
        raise CliError(f"--max-granularity takes a number of ops >= 1, got {a.max_granularity}")
    if a.model.lower().endswith(".onnx"):
        raise CliError("tpu-export debug takes a PyTorch MODEL ('package.module:factory' or a .pt2 file); convert "
                       "the .onnx with `tpu-export convert` to see which ops it refuses")
    module, args, kwargs = load_model_spec(a.model)
    if isinstance(module, (str, os.PathLike)):
        import torch

        ep = torch.export.load(os.fspath(module))
        args, kwargs = ep.example_inputs or ((), {})
        module = ep.module()
    from tpu_export.litert_torch.debug import find_culprits

    culprits = find_culprits(module, args, a.max_granularity, kwargs=kwargs,
                             atol=None if a.errors_only else a.atol, rtol=a.rtol,
                             enable_fx_minifier_logging=a.verbose)
    found = 0
    for found, c in enumerate(culprits, 1):
        print(f"# --- culprit {found} ---")
        print(str(c))
        print(c.code)
    if not found:
        print("tpu-export debug: the whole model converts and matches torch (no culprit)")
        return 0
    return 1


def add_parser(sub, examples) -> None:
    """Register ``debug`` on the subcommand parsers ``sub``."""
    p = sub.add_parser(
        "debug", help="find the smallest part of a model that fails to convert or diverges",
        description="Bisect the captured graph of MODEL ('package.module:factory' returning (module, args[, "
                    "kwargs]), or a .pt2 file) for the smallest parts that fail to convert to LiteRT, fail to run, "
                    "or differ from torch past the tolerance; each is printed as a runnable Python snippet with "
                    "your source lines. Exit status 1 when a culprit is found.",
        epilog=examples("tpu-export debug mypkg.models:make_model",
                        "# only conversion and run errors, no numeric check",
                        "tpu-export debug model.pt2 --errors-only"))
    p.add_argument("model", metavar="MODEL", help="'package.module:factory' or a .pt2 file")
    p.add_argument("--atol", type=float, default=1e-4, help="absolute tolerance on each output (default 1e-4)")
    p.add_argument("--rtol", type=float, default=1e-4, help="relative tolerance (default 1e-4)")
    p.add_argument("--errors-only", action="store_true", help="report conversion and run errors only")
    p.add_argument("--max-granularity", type=int, default=None, metavar="N",
                   help="stop narrowing a failing part at N ops (default: down to one op)")
    p.add_argument("--verbose", action="store_true", help="print each part checked and its result")
    p.set_defaults(fn=cmd_debug)
