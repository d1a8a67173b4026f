"""The ``explore`` and ``compare`` subcommands of tpu-export (tpu_export.explore); cli.py adds them to its parser."""

from __future__ import annotations

import os
import sys

__all__ = ["add_parser", "cmd_explore", "cmd_compare", "write_inspect_overlays"]


def _cli():
    from . import cli  # the shared helpers (CliError, load_model_spec); imported late: cli imports us

    return cli


def _model_and_inputs(spec: str, inputs: list | None):
    """MODEL (a .pt2 or package.module:factory) and the inputs to run: --input NAME=FILE.npy (by the forward's
    parameter names), else the factory's sample inputs, else the .pt2's example inputs."""
    import numpy as np
    import torch

    cli = _cli()
    module, args, kwargs = cli.load_model_spec(spec)
    if inputs:
        kwargs = {}
        for item in inputs:
            name, sep, path = item.partition("=")
            if not sep or not name or not path:
                raise cli.CliError(f"--input takes NAME=FILE.npy, got {item!r}")
            if not os.path.isfile(path):
                raise cli.CliError(f"--input {item}: {path} does not exist")
            kwargs[name] = torch.from_numpy(np.load(path))
        args = ()
    elif args is None:
        ex = getattr(torch.export.load(module), "example_inputs", None)
        if not ex:
            raise cli.CliError(f"MODEL {spec}: the .pt2 holds no example inputs; give them with --input NAME=FILE.npy")
        args, kwargs = ex
    if not isinstance(args, tuple):
        args = (args,)
    return module, args, kwargs


def cmd_explore(a) -> int:
    from tpu_export.explore import ExploreError, explore

    cli = _cli()
    if a.port is not None and not 0 < a.port < 65536:
        raise cli.CliError(f"--port takes a port number 1-65535, got {a.port}")
    model, args, kwargs = (None, (), None)
    if a.model is not None:
        model, args, kwargs = _model_and_inputs(a.model, a.input)
    elif a.input:
        raise cli.CliError("--input goes with --model (the torch model whose debug export the view shows)")
    from tpu_export.targets.describe import resolve_artifact

    try:
        out = explore(resolve_artifact(a.artifact), port=a.port or 8080, overlays=a.overlay or (), model=model,
                      sample_args=args, sample_kwargs=kwargs, export_html_path=a.export_html, png=a.png)
    except ExploreError as e:
        raise cli.CliError(str(e)) from None
    except ValueError as e:
        raise cli.CliError(str(e)) from None
    for key in ("html", "png"):
        if key in out:
            extra = f" (Model Explorer showed {out['op_node_count']} op nodes)" if key == "png" else ""
            print(f"{key}: {out[key]}{extra}")
    return 0


def cmd_compare(a) -> int:
    from tpu_export.explore import compare, numeric_overlay, overlay_path

    cli = _cli()
    if not a.tolerance > 0:
        raise cli.CliError(f"--tolerance takes a positive number, got {a.tolerance}")
    from tpu_export.targets.describe import resolve_artifact

    path = resolve_artifact(a.artifact)
    if not os.path.exists(path):
        raise cli.CliError(f"ARTIFACT {a.artifact} does not exist")
    mixed = (a.quantize, a.max_rel_err, a.output)
    if any(x is not None for x in mixed) and any(x is None for x in mixed):
        raise cli.CliError("--quantize, --max-rel-err and -o/--output go together (the mixed precision search)")
    if a.quantize is not None:
        if a.quantize != "dynamic_int8":
            raise cli.CliError(f"--quantize {a.quantize}: the mixed precision search takes dynamic_int8")
        if not a.max_rel_err > 0:
            raise cli.CliError(f"--max-rel-err takes a positive number, got {a.max_rel_err}")
        if not path.endswith(".tflite"):
            raise cli.CliError(f"--quantize: ARTIFACT {path} must be the float .tflite (convert without --quantize)")
    module, args, kwargs = _model_and_inputs(a.model, a.input)
    if a.quantize is not None:
        from tpu_export.explore.mixed import mixed_precision

        try:
            _, rep = mixed_precision(module, path, args, kwargs, max_rel_err=a.max_rel_err, scheme=a.quantize,
                                     out=a.output, signature=a.signature)
        except ValueError as e:
            raise cli.CliError(str(e)) from None
        if a.json:
            import json

            print(json.dumps(rep.as_dict(), indent=2))
        else:
            print(rep.summary())
        print(f"wrote {a.output}", file=sys.stderr)
        return 0
    try:
        res = compare(module, path, args, kwargs, signature=a.signature, tolerance=a.tolerance)
    except ValueError as e:
        raise cli.CliError(str(e)) from None
    print(res.to_json() if a.json else res.table())
    if a.overlays:
        import json

        from tpu_export.converter.atomic import write_file

        p = overlay_path(path, "numeric")
        write_file(p, json.dumps(numeric_overlay(res, a.signature), indent=1).encode())
        print(f"overlay: {p}", file=sys.stderr)
    return 1 if (a.fail_on_divergence and res.first_divergence is not None) else 0


def write_inspect_overlays(path: str) -> None:
    """``inspect --overlays``: the overlays of a .tflite (where each op runs, per-op latency) or a TPU artifact
    (XLA's per-op cost) beside it, one line per file on stderr."""
    from tpu_export.explore import write_overlays

    try:
        written = write_overlays(path)
    except ValueError as e:
        raise _cli().CliError(f"--overlays: {e}") from None
    for name, p in written.items():
        print(f"overlay {name}: {p}", file=sys.stderr)


