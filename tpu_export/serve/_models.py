"""The models a server holds: a TPU artifact served as tensors in, tensors out (TensorModel, batched where its
batch dim is dynamic), and an LM written by ``convert_lm`` served as text (LMModel). Every request is checked here
against the model's own signature before it joins a batch, so one bad request never fails the others."""

from __future__ import annotations

import dataclasses
import os
import re
import time
from collections.abc import Mapping
from typing import Any, Callable

import numpy as np

from ._batcher import Job
from ._config import ServeConfig, ServeError

__all__ = ["LMModel", "RequestError", "TensorModel", "load_models", "model_name", "named_paths"]

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")

# numpy dtype name -> the Open Inference Protocol's datatype
V2_TYPES = {"float32": "FP32", "float16": "FP16", "bfloat16": "BF16", "float64": "FP64", "int8": "INT8",
            "int16": "INT16", "int32": "INT32", "int64": "INT64", "uint8": "UINT8", "uint16": "UINT16",
            "uint32": "UINT32", "uint64": "UINT64", "bool": "BOOL"}


class RequestError(ValueError):
    """A request the model cannot take: ``field`` names the part of the request (``inputs[0].shape``,
    ``max_tokens``), the message says what is wrong and what it takes."""

    def __init__(self, field: str, problem: str, status: int = 400):
        self.field, self.problem, self.status = field, problem, status
        super().__init__(f"{field}: {problem}")


def _np_dtype(name: str):
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def _to_list(a: np.ndarray) -> list:
    if a.dtype.name == "bfloat16":
        a = a.astype(np.float32)
    return a.reshape(-1).tolist()


# ---------------------------------------------------------------------------------------------------- tensors


