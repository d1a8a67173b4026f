"""``app`` (the ASGI application over a set of artifacts) and ``run`` (it, under uvicorn)."""

from __future__ import annotations

import logging
import os
from typing import Any, Mapping, Sequence

from ._config import ServeConfig

__all__ = ["app", "run"]

Artifacts = Sequence[str | os.PathLike] | Mapping[str, str | os.PathLike]


def app(artifacts: Artifacts, *, max_batch: int = 32, batch_timeout_ms: float = 5.0, max_queue: int = 256,
        api_key: str | None = None, request_timeout_s: float = 60.0, max_body_bytes: int = 64 << 20) -> Any:
    """An ASGI application serving TPU artifacts over HTTP, on PJRT (a TPU where there is one, else a GPU, else
    this machine's CPU).

    Every artifact gets the Open Inference Protocol (KServe v2 / Triton): ``GET /v2/models/NAME`` (metadata:
    inputs and outputs with their datatype and shape, -1 for a dynamic dim), ``GET /v2/models/NAME/ready`` and
    ``POST /v2/models/NAME/infer`` with JSON tensors; the server answers ``/v2/health/live``,
    ``/v2/health/ready`` and ``/metrics`` (Prometheus text). An LM written by ``convert_lm`` for a TPU/XLA target
    also gets the OpenAI endpoints ``/v1/models``, ``/v1/completions`` and ``/v1/chat/completions`` (streamed as
    server-sent events with ``"stream": true``). A model whose inputs and outputs share a dynamic leading (batch)
    dim has concurrent requests gathered into one call of up to ``max_batch`` rows. The artifacts are opened
    (and checked) here; each signature is compiled when the application starts, before it reports ready.

    Args:
        artifacts: The artifacts: paths (a ``.tpuexp`` folder or ``.zip``, or a target folder that ``convert`` or
            ``convert_lm`` wrote), each served under its folder's name, or ``"NAME=PATH"`` items, or a
            ``{name: path}`` mapping.
        max_batch: The most rows one call of a dynamic-batch model runs.
        batch_timeout_ms: How long a batch's first request waits for others to join it.
        max_queue: The most requests one model holds waiting; one more is answered 503 with ``Retry-After``.
        api_key: When set, every endpoint but ``/v2/health/*`` needs ``Authorization: Bearer KEY`` (401 otherwise).
        request_timeout_s: Each request's deadline (504 when it passes; a generation stops at its next token).
        max_body_bytes: The largest request body taken (413 above it).

    Returns:
        A Starlette application: run it with any ASGI server (``uvicorn.run(application)``), or use ``run``.

    Raises:
        tpu_export.serve.ServeError: A setting out of its range, two artifacts under one name, or an artifact that
            cannot be served (no such file, a ``.tflite`` or ``.litertlm``, an artifact that does not load); the
            message names it (a ValueError).

    Examples:
        >>> import os, tempfile, torch
        >>> import tpu_export
        >>> from tpu_export import serve
        >>> out = tempfile.mkdtemp()
        >>> _ = tpu_export.convert(torch.nn.Linear(4, 2).eval(), (torch.ones(2, 4),),
        ...                        targets={"tpu-v6e": {"aot": False}}, out_dir=out)
        >>> application = serve.app([f"linear={out}/tpu-v6e"], max_batch=8)   # uvicorn.run(application)
        >>> serve.app([os.path.join(out, "missing.tpuexp")])
        Traceback (most recent call last):
        ...
        tpu_export.serve._config.ServeError: .../missing.tpuexp: no such file or folder
    """
    from ._http import build_app
    from ._metrics import Metrics
    from ._models import load_models

    config = ServeConfig(max_batch=max_batch, batch_timeout_ms=batch_timeout_ms, max_queue=max_queue,
                         api_key=api_key, request_timeout_s=request_timeout_s, max_body_bytes=max_body_bytes)
    metrics = Metrics()
    return build_app(load_models(artifacts, config, metrics), config, metrics)


def run(artifacts: Artifacts, *, host: str = "127.0.0.1", port: int = 8000, log_level: str = "info",
        **settings: Any) -> None:
    """Serve ``artifacts`` with uvicorn until SIGINT or SIGTERM; on either the server stops taking connections,
    finishes the requests in flight, then returns.

    Args:
        artifacts: As for ``app``.
        host: The address to listen on (the loopback interface unless told otherwise).
        port: The TCP port.
        log_level: uvicorn's log level (``"warning"`` for quiet).
        **settings: ``app``'s keyword arguments (``max_batch``, ``api_key``...).

    Raises:
        tpu_export.serve.ServeError: As for ``app``.
    """
    import uvicorn

    sock = _bind(host, port)  # before the models load and compile: a taken port fails at once
    try:
        application = app(artifacts, **settings)
        # asyncio and h11 by name: uvicorn's "auto" picks uvloop and httptools when installed (Ray Serve brings
        # both), and the server's behaviour should not hang on what else is in the environment
        config = uvicorn.Config(application, host=host, port=port, log_level=log_level, loop="asyncio", http="h11",
                                timeout_graceful_shutdown=None)
        bound = sock.getsockname()
        url = f"http://{f'[{bound[0]}]' if ':' in bound[0] else bound[0]}:{bound[1]}"
        logging.getLogger("uvicorn.error").info(
            "tpu-export serve: %s on %s (ready once startup completes; Ctrl+C or SIGTERM drains and stops)",
            ", ".join(application.state.server.models), url)
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        sock.close()


def _bind(host: str, port: int):
    import socket

    from ._config import ServeError

    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as e:
        raise ServeError(f"host {host!r}: {e.strerror}; give an address (127.0.0.1, 0.0.0.0, ::1) or a known "
                         "name") from None
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(addr)
    except OSError as e:
        sock.close()
        raise ServeError(f"port {port} on {host}: {e.strerror}; pick another port (or stop what holds it)") from None
    return sock
