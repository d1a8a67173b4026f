"""``tpu-export serve``: TPU artifacts behind HTTP (tpu_export.serve); cli.py adds it to its parser."""

from __future__ import annotations

import ipaddress
import os
import sys

__all__ = ["add_parser", "cmd_serve"]

API_KEY_ENV = "TPU_EXPORT_API_KEY"


def cmd_serve(a) -> int:
    from .cli_check import CliError

    for flag, value, low in (("--max-batch", a.max_batch, 1), ("--max-queue", a.max_queue, 1),
                             ("--port", a.port, 0), ("--max-body-mb", a.max_body_mb, 1)):
        if value < low:
            raise CliError(f"{flag} takes an integer >= {low}, got {value}")
    if a.port > 65535:
        raise CliError(f"--port takes 0..65535, got {a.port}")
    if a.batch_timeout_ms < 0:
        raise CliError(f"--batch-timeout-ms takes a number >= 0, got {a.batch_timeout_ms:g}")
    if not a.request_timeout > 0:
        raise CliError(f"--request-timeout takes seconds > 0, got {a.request_timeout:g}")
    key = a.api_key if a.api_key is not None else os.environ.get(API_KEY_ENV) or None
    if key is not None and (not key.strip() or any(c.isspace() for c in key)):
        raise CliError(f"--api-key (or ${API_KEY_ENV}) must be a non-empty word without spaces")
    if key is None and not _loopback(a.host):
        print(f"tpu-export serve: warning: listening on {a.host} without --api-key: anyone who reaches this port "
              "can run the models", file=sys.stderr)
    settings = dict(max_batch=a.max_batch, batch_timeout_ms=a.batch_timeout_ms, max_queue=a.max_queue, api_key=key,
                    request_timeout_s=a.request_timeout, max_body_bytes=a.max_body_mb << 20)
    ray_flags = [f for f, v in (("--replicas", a.replicas), ("--ray-address", a.ray_address),
                                ("--replica-resources", a.replica_resources)) if v is not None]
    if not a.ray:
        if ray_flags:
            raise CliError(f"{ray_flags[0]} is a Ray Serve setting: add --ray (or drop {ray_flags[0]})")
        from .serve import ServeError, run

        try:
            run(a.artifact, host=a.host, port=a.port, log_level=a.log_level, **settings)
        except ServeError as e:
            raise CliError(_in_cli_words(str(e))) from None
        return 0
    return _serve_ray(a, settings)


def _serve_ray(a, settings: dict) -> int:
    from .cli_check import CliError

    if a.port == 0:
        raise CliError("--port 0 (any free port) is not taken with --ray: Ray Serve's proxy needs a fixed port; "
                       "give one (--port 8000)")
    replicas = 1 if a.replicas is None else a.replicas
    if replicas < 1:
        raise CliError(f"--replicas takes an integer >= 1, got {replicas}")
    options = _replica_resources(a.replica_resources) if a.replica_resources is not None else None
    try:
        import ray  # noqa: F401
        from ray import serve as _  # noqa: F401
    except ImportError:
        raise CliError('--ray needs Ray Serve: pip install "tpu-export[ray]"') from None
    from .serve import ServeError, run_ray

    try:
        run_ray(a.artifact, host=a.host, port=a.port, address=a.ray_address, num_replicas=replicas,
                ray_actor_options=options, log_level=a.log_level, **settings)
    except ServeError as e:
        raise CliError(_in_cli_words(str(e))) from None
    return 0


def _replica_resources(text: str) -> dict:
    """``TPU=4,CPU=8`` -> Ray's actor options: CPU and GPU by their own keys, any other name a custom resource."""
    from .cli_check import CliError

    options: dict = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        name, eq, value = item.partition("=")
        try:
            amount = float(value)
        except ValueError:
            amount = -1.0
        if not eq or not name.strip() or not amount >= 0:
            raise CliError(f"--replica-resources: {item!r} is not NAME=AMOUNT (e.g. TPU=4 or CPU=2,GPU=1)")
        name = name.strip()
        if name == "CPU":
            options["num_cpus"] = amount
        elif name == "GPU":
            options["num_gpus"] = amount
        else:
            options.setdefault("resources", {})[name] = amount
    if not options:
        raise CliError("--replica-resources: give NAME=AMOUNT items (e.g. TPU=4)")
    return options