class TensorModel:
    """A TPU artifact's default signature behind the Open Inference Protocol. Where every input and output
    shares one dynamic leading dim (the batch), requests are gathered into one call of up to ``max_batch`` rows
    and padded to one of a few sizes (powers of two from 2): every request, alone or batched, runs at a size of
    at least 2, as XLA's CPU backend computes a 1-row matmul as a matrix-vector product whose rounding differs
    from the same row in a larger batch; so a request's result never depends on what it was batched with."""

    kind = "tensor"

    def __init__(self, name: str, path: str, prog, config: ServeConfig):
        self.name, self.path, self.prog = name, path, prog
        self.sig = sig = prog.signature()
        self.platform = prog.platform
        lead = {s.shape[0] if s.shape else None for s in (*sig.inputs, *sig.outputs)}
        sym = next(iter(lead)) if len(lead) == 1 else None
        self.batch_dim = sym if isinstance(sym, str) else None
        lo, hi = sig.dim_ranges.get(self.batch_dim, (1, 1)) if self.batch_dim else (1, 1)
        self.batch_range = (int(lo), int(hi))
        self.max_rows = min(config.max_batch, int(hi)) if self.batch_dim else 1
        self.batched = self.max_rows >= 2
        sizes = set()
        if self.batched:
            b = max(2, int(lo))
            while b < self.max_rows:
                sizes.add(b)
                b *= 2
            sizes.add(self.max_rows)
        self.sizes = sorted(sizes)
        from tpu_export.tpu_backend.artifact import structure

        self._flatten = structure.flatten

    def metadata(self) -> dict:
        def t(s):
            return {"name": s.name, "datatype": V2_TYPES.get(s.dtype, s.dtype.upper()),
                    "shape": [-1 if isinstance(d, str) else int(d) for d in s.shape]}

        return {"name": self.name, "versions": ["1"], "platform": f"tpu-export_{self.platform}",
                "inputs": [t(s) for s in self.sig.inputs], "outputs": [t(s) for s in self.sig.outputs]}

    # requests --------------------------------------------------------------------------------------------

    def parse(self, body: dict) -> tuple[list, int, list]:
        """A V2 infer request's inputs as arrays in signature order, its rows and the outputs it asks for."""
        from tpu_export.converter.input_check import check_inputs

        specs = {s.name: (i, s) for i, s in enumerate(self.sig.inputs)}
        raw = body.get("inputs")
        if not isinstance(raw, list) or not raw:
            raise RequestError("inputs", f"must be a list of tensors; model {self.name!r} takes "
                                         f"{[s.name for s in self.sig.inputs]}")
        given: dict = {}
        for k, t in enumerate(raw):
            where = f"inputs[{k}]"
            if not isinstance(t, dict):
                raise RequestError(where, "must be an object with name, shape, datatype and data")
            extra = sorted(set(t) - {"name", "shape", "datatype", "data", "parameters"})
            if extra:
                raise RequestError(f"{where}.{extra[0]}", "is not a field of a tensor (name, shape, datatype, data, "
                                                          "parameters)")
            if t.get("parameters"):
                raise RequestError(f"{where}.parameters", "no tensor parameters are taken (binary data is not "
                                                          "supported: send the values as JSON in data)")
            name = t.get("name")
            if name not in specs:
                raise RequestError(f"{where}.name", f"{name!r} is not an input of model {self.name!r}; its inputs: "
                                                    f"{list(specs)}")
            if name in given:
                raise RequestError(f"{where}.name", f"input {name!r} is given twice")
            i, spec = specs[name]
            want = V2_TYPES.get(spec.dtype, spec.dtype.upper())
            if t.get("datatype") != want:
                raise RequestError(f"{where}.datatype", f"input {name!r} takes {want}, got {t.get('datatype')!r}")
            shape = t.get("shape")
            if (not isinstance(shape, list) or
                    not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)):
                raise RequestError(f"{where}.shape", f"must be a list of non-negative integers, got {shape!r}")
            given[name] = (where, i, spec, shape, self._values(where, spec, shape, t.get("data")))
        missing = [n for n in specs if n not in given]
        if missing:
            raise RequestError("inputs", f"model {self.name!r} also takes {missing}")
        order = sorted(given.values(), key=lambda g: g[1])
        try:
            arrays = check_inputs(self.sig.name, [g[2].check_spec for g in order], [g[4] for g in order],
                                  self.sig.dim_ranges)
        except (ValueError, TypeError, IndexError) as e:
            msg = str(e)
            field = next((f"{g[0]}.shape" for g in order if f"'{g[2].name}'" in msg), "inputs")
            if isinstance(e, IndexError) or "range" in msg and "dim" not in msg:
                field = field.replace(".shape", ".data")
            raise RequestError(field, msg) from None
        rows = int(arrays[0].shape[0]) if self.batch_dim else 1
        return arrays, rows, self._outputs(body.get("outputs"))

    def _values(self, where: str, spec, shape: list, data) -> np.ndarray:
        if not isinstance(data, list):
            raise RequestError(f"{where}.data", "must be a list of values (row-major, flat or nested)")
        kind = _np_dtype(spec.dtype).kind
        try:
            a = np.asarray(data)
        except ValueError:
            raise RequestError(f"{where}.data", "is a ragged nested list; give a flat row-major list") from None
        n = int(np.prod(shape)) if shape else 1
        if a.size != n:
            raise RequestError(f"{where}.data", f"holds {a.size} values; shape {shape} needs {n}")
        if a.size and a.dtype.kind not in {"b": "b", "i": "iu", "u": "iu", "f": "iuf"}.get(kind, "iuf"):
            what = "booleans" if kind == "b" else "integers" if kind in "iu" else "numbers"
            raise RequestError(f"{where}.data", f"input {spec.name!r} is {spec.dtype}: its values must be {what}")
        if kind in "iu" and a.size:
            info = np.iinfo(_np_dtype(spec.dtype))
            if int(a.min()) < info.min or int(a.max()) > info.max:
                raise RequestError(f"{where}.data", f"a value is outside {spec.dtype}'s range [{info.min}, {info.max}]")
        return a.astype(_np_dtype(spec.dtype)).reshape(shape)

    def _outputs(self, wanted) -> list:
        names = [s.name for s in self.sig.outputs]
        if wanted is None:
            return names
        if not isinstance(wanted, list) or not all(isinstance(w, dict) and isinstance(w.get("name"), str)
                                                   for w in wanted):
            raise RequestError("outputs", "must be a list of {\"name\": ...} objects")
        for k, w in enumerate(wanted):
            if w["name"] not in names:
                raise RequestError(f"outputs[{k}].name", f"{w['name']!r} is not an output of model {self.name!r}; "
                                                         f"its outputs: {names}")
            if w.get("parameters"):
                raise RequestError(f"outputs[{k}].parameters", "no output parameters are taken (binary data is not "
                                                              "supported)")
        return [w["name"] for w in wanted]

    def respond(self, outs: list, wanted: list, body: dict) -> dict:
        by_name = {s.name: (s, a) for s, a in zip(self.sig.outputs, outs)}
        res = {"model_name": self.name, "model_version": "1",
               "outputs": [{"name": n, "datatype": V2_TYPES.get(by_name[n][0].dtype, "FP32"),
                            "shape": list(by_name[n][1].shape), "data": _to_list(by_name[n][1])} for n in wanted]}
        if isinstance(body.get("id"), str):
            res["id"] = body["id"]
        return res

    # running (on the model's thread) ----------------------------------------------------------------------

    def _call(self, arrays: list) -> list:
        out = self.prog.run_on_device(*arrays, signature_name=self.sig.name)
        return [np.asarray(x) for x in self._flatten(self.sig.output_structure, out)]

    def run(self, jobs: list[Job]) -> list:
        """One call for all ``jobs`` (their rows stacked and padded to a compiled size), split back per job; a
        failing batch is run again job by job so that only the job at fault gets the error."""
        if not self.batched:
            return [self._one(j.payload) for j in jobs]
        rows = sum(j.rows for j in jobs)
        size = next((s for s in self.sizes if s >= rows), rows)
        try:
            stacked = []
            for i in range(len(self.sig.inputs)):
                parts = [j.payload[i] for j in jobs]
                if size > rows:
                    parts.append(np.repeat(parts[-1][-1:], size - rows, axis=0))
                stacked.append(np.concatenate(parts, axis=0) if len(parts) > 1 else parts[0])
            outs = self._call(stacked)
        except Exception:  # noqa: BLE001 - re-run one by one: each job gets its own result or error
            if len(jobs) == 1:
                raise
            return [self._one_padded(j) for j in jobs]
        res, at = [], 0
        for j in jobs:
            res.append([o[at:at + j.rows] for o in outs])
            at += j.rows
        return res

    def _one(self, arrays):
        try:
            return self._call(arrays)
        except Exception as e:  # noqa: BLE001 - handed to this request's handler
            return e

    def _one_padded(self, job):
        try:
            return self.run([job])[0]
        except Exception as e:  # noqa: BLE001 - handed to this request's handler
            return e

    def warm_up(self) -> None:
        """Compile each batch size once (zeros), before the server says it is ready."""
        if any(isinstance(d, str) for s in self.sig.inputs for d in s.shape[1:]):
            return  # other dims are dynamic too: nothing to guess
        for size in self.sizes or ([None] if not self.sig.inputs or not self.batch_dim else []):
            arrays = [np.zeros([size if isinstance(d, str) else d for d in s.shape], _np_dtype(s.dtype))
                      for s in self.sig.inputs]
            self._call(arrays)
        if not self.batch_dim and not any(s.is_dynamic for s in self.sig.inputs):
            self._call([np.zeros(s.shape, _np_dtype(s.dtype)) for s in self.sig.inputs])