def add_parser(sub, examples) -> None:
    e = sub.add_parser(
        "explore", help="open an artifact in Model Explorer (localhost), or write an HTML/PNG view of it",
        description="Open ARTIFACT in Model Explorer on 127.0.0.1 (offline): a .tflite or .litertlm as written, a "
                    "TPU artifact's signatures as StableHLO with torch parameter names (with --model: each op "
                    "tied to its torch node and source line). --overlay adds node data written beside the "
                    "artifact by `inspect --overlays` and `compare --overlays`. Needs the explore extra: "
                    "pip install 'tpu-export[explore]'.",
        epilog=examples("tpu-export explore out/android/android.tflite --overlay runs_on.gpu --overlay latency",
                        "tpu-export explore out/tpu-v6e/model.tpuexp --model mypkg.models:build --port 8090",
                        "# CI: a self-contained HTML page and a screenshot (headless Chromium)",
                        "tpu-export explore out/android --overlay all --export-html view.html --png view.png"))
    e.add_argument("artifact", help="a .tflite, .litertlm, .tpuexp folder or .zip of one, or a target folder")
    e.add_argument("--port", type=int, default=None, metavar="P",
                   help="the local port (default: 8080, or the next free one up to 8099)")
    e.add_argument("--overlay", action="append", metavar="NAME|all|FILE.json",
                   help="repeatable: an overlay written beside the artifact (a .tflite: runs_on.cpu, runs_on.gpu, "
                        "runs_on.coreml, runs_on.metal, runs_on.tflm, latency, numeric; a TPU artifact: "
                        "xla_cost.flops, xla_cost.bytes, xla_cost.time, numeric), all of them, or a node data file "
                        "(default: none)")
    e.add_argument("--model", metavar="MODEL",
                   help="TPU artifacts: the torch model (.pt2 or package.module:factory) it came from: the view "
                        "names each op's torch node and source line (default: the lowering's names)")
    e.add_argument("--input", action="append", metavar="NAME=FILE.npy",
                   help="with --model: repeatable, the inputs by the forward's parameter names (default: the "
                        "factory's sample inputs)")
    e.add_argument("--export-html", metavar="FILE.html",
                   help="write a self-contained HTML view (graph, overlays, node table) instead of serving "
                        "(default: serve)")
    e.add_argument("--png", metavar="FILE.png",
                   help="write a screenshot of Model Explorer's view (needs Chromium) instead of serving "
                        "(default: serve)")
    e.set_defaults(fn=cmd_explore)

    c = sub.add_parser(
        "compare", help="per-layer error of an artifact against torch eager",
        description="Run MODEL in torch eager and ARTIFACT on the same inputs, capture every intermediate tensor "
                    "on both sides (.tflite: the interpreter keeping all tensors; TPU artifact: a debug export of "
                    "its signature on this CPU) and print one row per torch node: module path, source line, max "
                    "abs and max rel error, with the first node past --tolerance named.",
        epilog=examples("tpu-export compare mypkg.models:build out/android/android.tflite",
                        "tpu-export compare model.pt2 out/tpu-v6e/model.tpuexp --input x=x.npy --json",
                        "# the numeric overlay for `explore --overlay numeric`",
                        "tpu-export compare mypkg.models:build out/android --overlays",
                        "# int8 where the output stays within 1e-2 of torch eager; the rest float",
                        "tpu-export compare mypkg.models:build out/cpu/cpu.tflite --quantize dynamic_int8 "
                        "--max-rel-err 1e-2 -o mixed.tflite"))
    c.add_argument("model", help="the torch model: a .pt2 (torch.export.save) or package.module:factory returning "
                                 "(module, args) or (module, args, kwargs)")
    c.add_argument("artifact", help="a .tflite, .tpuexp folder or .zip of one, or a target folder")
    c.add_argument("--input", action="append", metavar="NAME=FILE.npy",
                   help="repeatable: the inputs by the forward's parameter names (default: the factory's sample "
                        "inputs, or the .pt2's example inputs)")
    c.add_argument("--signature", default="serving_default", help="the artifact's signature to compare")
    c.add_argument("--tolerance", type=float, default=1e-3, metavar="E",
                   help="the max relative error (max |artifact - torch| / max |torch|) a node may have")
    c.add_argument("--json", action="store_true", help="print the table as JSON (default: a text table)")
    c.add_argument("--overlays", action="store_true",
                   help="also write the numeric overlay beside the artifact (<stem>.overlay.numeric.json) "
                        "(default: not written)")
    c.add_argument("--fail-on-divergence", action="store_true",
                   help="exit 1 when a node is past --tolerance (default: exit 0, the table says it)")
    c.add_argument("--quantize", metavar="SCHEME",
                   help="mixed precision: quantize the float .tflite ARTIFACT with SCHEME (dynamic_int8), keeping the "
                        "ops the output is most sensitive to in float until its error is under --max-rel-err "
                        "(default: no quantization, compare only)")
    c.add_argument("--max-rel-err", type=float, metavar="E",
                   help="with --quantize: the largest output relative error against torch eager (default: none)")
    c.add_argument("-o", "--output", metavar="FILE.tflite",
                   help="with --quantize: where the mixed precision model goes (default: none)")
    c.set_defaults(fn=cmd_compare)
