"""``ray_app``: the server's ASGI application as a Ray Serve deployment of N replicas (the ``ray`` extra), and
``run_ray``, which starts it on a local or running Ray cluster behind Ray Serve's HTTP proxy."""

from __future__ import annotations

import contextlib
import json
import logging
import os
from typing import Any

from ._config import ServeConfig, ServeError, _positive_int
from ._server import Artifacts

__all__ = ["ray_app", "run_ray", "proxy_middlewares", "REPLICA_HEADER", "PROXY_CALLBACK_ENV"]

REPLICA_HEADER = "x-tpu-export-replica"  # which replica answered: Ray Serve's replica id
DEPLOYMENT = "tpu-export"
# Ray Serve reads this in its HTTP proxy (the cluster's environment) to install proxy_middlewares' middleware.
PROXY_CALLBACK_ENV = "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH"
PROXY_CALLBACK = "tpu_export.serve._ray.proxy_middlewares"


def _resolved(artifacts: Artifacts) -> dict:
    """``{name: absolute path}``, checked as far as the driver can without loading (a replica's working directory
    need not be the driver's)."""
    from ._models import named_paths

    return {name: os.path.abspath(path) for name, path in named_paths(artifacts).items()}


class _ReplicaHeader:
    """Adds ``x-tpu-export-replica: ID`` to every HTTP answer, so a client (or a test) sees which replica served
    it; passes lifespan events through untouched."""

    def __init__(self, app, replica: str):
        self.app, self.replica = app, replica.encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def send_with_id(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []),
                                                   (REPLICA_HEADER.encode(), self.replica)]}
            await send(message)

        await self.app(scope, receive, send_with_id)


class _RetryableWhenUnanswered:
    """In Ray Serve's HTTP proxy: a request whose replica died before answering (killed, out of memory, its
    host lost) ends in the proxy with no response at all, which uvicorn turns into a bare 500. This answers it
    503 with ``Retry-After: 1`` instead: nothing was answered, the other replicas (or the replacement) take the
    retry. A response a replica began is passed through untouched (a model's own failure stays a 500)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = False

        async def watch(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, watch)
        except Exception:  # noqa: BLE001 - unanswered: logged, then the 503 below (raising would drop the connection)
            if started:
                raise
            logging.getLogger("ray.serve").exception("tpu-export: a request failed before its replica answered")
        if not started:
            body = json.dumps({"error": "the replica serving this request stopped before answering; retry "
                                        "(another replica or its replacement takes it)"}).encode()
            with contextlib.suppress(Exception):  # the client may be gone too
                await send({"type": "http.response.start", "status": 503,
                            "headers": [(b"content-type", b"application/json"), (b"retry-after", b"1"),
                                        (b"content-length", str(len(body)).encode())]})
                await send({"type": "http.response.body", "body": body})


def proxy_middlewares() -> list:
    """The middleware Ray Serve's HTTP proxy installs when ``$RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH`` is
    ``tpu_export.serve._ray.proxy_middlewares`` in the cluster's environment (``run_ray`` sets it for a
    cluster it starts): a request whose replica died before answering gets 503 with ``Retry-After``, not 500.

    Returns:
        A list of one ``starlette.middleware.Middleware``.
    """
    from starlette.middleware import Middleware

    return [Middleware(_RetryableWhenUnanswered)]


def _deployment_class():
    from ray import serve

    @serve.ingress()
    class TpuExportReplica:
        """One replica: ``tpu_export.serve.app`` over the artifacts, built (and compiled, in its lifespan) on the
        replica's own devices."""

        def __init__(self, artifacts: dict, settings: dict):
            self._artifacts, self._settings = artifacts, settings

        def __serve_build_asgi_app__(self):
            from tpu_export.serve._server import app

            replica = serve.get_replica_context().replica_id.unique_id
            return _ReplicaHeader(app(self._artifacts, **self._settings), replica)

    return TpuExportReplica