# ---------------------------------------------------------------------------------------------------- text


class _StopText(Exception):
    """A stop sequence was generated."""


class Aborted(Exception):
    """A generation stopped early: the client went away or the deadline passed (``reason``)."""

    def __init__(self, reason: str):
        self.reason = reason
        super().__init__(reason)


class StopMatcher:
    """Cuts generated text at the first of ``stops``, holding back a tail that could still grow into one (so no
    streamed piece ever shows part of a stop sequence)."""

    def __init__(self, stops: list[str]):
        self.stops = [s for s in stops if s]
        self.hold = max((len(s) for s in self.stops), default=1) - 1
        self.buf = ""

    def feed(self, piece: str) -> tuple[str, bool]:
        self.buf += piece
        hits = [i for i in (self.buf.find(s) for s in self.stops) if i >= 0]
        if hits:
            out, self.buf = self.buf[:min(hits)], ""
            return out, True
        keep = 0
        for k in range(min(self.hold, len(self.buf)), 0, -1):
            if any(s.startswith(self.buf[-k:]) for s in self.stops):
                keep = k
                break
        out, self.buf = self.buf[:len(self.buf) - keep], self.buf[len(self.buf) - keep:]
        return out, False

    def flush(self) -> str:
        out, self.buf = self.buf, ""
        return out


