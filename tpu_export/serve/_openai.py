"""The OpenAI-compatible endpoints (/v1/models, /v1/completions, /v1/chat/completions, streamed as server-sent
events) and the Open Inference Protocol's text form (a BYTES text_input) for LMs. Every field is checked by its
OpenAI name; a field the server does not implement is refused by name rather than ignored."""

from __future__ import annotations

import asyncio
import json
import time
import uuid

from ._http import HttpError, endpoint
from ._models import Aborted, GenResult, RequestError

__all__ = ["chat_completions", "completions", "list_models", "v2_generate"]

_COMMON = {"model", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "stream", "stream_options", "n",
           "user"}
# fields whose only accepted value is the one that asks for nothing (what the OpenAI client may send by default)
_NEUTRAL = {"n": (1,), "echo": (False,), "logprobs": (None, False), "top_logprobs": (None, 0),
            "presence_penalty": (0, 0.0), "frequency_penalty": (0, 0.0), "best_of": (1,), "logit_bias": (None, {}),
            "suffix": (None, ""), "tools": (None, []), "tool_choice": (None, "none"), "parallel_tool_calls": (None,),
            "response_format": (None, {"type": "text"})}
_COMPLETION = _COMMON | {"prompt", "echo", "logprobs", "presence_penalty", "frequency_penalty", "best_of",
                         "logit_bias", "suffix"}
_CHAT = _COMMON | {"messages", "max_completion_tokens", "logprobs", "top_logprobs", "presence_penalty",
                   "frequency_penalty", "logit_bias", "tools", "tool_choice", "parallel_tool_calls", "response_format"}


def _check_fields(body: dict, allowed: set) -> None:
    for k in body:
        if k not in allowed:
            raise RequestError(k, f"is not a field this server takes; it takes {sorted(allowed)}")
        if k in _NEUTRAL and body[k] not in _NEUTRAL[k]:
            raise RequestError(k, f"{body[k]!r} is not implemented here; leave it out (or {_NEUTRAL[k][0]!r})")


def _int_field(body: dict, name: str) -> int | None:
    v = body.get(name)
    if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
        raise RequestError(name, f"must be an integer, got {v!r}")
    return v


def _sampling(body: dict):
    from tpu_export.generate import GenerateArgumentError, Sampling

    temperature = body.get("temperature")
    top_p = body.get("top_p")
    top_k = _int_field(body, "top_k")
    seed = _int_field(body, "seed")
    try:
        return Sampling(temperature=1.0 if temperature is None else temperature, top_k=top_k,
                        top_p=None if top_p in (None, 1) else top_p, seed=seed)
    except GenerateArgumentError as e:
        raise RequestError(e.arg, e.problem) from None


def _stops(body: dict) -> list:
    stop = body.get("stop")
    if stop is None:
        return []
    stop = [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop) or len(stop) > 4:
        raise RequestError("stop", "must be a non-empty string or a list of at most 4 of them")
    return stop


def _stream(body: dict) -> tuple[bool, bool]:
    stream = body.get("stream", False)
    if stream is not None and not isinstance(stream, bool):
        raise RequestError("stream", f"must be true or false, got {stream!r}")
    opts = body.get("stream_options")
    if opts is not None:
        if not stream:
            raise RequestError("stream_options", "is only taken with stream: true")
        if not isinstance(opts, dict) or set(opts) - {"include_usage"} or not isinstance(
                opts.get("include_usage", False), bool):
            raise RequestError("stream_options", "takes {\"include_usage\": true|false} only")
    return bool(stream), bool((opts or {}).get("include_usage"))


def _model(srv, body: dict):
    name = body.get("model")
    if not isinstance(name, str):
        raise RequestError("model", f"must name a served model; served: {sorted(_lms(srv))}")
    return srv.model(name, kind="lm")


def _lms(srv) -> list:
    return [n for n, m in srv.models.items() if m.kind == "lm"]


def _usage(res: GenResult) -> dict:
    return {"prompt_tokens": res.prompt_tokens, "completion_tokens": res.completion_tokens,
            "total_tokens": res.prompt_tokens + res.completion_tokens}