def ray_app(artifacts: Artifacts, *, num_replicas: int = 1, ray_actor_options: dict | None = None,
            max_ongoing_requests: int | None = None, name: str = DEPLOYMENT, **settings: Any) -> Any:
    """The server of ``app`` as a Ray Serve application of ``num_replicas`` replicas: each replica runs the same
    ASGI application (every endpoint, batching, metrics) on its own devices, and Ray Serve's HTTP proxy spreads
    requests over the replicas and replaces a replica that dies.

    Args:
        artifacts: As for ``app`` (paths are made absolute here: replicas may run in another directory).
        num_replicas: How many replicas (processes), each loading and compiling every artifact.
        ray_actor_options: Ray's resources per replica, e.g. ``{"resources": {"TPU": 4}}`` for one TPU host's
            four chips, or ``{"num_cpus": 1}`` (the default) on CPU.
        max_ongoing_requests: The most requests Ray hands one replica at a time (default: ``max_queue`` +
            ``max_batch``, so that the replica's own queue, not Ray, decides when to answer 503).
        name: The deployment's name (Ray's dashboard and logs).
        **settings: ``app``'s keyword arguments (``max_batch``, ``api_key``...).

    Returns:
        A ``ray.serve.Application``: ``ray.serve.run(application, route_prefix="/")`` serves it.

    Raises:
        tpu_export.serve.ServeError: A setting out of its range, a missing artifact, two artifacts under one
            name, or an unknown keyword (the message names it); the artifacts are loaded on the replicas.
        ImportError: Ray Serve is not installed (``pip install "tpu-export[ray]"``).
    """
    try:
        from ray import serve
    except ImportError:
        raise ImportError('ray_app needs Ray Serve: pip install "tpu-export[ray]"') from None
    known = {f.name for f in ServeConfig.__dataclass_fields__.values()}
    unknown = sorted(set(settings) - known)
    if unknown:
        raise ServeError(f"{unknown[0]}: not a setting of tpu_export.serve.app; it takes {sorted(known)}")
    config = ServeConfig(**settings)
    _positive_int(num_replicas, "num_replicas")
    if max_ongoing_requests is None:
        max_ongoing_requests = config.max_queue + config.max_batch
    _positive_int(max_ongoing_requests, "max_ongoing_requests")
    resolved = _resolved(artifacts)
    deployment = serve.deployment(
        _deployment_class(), name=name, num_replicas=num_replicas,
        ray_actor_options=dict(ray_actor_options) if ray_actor_options is not None else {"num_cpus": 1},
        max_ongoing_requests=max_ongoing_requests,
        # compiling every signature happens in the replica's startup: give it time before Ray calls it failed
        health_check_period_s=10, health_check_timeout_s=60, graceful_shutdown_timeout_s=config.request_timeout_s)
    return deployment.bind(resolved, settings)


def run_ray(artifacts: Artifacts, *, host: str = "127.0.0.1", port: int = 8000, address: str | None = None,
            num_replicas: int = 1, ray_actor_options: dict | None = None, log_level: str = "info",
            **settings: Any) -> None:
    """Serve ``artifacts`` on Ray Serve until SIGINT or SIGTERM: attach to the Ray cluster at ``address`` (or
    start a local one), start Serve's HTTP proxy on ``host:port`` and deploy ``ray_app``; on a signal the
    application is deleted (replicas finish their requests in flight) and a cluster started here stops.

    Args:
        artifacts: As for ``app``.
        host: The address Ray Serve's proxy listens on (the loopback interface unless told otherwise).
        port: Its TCP port.
        address: A running Ray cluster (``"auto"``, ``"ray://head:10001"``); None starts a local one.
        num_replicas: As for ``ray_app``.
        ray_actor_options: As for ``ray_app``.
        log_level: The replicas' log level (``"warning"`` for quiet).
        **settings: ``app``'s keyword arguments.

    Raises:
        tpu_export.serve.ServeError: As for ``ray_app``, or when the replicas do not start (the message says why).
    """
    import signal
    import threading

    import ray
    from ray import serve

    application = ray_app(artifacts, num_replicas=num_replicas, ray_actor_options=ray_actor_options, **settings)
    started = not ray.is_initialized()
    if started:
        if address is None:  # the local cluster's processes (its HTTP proxy) inherit this environment
            os.environ.setdefault(PROXY_CALLBACK_ENV, PROXY_CALLBACK)
        try:
            ray.init(address=address, include_dashboard=False, logging_level=log_level.upper())
        except (ConnectionError, ValueError, RuntimeError) as e:
            where = f"the Ray cluster at {address}" if address else "a local Ray cluster"
            raise ServeError(f"address: could not start or reach {where}: {' '.join(str(e).split())[:300]}; "
                             "check the address (ray status) or leave it out to start a local one") from None
    stop = threading.Event()
    previous = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        serve.start(http_options={"host": host, "port": port})
        try:
            serve.run(application, name=DEPLOYMENT, route_prefix="/",
                      logging_config={"log_level": log_level.upper()})
        except RuntimeError as e:  # Ray's "deploying ... failed" carries the replica's traceback: keep its last line
            last = [ln for ln in str(e).strip().splitlines() if ln.strip()][-1:] or [type(e).__name__]
            raise ServeError(f"the Ray replicas did not start: {last[0].strip()}") from e
        url = f"http://{f'[{host}]' if ':' in host else host}:{port}"
        print(f"tpu-export serve --ray: {num_replicas} replica(s) on {url} (Ctrl+C or SIGTERM stops)", flush=True)
        while not stop.wait(1.0):
            pass
        serve.delete(DEPLOYMENT)
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        if started:
            serve.shutdown()
            ray.shutdown()
