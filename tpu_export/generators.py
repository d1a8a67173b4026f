"""Text in, text out, from what ``convert-lm`` wrote: streamed token by token, with prefill and decode timings.

    gen = load_generator("out/tpu-v6e")             # or out/tpu-v6e/model.tpuexp, out/android/model.tflite,
    res = gen.generate("the cache", max_new_tokens=32, sampling=Sampling(temperature=0.7, top_k=40, seed=1),
                       on_text=lambda s: print(s, end=""))
    res.text, res.prefill_ms, res.decode_tokens_per_s

- ``LoopGenerator``: a TPU artifact (PJRT: TPU, GPU or CPU) or a ``.tflite`` (LiteRT interpreter) run by
  tpu_export.generate's loop, with the ``tokenizer.json`` and ``lm.json`` written beside it (targets/lm.py).
- ``EngineGenerator``: a ``.litertlm`` bundle run by the LiteRT-LM engine (``litert_lm.Engine``): its own
  tokenizer, stop tokens, prompt template, prefill/decode loop and sampler (top_k / top_p / temperature / seed).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Callable

from .generate import CacheFullError, Sampling, generate_ids

__all__ = ["EngineGenerator", "GeneratorError", "LoopGenerator", "TextResult", "load_generator"]


class GeneratorError(ValueError):
    """An artifact that cannot be generated from; the message names the file and the fix."""


@dataclasses.dataclass
class TextResult:
    text: str
    prompt_tokens: int | None
    new_tokens: int
    prefill_ms: float | None
    decode_tokens_per_s: float | None
    tokens: list | None = None  # the new token ids (LoopGenerator; the engine gives text)
    warm_up_ms: float | None = None  # LoopGenerator: first calls (compiling) before the timed run

    def timing_line(self) -> str:
        pre = f"{self.prefill_ms:.1f} ms" if self.prefill_ms is not None else "n/a"
        dec = f"{self.decode_tokens_per_s:.1f} tokens/s" if self.decode_tokens_per_s else "n/a"
        warm = f"; warm-up (compile) {self.warm_up_ms:.0f} ms, not counted" if self.warm_up_ms else ""
        return (f"prefill: {pre} ({self.prompt_tokens if self.prompt_tokens is not None else '?'} tokens); "
                f"decode: {dec} ({self.new_tokens} new tokens){warm}")


def load_generator(path, *, quiet: bool = False) -> "LoopGenerator | EngineGenerator":
    """A ``.litertlm`` -> the LiteRT-LM engine; a TPU artifact (``.tpuexp``) or ``.tflite`` -> our loop; a target
    folder written by convert-lm -> whichever of those it holds (the ``.litertlm`` first). ``quiet``: the engine
    logs errors only (a process-wide setting of its library)."""
    path = os.fspath(path)
    if os.path.isdir(path) and not os.path.isfile(os.path.join(path, "manifest.json")):
        for f in ("model.litertlm", "model.tpuexp", "model.tflite"):
            if os.path.exists(os.path.join(path, f)):
                return load_generator(os.path.join(path, f), quiet=quiet)
        raise GeneratorError(f"{path}: no model.litertlm, model.tpuexp or model.tflite in it; give a folder or "
                             "file written by `tpu-export convert-lm`")
    if not os.path.exists(path):
        raise GeneratorError(f"{path}: no such file or folder")
    if path.endswith(".litertlm"):
        return EngineGenerator(path, quiet=quiet)
    return LoopGenerator.from_artifact(path)


def _detokenizer(tok, on_text, stops):
    """A per-token callback that streams the new text: decodes all new ids each time and emits what grew (a
    byte-level BPE token can end inside a UTF-8 character, which decodes as U+FFFD until the next one). Special
    tokens other than the stop tokens are text, as the LiteRT-LM engine prints them."""
    ids, sent = [], [0]

    def on_token(t):
        if t in stops:
            return
        ids.append(t)
        text = tok.decode(ids, skip_special_tokens=False)
        if text.endswith("\ufffd"):
            return
        if on_text is not None and len(text) > sent[0]:
            on_text(text[sent[0]:])
        sent[0] = len(text)

    return on_token


class LoopGenerator:
    """An exported LM run by tpu_export.generate: ``runtime`` as generate_ids takes it, its CacheSpec, a
    tokenizers.Tokenizer and the lm.json metadata (stop tokens, chat template)."""

    def __init__(self, runtime, spec, tokenizer, meta: dict, name: str = "the model"):
        self.runtime, self.spec, self.tokenizer, self.meta, self.name = runtime, spec, tokenizer, meta, name
        self._warm: set = set()  # signatures run once already (compiled)

    @classmethod
    def from_artifact(cls, path: str) -> "LoopGenerator":
        import torch

        from tpu_export.converter.llm import CacheSpec

        folder = os.path.dirname(os.path.abspath(path))
        meta_path = os.path.join(folder, "lm.json")
        try:
            with open(meta_path, encoding="utf-8") as f:
                meta = json.load(f)
            c = meta["cache"]
            spec = CacheSpec(int(c["num_layers"]), int(c["kv_heads"]), int(c["cache_len"]), int(c["head_dim"]),
                             getattr(torch, str(c.get("dtype", "float32"))))
        except FileNotFoundError:
            raise GeneratorError(f"{path}: no lm.json beside it (cache shapes, stop tokens); generate from the "
                                 "folder `tpu-export convert-lm` wrote") from None
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise GeneratorError(f"{meta_path}: not a valid lm.json ({e}); convert the model again") from None
        tok_path = os.path.join(folder, "tokenizer.json")
        if not os.path.isfile(tok_path):
            raise GeneratorError(f"{path}: no tokenizer.json beside it; convert from a model directory with one "
                                 "(or pass tokenizer= to convert_lm)")
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(tok_path)
        if path.endswith(".tflite"):
            from tpu_export import litert_torch

            runtime = litert_torch.load(path)
        else:
            from tpu_export import tpu_backend
            from tpu_export.tpu_backend.llm import OnDeviceLM

            # the caches stay on the device between steps, donated: each step updates them in place
            runtime = OnDeviceLM(tpu_backend.load(path), spec.names())
        return cls(runtime, spec, tok, meta, name=path)

    def encode(self, prompt: str, chat: bool = False) -> list[int]:
        if chat:
            prompt = render_chat(self.meta.get("chat_template"), prompt, self.name)
        return self.tokenizer.encode(prompt).ids

    def generate(self, prompt: str, max_new_tokens: int = 32, *, sampling: Sampling | None = None, chat=False,
                 on_text: Callable[[str], None] | None = None) -> TextResult:
        ids = self.encode(prompt, chat)
        warm_ms = self._warm_up(len(ids))
        stops = {int(i) for i in self.meta.get("stop_token_ids") or ()}
        run = generate_ids(self.runtime, self.spec, ids, max_new_tokens, sampling=sampling, eos_token_id=stops,
                           on_token=_detokenizer(self.tokenizer, on_text, stops))
        text = self.tokenizer.decode([t for t in run.tokens if t not in stops], skip_special_tokens=False)
        return TextResult(text, len(ids), len(run.tokens), run.prefill_ms, run.decode_tokens_per_s, run.tokens,
                          warm_ms)

    def _warm_up(self, n: int) -> float | None:
        """Run the prefill that fits ``n`` tokens and decode once on zeros, the first time each is used, so that
        the timings are of running, not of compiling (PJRT compiles a signature on its first call). Returns the
        milliseconds spent, None when nothing was new."""
        import torch

        from .generate import prefill_lengths

        fits = [L for L in prefill_lengths(self.runtime) if L >= n - 1]  # the loop prefills all tokens but the last
        todo = [(f"prefill_{fits[0]}", fits[0])] if fits and n > 1 else []
        todo = [(s, t) for s, t in todo + [("decode", 1)] if s not in self._warm]
        if not todo:
            return None
        t0 = time.perf_counter()
        caches = self.spec.zeros()
        for sig, t in todo:
            # decode is warmed with a prefill's returned caches, as the loop calls it (device arrays on PJRT)
            out = self.runtime(torch.zeros(1, t, dtype=torch.int32), torch.arange(t, dtype=torch.int32),
                               signature_name=sig, **caches)
            caches = {k: out[k] for k in self.spec.names()}
            self._warm.add(sig)
        return (time.perf_counter() - t0) * 1e3


def render_chat(template: str | None, prompt: str, where: str) -> str:
    """The prompt as one user turn of the model's chat template (jinja, rendered sandboxed as transformers does),
    with the generation prompt added."""
    if not template:
        raise GeneratorError(f"{where}: the model has no chat template; drop --chat")
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(template).render(messages=[{"role": "user", "content": prompt}],
                                            add_generation_prompt=True, bos_token="", eos_token="")


_ALL_TOKENS = 1 << 20  # top_k when none is given: the engine's own default is 1 (greedy)


class EngineGenerator:
    """A ``.litertlm`` run by the LiteRT-LM engine on this machine's CPU."""

    def __init__(self, path: str, threads: int | None = None, quiet: bool = False):
        import litert_lm

        if quiet:  # the engine logs every section it does not find at WARNING; process-wide, so only when asked
            litert_lm.set_min_log_severity(litert_lm.LogSeverity.ERROR)
        self.path, self._meta = path, None
        backend = litert_lm.Backend.CPU(thread_count=threads) if threads else litert_lm.Backend.CPU()
        try:
            self.engine = litert_lm.Engine(path, backend=backend, enable_benchmark=True)
        except RuntimeError as e:
            raise GeneratorError(f"{path}: the LiteRT-LM engine cannot load it ({e}); is it a .litertlm bundle "
                                 "written by convert-lm or litert-lm-builder?") from None

    def generate(self, prompt: str, max_new_tokens: int = 32, *, sampling: Sampling | None = None, chat=False,
                 on_text: Callable[[str], None] | None = None) -> TextResult:
        import litert_lm

        s = sampling or Sampling()
        # greedy is top-k 1 in the engine's top-p sampler
        cfg = (litert_lm.SamplerConfig(top_k=1, top_p=1.0, temperature=1.0, seed=0) if s.greedy else
               litert_lm.SamplerConfig(top_k=s.top_k or _ALL_TOKENS, top_p=s.top_p or 1.0,
                                       temperature=s.temperature, seed=s.seed))
        if chat:  # rendered here, as for our loop: the session API does not apply the bundle's template itself
            prompt = render_chat(self._llm_meta().get("jinja_prompt_template"), prompt, self.path)
        limit, n = self._llm_meta().get("max_num_tokens"), len(self.engine.tokenize(prompt))
        # the engine counts prompt + reply against max_num_tokens and stops short silently past it: say it first
        if limit and n + max_new_tokens > int(limit):
            raise CacheFullError(f"{n} prompt tokens + {max_new_tokens} new tokens exceed {self.path}'s max_num_tokens "
                                 f"{limit}: lower max_new_tokens or re-export with a longer cache")
        session = self.engine.create_session(apply_prompt_template=False, sampler_config=cfg,
                                             max_output_tokens=max_new_tokens)
        try:
            t0 = time.perf_counter()
            session.run_prefill([prompt])
            prefill_ms = (time.perf_counter() - t0) * 1e3
            parts = []
            for r in session.run_decode_async():
                for t in r.texts:
                    parts.append(t)
                    if on_text is not None:
                        on_text(t)
            info = session.get_benchmark_info()
        finally:
            session.close()
        tps = info.last_decode_tokens_per_second or None
        if info.last_prefill_tokens_per_second:  # the engine's own figure, without the Python call around it
            prefill_ms = info.last_prefill_token_count / info.last_prefill_tokens_per_second * 1e3
        return TextResult("".join(parts), info.last_prefill_token_count or None, info.last_decode_token_count,
                          prefill_ms, tps)

    def _llm_meta(self) -> dict:
        """The bundle's LlmMetadata (max_num_tokens, stop tokens, jinja_prompt_template) as a dict."""
        if self._meta is None:
            from tpu_export.edge.litertlm import read_litertlm

            self._meta = next((sec["metadata"] for sec in read_litertlm(self.path)["sections"]
                               if sec["type"] == "LlmMetadataProto" and "metadata" in sec), {})
        return self._meta