@endpoint("v1_models")
async def list_models(request, srv):
    from starlette.responses import JSONResponse

    return JSONResponse({"object": "list", "data": [
        {"id": n, "object": "model", "created": 0, "owned_by": "tpu-export"} for n in _lms(srv)]})


@endpoint("completions")
async def completions(request, srv):
    body = await srv.read_json(request)
    _check_fields(body, _COMPLETION)
    model = _model(srv, body)
    request.state.model = model.name
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise RequestError("prompt", "must be a string (or a list of one string)")
    return await _run(request, srv, model, body, prompt, chat=False)


@endpoint("chat_completions")
async def chat_completions(request, srv):
    body = await srv.read_json(request)
    _check_fields(body, _CHAT)
    model = _model(srv, body)
    request.state.model = model.name
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages", "must be a non-empty list of {role, content} objects")
    plain = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise RequestError(f"messages[{i}]", "must be an object with a role (string) and a content")
        extra = sorted(set(m) - {"role", "content", "name"})
        if extra:
            raise RequestError(f"messages[{i}].{extra[0]}", "is not taken (role, content, name)")
        content = m.get("content")
        if isinstance(content, list):
            parts = []
            for j, part in enumerate(content):
                if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise RequestError(f"messages[{i}].content[{j}]", "only text parts ({\"type\": \"text\", "
                                                                      "\"text\": ...}) are taken")
                parts.append(part["text"])
            content = "".join(parts)
        if not isinstance(content, str):
            raise RequestError(f"messages[{i}].content", "must be a string or a list of text parts")
        plain.append({"role": m["role"], "content": content})
    if body.get("max_completion_tokens") is not None and body.get("max_tokens") is None:
        body = {**body, "max_tokens": body["max_completion_tokens"]}
    prompt = await asyncio.get_running_loop().run_in_executor(None, model.render_chat, plain)
    return await _run(request, srv, model, body, prompt, chat=True)