@dataclasses.dataclass
class GenRequest:
    ids: list
    max_tokens: int
    sampling: Any
    stop: list
    emit: Callable[[str], None] | None = None  # streaming: called on the model's thread with each new piece


@dataclasses.dataclass
class GenResult:
    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str
    tokens_per_s: float | None


class TokenText:
    """A generation's new tokens as text: each token decoded with those before it (a byte-level token can end
    inside a UTF-8 character), cut at a stop string (``StopMatcher``), each new piece passed to ``req.emit``."""

    def __init__(self, gen, req: GenRequest, stop_ids):
        self.gen, self.req, self.stop_ids = gen, req, stop_ids
        self.matcher = StopMatcher(req.stop)
        self.pieces: list = []
        self.ids: list = []
        self.fed = 0
        self.count = 0
        self.finish = "length"
        self.cut = False  # a stop string ended the text

    def _send(self, text: str) -> bool:
        out, hit = self.matcher.feed(text)
        if out:
            self.pieces.append(out)
            if self.req.emit is not None:
                self.req.emit(out)
        return hit

    def push(self, t: int) -> bool:
        """Take one new token; True when the generation must stop (a stop token or string)."""
        self.count += 1
        if t in self.stop_ids:
            self.finish = "stop"
            return True
        self.ids.append(t)
        text = self.gen.tokenizer.decode(self.ids, skip_special_tokens=False)
        if text.endswith("\ufffd"):  # a byte-level token ending inside a UTF-8 character: wait for the rest
            return False
        if len(text) > self.fed:
            grown, self.fed = text[self.fed:], len(text)
            if self._send(grown):
                self.finish, self.cut = "stop", True
                return True
        return False

    def close(self) -> str:
        """The whole text (what is held back for a stop string that did not come is sent now)."""
        if not self.cut:
            text = self.gen.tokenizer.decode(self.ids, skip_special_tokens=False)
            if len(text) > self.fed and self._send(text[self.fed:]):
                self.finish, self.cut = "stop", True
                return "".join(self.pieces)
            rest = self.matcher.flush()
            if rest:
                self.pieces.append(rest)
                if self.req.emit is not None:
                    self.req.emit(rest)
        return "".join(self.pieces)


