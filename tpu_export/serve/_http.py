"""The HTTP side: Starlette routes for the Open Inference Protocol (v2), the OpenAI endpoints (v1, in _openai) and
/metrics; the API-key guard; body limits; waiting on a queued job while watching for the client to go away."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import json
import time

from ._batcher import Batcher, Job, QueueFull
from ._config import ServeConfig
from ._models import Aborted, RequestError
from ._slots import SlotScheduler

__all__ = ["HttpError", "Server", "build_app"]

_INLINE_JSON = 64 << 10  # bytes of JSON parsed on the event loop itself
OPEN_PATHS = ("/v2/health/",)  # probes answer without the key (a load balancer or kubelet sends none)


class HttpError(Exception):
    """An answer other than 200: its status, message, the request field at fault and extra headers."""

    def __init__(self, status: int, message: str, field: str | None = None, headers: dict | None = None,
                 kind: str = "invalid_request_error"):
        self.status, self.message, self.field, self.headers, self.kind = status, message, field, headers or {}, kind
        super().__init__(message)


class ClientGone(Exception):
    """The client closed the connection before the answer."""


def error_body(path: str, err: HttpError) -> dict:
    """The protocol's error shape: OpenAI's under /v1, ``{"error": message}`` elsewhere (KServe v2)."""
    if path.startswith("/v1"):
        return {"error": {"message": err.message, "type": err.kind, "param": err.field, "code": err.status}}
    return {"error": err.message}


class Server:
    """The state the routes share: models, their batchers, settings, metrics."""

    def __init__(self, models: dict, config: ServeConfig, metrics):
        self.models, self.config, self.metrics = models, config, metrics
        self.ready = False
        self.batchers = {
            name: SlotScheduler(name, m, max_queue=config.max_queue, metrics=metrics)
            if getattr(m, "engine", None) is not None else
            Batcher(name, m.run, max_rows=m.max_rows, timeout_s=config.batch_timeout_ms / 1e3,
                    max_queue=config.max_queue, metrics=metrics)
            for name, m in models.items()}

    def model(self, name: str, kind: str | None = None):
        m = self.models.get(name)
        if m is None or (kind is not None and m.kind != kind):
            have = sorted(n for n, x in self.models.items() if kind is None or x.kind == kind)
            what = "language model" if kind == "lm" else "model"
            raise HttpError(404, f"no {what} {name!r} is served here; served: {have}", field="model",
                            kind="not_found_error")
        return m

    async def read_json(self, request) -> dict:
        limit = self.config.max_body_bytes
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise HttpError(413, f"the request body is {int(declared)} bytes; this server takes at most {limit} "
                                 "(--max-body-mb)", kind="request_too_large")
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise HttpError(413, f"the request body is over {limit} bytes, the most this server takes "
                                     "(--max-body-mb)", kind="request_too_large")
            chunks.append(chunk)
        data = b"".join(chunks)
        try:
            if size > _INLINE_JSON:  # a large body is parsed off the event loop (health probes keep answering)
                body = await asyncio.get_running_loop().run_in_executor(None, json.loads, data)
            else:
                body = json.loads(data)
        except json.JSONDecodeError as e:
            raise HttpError(400, f"body: not valid JSON ({e.msg} at line {e.lineno} column {e.colno})",
                            field="body") from None
        except (UnicodeDecodeError, RecursionError, ValueError):
            raise HttpError(400, "body: not valid JSON (UTF-8, nested at most a few hundred levels)",
                            field="body") from None
        if not isinstance(body, dict):
            raise HttpError(400, "body: must be a JSON object", field="body")
        return body

    def submit(self, name: str, job: Job) -> asyncio.Future:
        try:
            return self.batchers[name].submit(job)
        except QueueFull:
            raise HttpError(503, f"model {name!r} has {self.config.max_queue} requests waiting already (--max-queue); "
                                 "retry later", headers={"Retry-After": "1"}, kind="overloaded_error") from None

    def new_job(self, model: str, rows: int, payload) -> Job:
        return Job(model, rows, payload, time.monotonic() + self.config.request_timeout_s)

    async def wait(self, request, job: Job, fut: asyncio.Future):
        """The job's result; ClientGone when the client leaves first, 504 when the deadline passes first (either
        way the job is dropped from the queue, or its generation stops at the next token)."""
        watcher = asyncio.ensure_future(_disconnected(request))
        try:
            done, _ = await asyncio.wait({fut, watcher}, timeout=max(job.deadline - time.monotonic(), 0),
                                         return_when=asyncio.FIRST_COMPLETED)
        finally:
            watcher.cancel()
        if fut in done:
            if fut.cancelled():  # the worker found its deadline passed just before this timer fired
                self.metrics.cancelled.labels(job.model, "deadline").inc()
                raise self.timed_out(job)
            res = fut.result()
            if isinstance(res, Aborted):  # the deadline passed during a generation
                self.metrics.cancelled.labels(job.model, res.reason).inc()
                raise self.timed_out(job)
            if isinstance(res, BaseException):
                raise res
            return res
        self.drop(job, fut, "disconnect" if watcher in done else "deadline")
        if watcher in done:
            raise ClientGone
        raise self.timed_out(job)

    def timed_out(self, job) -> HttpError:
        return HttpError(504, f"the request took longer than {self.config.request_timeout_s:g} s "
                              "(--request-timeout)", kind="timeout_error")

    def drop(self, job: Job, fut: asyncio.Future, reason: str) -> None:
        job.cancel.set()
        if not fut.done():
            fut.cancel()
        self.metrics.cancelled.labels(job.model, reason).inc()


async def _disconnected(request) -> None:
    """Returns when the client closes the connection (the request body has been read already)."""
    while True:
        msg = await request.receive()
        if msg["type"] == "http.disconnect":
            return


def endpoint(label: str):
    """A route handler's wrapper: errors to their status and the protocol's error body; requests and latency
    counted by model, endpoint and status code."""

    def wrap(fn):
        @functools.wraps(fn)
        async def handler(request):
            from starlette.responses import JSONResponse, Response

            srv: Server = request.app.state.server
            t0 = time.perf_counter()
            model = request.path_params.get("name", "")
            request.state.model = model if model in srv.models else ""  # a label per served model, never per URL
            try:
                response = await fn(request, srv)
            except HttpError as e:
                response = JSONResponse(error_body(request.url.path, e), e.status, headers=e.headers)
            except RequestError as e:
                err = HttpError(e.status, str(e), field=e.field)
                response = JSONResponse(error_body(request.url.path, err), e.status)
            except ClientGone:
                response = Response(status_code=499)
            except Exception as e:  # noqa: BLE001 - a model's own failure on a checked request: 500, one line
                err = HttpError(500, f"the model failed: {type(e).__name__}: {' '.join(str(e).split())[:300]}",
                                kind="server_error")
                response = JSONResponse(error_body(request.url.path, err), 500)
            model = request.state.model
            srv.metrics.requests.labels(model, label, str(response.status_code)).inc()
            srv.metrics.latency.labels(model, label).observe(time.perf_counter() - t0)
            return response

        return handler

    return wrap


# ------------------------------------------------------------------------------------------------ v2 routes


@endpoint("health")
async def live(request, srv):
    from starlette.responses import JSONResponse

    return JSONResponse({"live": True})


@endpoint("health")
async def ready(request, srv):
    from starlette.responses import JSONResponse

    return JSONResponse({"ready": srv.ready}, 200 if srv.ready else 503)


@endpoint("server_metadata")
async def server_metadata(request, srv):
    from starlette.responses import JSONResponse

    from tpu_export.converter._version import __version__

    return JSONResponse({"name": "tpu-export", "version": __version__, "extensions": []})


@endpoint("model_metadata")
async def model_metadata(request, srv):
    from starlette.responses import JSONResponse

    return JSONResponse(srv.model(request.path_params["name"]).metadata())


@endpoint("model_ready")
async def model_ready(request, srv):
    from starlette.responses import JSONResponse

    name = request.path_params["name"]
    srv.model(name)
    return JSONResponse({"name": name, "ready": srv.ready}, 200 if srv.ready else 503)


_V2_FIELDS = {"id", "parameters", "inputs", "outputs"}


@endpoint("infer")
async def infer(request, srv):
    from starlette.responses import JSONResponse

    model = srv.model(request.path_params["name"])
    body = await srv.read_json(request)
    extra = sorted(set(body) - _V2_FIELDS)
    if extra:
        raise RequestError(extra[0], "is not a field of an inference request (id, parameters, inputs, outputs)")
    if model.kind == "lm":
        from ._openai import v2_generate

        return await v2_generate(request, srv, model, body)
    if body.get("parameters"):
        raise RequestError("parameters", "no request parameters are taken by a tensor model")
    arrays, rows, wanted = await asyncio.get_running_loop().run_in_executor(None, model.parse, body)
    job = srv.new_job(model.name, rows, arrays)
    outs = await srv.wait(request, job, srv.submit(model.name, job))
    return JSONResponse(model.respond(outs, wanted, body))


@endpoint("metrics")
async def metrics_text(request, srv):
    from starlette.responses import Response

    text, ctype = srv.metrics.text()
    return Response(text, media_type=ctype)


# ------------------------------------------------------------------------------------------------ the app


class _Guard:
    """The API key (when set) on every path but the health probes: ``Authorization: Bearer KEY`` or
    ``X-API-Key: KEY``, compared in constant time; 401 otherwise."""

    def __init__(self, app, key: str):
        self.app, self.key = app, key.encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and not scope["path"].startswith(OPEN_PATHS):
            headers = dict(scope["headers"])
            auth = headers.get(b"authorization", b"")
            token = auth[7:].strip() if auth[:7].lower() == b"bearer " else headers.get(b"x-api-key", b"")
            if not hmac.compare_digest(token, self.key):
                from starlette.responses import JSONResponse

                err = HttpError(401, "missing or wrong API key: send the header Authorization: Bearer KEY",
                                kind="authentication_error")
                await JSONResponse(error_body(scope["path"], err), 401,
                                   headers={"WWW-Authenticate": "Bearer"})(scope, receive, send)
                return
        await self.app(scope, receive, send)


def build_app(models: dict, config: ServeConfig, metrics):
    """The Starlette application over loaded ``models``."""
    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.routing import Route

    from . import _openai

    srv = Server(models, config, metrics)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        for b in srv.batchers.values():
            b.start()
        for name, m in models.items():  # compile before saying ready: no request pays for a compile
            await srv.batchers[name].call_in_thread(m.warm_up)
        srv.ready = True
        try:
            yield
        finally:
            srv.ready = False
            for b in srv.batchers.values():
                await b.stop()

    routes = [
        Route("/v2/health/live", live, methods=["GET"]),
        Route("/v2/health/ready", ready, methods=["GET"]),
        Route("/v2", server_metadata, methods=["GET"]),
        Route("/v2/models/{name}", model_metadata, methods=["GET"]),
        Route("/v2/models/{name}/ready", model_ready, methods=["GET"]),
        Route("/v2/models/{name}/infer", infer, methods=["POST"]),
        Route("/v1/models", _openai.list_models, methods=["GET"]),
        Route("/v1/completions", _openai.completions, methods=["POST"]),
        Route("/v1/chat/completions", _openai.chat_completions, methods=["POST"]),
        Route("/metrics", metrics_text, methods=["GET"]),
    ]
    middleware = [Middleware(_Guard, key=config.api_key)] if config.api_key else []
    app = Starlette(routes=routes, middleware=middleware, lifespan=lifespan)
    app.state.server = srv
    return app