async def _run(request, srv, model, body: dict, prompt: str, *, chat: bool):
    from starlette.responses import JSONResponse, StreamingResponse

    stream, include_usage = _stream(body)
    req = model.prepare(prompt, _int_field(body, "max_tokens"), _sampling(body), _stops(body),
                        prompt_field="messages" if chat else "prompt")
    if not chat and body.get("max_tokens") is None:
        req.max_tokens = min(16, req.max_tokens)  # OpenAI's default for completions
    job = srv.new_job(model.name, 1, req)
    ident = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
    created = int(time.time())
    if not stream:
        res: GenResult = await srv.wait(request, job, srv.submit(model.name, job))
        choice = {"index": 0, "finish_reason": res.finish_reason, "logprobs": None}
        if chat:
            choice["message"] = {"role": "assistant", "content": res.text}
        else:
            choice["text"] = res.text
        return JSONResponse({"id": ident, "object": "chat.completion" if chat else "text_completion",
                             "created": created, "model": model.name, "choices": [choice], "usage": _usage(res)})

    loop = asyncio.get_running_loop()
    pieces: asyncio.Queue = asyncio.Queue()
    req.emit = lambda text: loop.call_soon_threadsafe(pieces.put_nowait, text)
    fut = srv.submit(model.name, job)  # a full queue is a 503 before the stream starts
    end = object()
    fut.add_done_callback(lambda f: pieces.put_nowait(end))
    kind = "chat.completion.chunk" if chat else "text_completion"

    def chunk(text: str | None, finish: str | None = None, first: bool = False) -> str:
        if chat:
            delta = {"role": "assistant", "content": ""} if first else ({"content": text} if text else {})
            choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
        else:
            choice = {"index": 0, "text": text or "", "finish_reason": finish, "logprobs": None}
        out = {"id": ident, "object": kind, "created": created, "model": model.name, "choices": [choice]}
        if include_usage:
            out["usage"] = None
        return f"data: {json.dumps(out)}\n\n"

    async def events():
        try:
            if chat:
                yield chunk(None, first=True)
            while True:
                try:
                    item = await asyncio.wait_for(pieces.get(), max(job.deadline - time.monotonic(), 0) + 0.5)
                except TimeoutError:
                    item = None
                if item is end or item is None:
                    break
                yield chunk(item)
            res = (fut.exception() or fut.result()) if fut.done() and not fut.cancelled() else None
            if res is None or isinstance(res, BaseException):
                if isinstance(res, BaseException) and not isinstance(res, Aborted):
                    msg = f"the model failed: {type(res).__name__}: {' '.join(str(res).split())[:300]}"
                    kind_, status = "server_error", 500
                else:
                    if not fut.done():
                        srv.drop(job, fut, "deadline")
                    else:
                        srv.metrics.cancelled.labels(model.name, "deadline").inc()
                    msg, kind_, status = srv.timed_out(job).message, "timeout_error", 504
                err = HttpError(status, msg, kind=kind_)
                yield f"data: {json.dumps({'error': {'message': err.message, 'type': err.kind, 'code': status}})}\n\n"
            else:
                yield chunk(None, res.finish_reason)
                if include_usage:
                    usage = {"id": ident, "object": kind, "created": created, "model": model.name, "choices": [],
                             "usage": _usage(res)}
                    yield f"data: {json.dumps(usage)}\n\n"
            yield "data: [DONE]\n\n"
        finally:  # the client went away (the stream was closed early): stop the generation at its next token
            if not fut.done():
                srv.drop(job, fut, "disconnect")

    return StreamingResponse(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


_V2_PARAMS = {"max_tokens", "temperature", "top_p", "top_k", "seed", "stop"}


async def v2_generate(request, srv, model, body: dict):
    """POST /v2/models/{lm}/infer: one BYTES ``text_input`` tensor in, one ``text_output`` out; generation
    settings as request parameters (the OpenAI names)."""
    from starlette.responses import JSONResponse

    raw = body.get("inputs")
    if (not isinstance(raw, list) or len(raw) != 1 or not isinstance(raw[0], dict)
            or raw[0].get("name") != "text_input"):
        raise RequestError("inputs", f"model {model.name!r} takes one tensor named text_input (BYTES, shape [1])")
    t = raw[0]
    if t.get("datatype") != "BYTES":
        raise RequestError("inputs[0].datatype", f"text_input is BYTES, got {t.get('datatype')!r}")
    if t.get("shape") != [1] or not isinstance(t.get("data"), list) or len(t["data"]) != 1 \
            or not isinstance(t["data"][0], str):
        raise RequestError("inputs[0].data", "text_input takes shape [1] and data [\"the prompt\"]")
    params = body.get("parameters") or {}
    if not isinstance(params, dict):
        raise RequestError("parameters", "must be an object")
    extra = sorted(set(params) - _V2_PARAMS)
    if extra:
        raise RequestError(f"parameters.{extra[0]}", f"is not taken; parameters: {sorted(_V2_PARAMS)}")
    if body.get("outputs") not in (None, [{"name": "text_output"}]):
        raise RequestError("outputs", "the one output is text_output")
    temperature = params.get("temperature")
    params = {**params, "temperature": 0.0 if temperature is None else temperature}  # greedy unless asked
    req = model.prepare(t["data"][0], _int_field(params, "max_tokens"), _sampling(params), _stops(params),
                        prompt_field="inputs[0].data")
    if params.get("max_tokens") is None:
        req.max_tokens = min(16, req.max_tokens)
    job = srv.new_job(model.name, 1, req)
    res: GenResult = await srv.wait(request, job, srv.submit(model.name, job))
    out = {"model_name": model.name, "model_version": "1",
           "outputs": [{"name": "text_output", "datatype": "BYTES", "shape": [1], "data": [res.text]}],
           "parameters": {"finish_reason": res.finish_reason, **_usage(res)}}
    if isinstance(body.get("id"), str):
        out["id"] = body["id"]
    return JSONResponse(out)