class LMModel:
    """An LM that ``convert_lm`` wrote for a TPU/XLA target, run by the generation loop on PJRT: one request at a
    time, or, converted with ``slots=B``, up to B at once with continuous batching (serve/_slots.py). Text in,
    text out: the OpenAI endpoints, and the Open Inference Protocol with a BYTES ``text_input``."""

    kind = "lm"

    def __init__(self, name: str, path: str, gen, metrics=None, max_batch: int = 32):
        self.name, self.path, self.gen, self._metrics = name, path, gen, metrics
        self.platform = getattr(getattr(gen.runtime, "program", None), "platform", None) or "xla"
        self.cache_len = int(gen.spec.cache_len)
        self.stop_ids = {int(i) for i in gen.meta.get("stop_token_ids") or ()}
        self.chat_template = gen.meta.get("chat_template")
        self.max_rows = 1
        self.batched = False
        self.slots, self.engine = 0, None
        slots = gen.meta.get("slots")
        if slots and max_batch >= 2 and "decode_slots" in getattr(gen.runtime, "signature_names", ()):
            from ._slots import SlotEngine

            self.engine = SlotEngine(gen.runtime, gen.spec, int(slots), name=path, rows=max_batch)
            self.slots = self.max_rows = len(self.engine.free)

    def metadata(self) -> dict:
        return {"name": self.name, "versions": ["1"], "platform": f"tpu-export-lm_{self.platform}",
                "inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1]}],
                "outputs": [{"name": "text_output", "datatype": "BYTES", "shape": [1]}]}

    def render_chat(self, messages: list) -> str:
        from tpu_export.edge.chat_template import ChatTemplateError, render_chat_template

        if not self.chat_template:
            raise RequestError("messages", f"model {self.name!r} has no chat template (its lm.json has none): use "
                                           "/v1/completions")
        try:
            return render_chat_template(self.chat_template, messages, where=f"model {self.name!r}'s chat template")
        except ChatTemplateError as e:
            raise RequestError("messages", str(e)) from None

    def prepare(self, prompt: str, max_tokens: int | None, sampling, stop: list, *, prompt_field: str = "prompt"
                ) -> GenRequest:
        """Tokenize and check a generation before it is queued: 400s name the request's fields."""
        from tpu_export.generate import CacheFullError, GenerateArgumentError, check_generate_args, prefill_lengths
        from tpu_export.targets.lm_runtime import prefill_plan

        fields = {"max_new_tokens": "max_tokens", "prompt": prompt_field}
        try:
            ids = check_generate_args(prompt, max_tokens, sampling, vocab=self.gen.vocab,
                                      tokenize=self.gen.encode)
            n = len(ids)
            try:
                prefill_plan(n - 1, prefill_lengths(self.gen.runtime), self.cache_len)
            except ValueError as e:
                raise RequestError(prompt_field, f"{n} tokens do not fit the model's prefill ({e})") from None
            if max_tokens is None:
                max_tokens = self.cache_len - n + 1
            if n + max_tokens - 1 > self.cache_len:
                raise CacheFullError(f"{n} prompt tokens + {max_tokens} new tokens need {n + max_tokens - 1} cache "
                                     f"slots; the model holds {self.cache_len}: ask for at most "
                                     f"{max(self.cache_len - n + 1, 0)}")
        except GenerateArgumentError as e:
            raise RequestError(fields.get(e.arg, e.arg), e.problem) from None
        if max_tokens < 1:
            raise RequestError(prompt_field, f"{n} tokens fill the model's {self.cache_len}-token cache: shorten it")
        return GenRequest(ids, max_tokens, sampling, stop)

    def run(self, jobs: list[Job]) -> list:
        return [self._generate(j) for j in jobs]

    def _generate(self, job: Job):
        from tpu_export.generate import generate_ids

        req: GenRequest = job.payload
        stream = TokenText(self.gen, req, self.stop_ids)

        def on_token(t: int) -> None:
            if job.cancel.is_set():
                raise Aborted("disconnect")
            if time.monotonic() > job.deadline:
                raise Aborted("deadline")
            if stream.push(t) and stream.cut:
                raise _StopText

        t0 = time.perf_counter()
        try:
            generate_ids(self.gen.runtime, self.gen.spec, req.ids, req.max_tokens, sampling=req.sampling,
                         eos_token_id=self.stop_ids, on_token=on_token)
        except _StopText:
            pass
        except Aborted as e:  # counted by the handler that gave up on it
            return e
        return self._result(req, stream, time.perf_counter() - t0)

    def _result(self, req: GenRequest, stream: TokenText, dt: float) -> GenResult:
        text = stream.close()
        tps = stream.count / dt if dt > 0 and stream.count else None
        if self._metrics is not None:
            self._metrics.prompt_tokens.labels(self.name).inc(len(req.ids))
            self._metrics.generated_tokens.labels(self.name).inc(stream.count)
            if tps:
                self._metrics.tokens_per_s.labels(self.name).set(tps)
        return GenResult(text, len(req.ids), stream.count, stream.finish, tps)

    # continuous batching (serve/_slots.py's SlotScheduler calls these on the engine's thread)

    def start_seq(self, job: Job):
        """A job's SlotSeq for the slot engine, and its text stream."""
        from tpu_export.generate import Sampling

        from ._slots import SlotSeq

        req: GenRequest = job.payload
        stream = TokenText(self.gen, req, self.stop_ids)
        seq = SlotSeq(list(req.ids), req.max_tokens, (req.sampling or Sampling()).picker(),
                      frozenset(self.stop_ids), stream.push)
        seq.started_s = time.perf_counter()
        return seq, stream

    def finish_seq(self, seq, stream: TokenText) -> GenResult:
        return self._result(stream.req, stream, time.perf_counter() - seq.started_s)

    def warm_up(self) -> None:
        """Run each prefill signature and decode once (PJRT compiles a signature on its first call); with slots,
        insert_slot and decode_slots too."""
        from tpu_export.generate import prefill_lengths

        for n in prefill_lengths(self.gen.runtime):
            self.gen._warm_up(n + 1)
        if self.engine is not None:
            self.engine.warm_up()