def _in_cli_words(msg: str) -> str:
    for py, flag in (("max_batch", "--max-batch"), ("batch_timeout_ms", "--batch-timeout-ms"),
                     ("max_queue", "--max-queue"), ("api_key", "--api-key"), ("request_timeout_s", "--request-timeout"),
                     ("max_body_bytes", "--max-body-mb"), ("artifacts:", "ARTIFACT:"), ("port ", "--port "),
                     ("num_replicas", "--replicas"), ("address:", "--ray-address:"),
                     ("host ", "--host ")):
        if msg.startswith(py):
            return flag + msg[len(py):]
    return msg


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def add_parser(sub, examples) -> None:
    s = sub.add_parser(
        "serve", help="serve TPU artifacts over HTTP (KServe v2, OpenAI for LMs)",
        description="Serve each ARTIFACT over HTTP on PJRT (a TPU where there is one, else a GPU, else the CPU): the "
                    "Open Inference Protocol (KServe v2 / Triton: /v2/models/NAME/infer with JSON tensors) for "
                    "every artifact, the OpenAI endpoints (/v1/completions, /v1/chat/completions, streamed with "
                    "\"stream\": true) for an LM written by convert-lm, and /metrics (Prometheus). Requests to a "
                    "model with a dynamic batch dim are batched. SIGTERM or Ctrl-C finishes the requests in flight, "
                    "then exits.",
        epilog=examples(
            "# served as 'out' (the folder above the target folder) on http://127.0.0.1:8000",
            "tpu-export serve out/tpu-v6e",
            "# two models, named; batches of up to 64 rows gathered for at most 2 ms",
            "tpu-export serve resnet=out/tpu-v6e/model.tpuexp chat=out_lm/tpu-v6e --max-batch 64 "
            "--batch-timeout-ms 2",
            "# on every interface, behind a key (or $TPU_EXPORT_API_KEY)",
            "tpu-export serve out_lm/tpu-v6e --host 0.0.0.0 --port 8080 --api-key \"$KEY\"",
            "# four replicas on a local Ray cluster, one TPU host's 4 chips each (pip install \"tpu-export[ray]\")",
            "tpu-export serve out/tpu-v6e --ray --replicas 4 --replica-resources TPU=4"))
    s.add_argument("artifact", nargs="+", metavar="ARTIFACT",
                   help="a .tpuexp folder or .zip, or a target folder of convert / convert-lm; NAME=PATH names the "
                        "model (default: the folder's name, the one above a target folder)")
    s.add_argument("--host", default="127.0.0.1", help="the address to listen on (0.0.0.0: every interface)")
    s.add_argument("--port", type=int, default=8000, help="the TCP port")
    s.add_argument("--max-batch", type=int, default=32, metavar="N",
                   help="the most rows one call of a dynamic-batch model runs")
    s.add_argument("--batch-timeout-ms", type=float, default=5.0, metavar="T",
                   help="how long a batch's first request waits for others")
    s.add_argument("--max-queue", type=int, default=256, metavar="Q",
                   help="the most requests a model holds waiting; beyond it: 503 with Retry-After")
    s.add_argument("--api-key", metavar="K",
                   help=f"require Authorization: Bearer K on every endpoint but /v2/health/* (default: "
                        f"${API_KEY_ENV}, else none)")
    s.add_argument("--request-timeout", type=float, default=60.0, metavar="S",
                   help="each request's deadline in seconds (504 after it)")
    s.add_argument("--max-body-mb", type=int, default=64, metavar="MB", help="the largest request body (413 above)")
    s.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"],
                   help="uvicorn's log level (with --ray: the replicas')")
    r = s.add_argument_group("Ray Serve (the ray extra)")
    r.add_argument("--ray", action="store_true",
                   help="serve through Ray Serve: --replicas copies of the same server behind Ray's HTTP proxy on "
                        "--host/--port; a replica that dies is replaced")
    r.add_argument("--replicas", type=int, metavar="N", help="with --ray: how many replicas (default 1)")
    r.add_argument("--ray-address", metavar="ADDR",
                   help="with --ray: a running Ray cluster (auto, ray://head:10001); default: start a local one")
    r.add_argument("--replica-resources", metavar="R",
                   help="with --ray: each replica's Ray resources, NAME=AMOUNT items: TPU=4 (one v6e host's chips), "
                        "CPU=2, GPU=1 (default CPU=1)")
    s.set_defaults(fn=cmd_serve)