# ---------------------------------------------------------------------------------------------------- loading


def model_name(path: str) -> str:
    """The name a model is served under when none is given: its file's or folder's name without the artifact
    suffix, the folder above where that is only ``model`` or a target's name (``out/tpu-v6e/model.tpuexp`` ->
    ``out``)."""
    from tpu_export.targets import TARGETS

    p = os.path.abspath(path)
    for _ in range(3):
        base = os.path.basename(p)
        for suffix in (".zip", ".tpuexp"):
            base = base[:-len(suffix)] if base.endswith(suffix) else base
        if base and base != "model" and base not in TARGETS:
            return base
        p = os.path.dirname(p)
    return "model"


def _split(item) -> tuple[str | None, str]:
    item = os.fspath(item)
    name, sep, rest = item.partition("=")
    if sep and _NAME.match(name) and not os.path.lexists(item):
        return name, rest
    return None, item


def named_paths(artifacts) -> dict:
    """``{name: path}`` of ``PATH`` / ``NAME=PATH`` items or a ``{name: path}`` mapping: each name URL-safe and
    unique, each path present (ServeError naming the one that is not)."""
    items = list(artifacts.items()) if isinstance(artifacts, Mapping) else [_split(a) for a in artifacts]
    if not items:
        raise ServeError("artifacts: give at least one artifact to serve")
    out: dict = {}
    for name, path in items:
        path = os.fspath(path)
        name = name or model_name(path)
        if not _NAME.match(name):
            raise ServeError(f"{path}: the model name {name!r} is not URL-safe; name it: NAME={path} (letters, digits, "
                             ". _ -)")
        if name in out:
            raise ServeError(f"{path}: the name {name!r} is taken by {out[name]}; name each: NAME=PATH")
        if not os.path.lexists(path):
            raise ServeError(f"{path}: no such file or folder")
        out[name] = path
    return out


def load_models(artifacts, config: ServeConfig, metrics=None) -> dict:
    """Open every artifact (``PATH`` or ``NAME=PATH``, or a ``{name: path}`` mapping); ServeError naming the one
    that cannot be served."""
    from tpu_export import tpu_backend

    models: dict = {}
    for name, path in named_paths(artifacts).items():
        if path.endswith((".litertlm", ".tflite")):
            raise ServeError(f"{path}: the server runs TPU artifacts (.tpuexp) on PJRT; serve the tpu-v6e (or "
                             "cpu-xla, cuda) folder that convert or convert-lm wrote")
        folder = path if os.path.isdir(path) and not os.path.isfile(os.path.join(path, "manifest.json")) else None
        target = os.path.join(folder, "model.tpuexp") if folder else path
        if folder and not os.path.lexists(target):
            raise ServeError(f"{path}: no model.tpuexp in it; give a .tpuexp artifact or a TPU target folder")
        try:
            if os.path.isfile(os.path.join(os.path.dirname(os.path.abspath(target)), "lm.json")):
                from tpu_export.generators import LoopGenerator

                models[name] = LMModel(name, path, LoopGenerator.from_artifact(target), metrics, config.max_batch)
            else:
                models[name] = TensorModel(name, path, tpu_backend.load(target), config)
        except ServeError:
            raise
        except Exception as e:  # noqa: BLE001 - one line naming the artifact
            msg = " ".join(str(e).split())
            raise ServeError(msg if path in msg or target in msg else f"{path}: {msg}") from e
    return models
