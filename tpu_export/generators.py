"""Text in, text out, from what ``convert-lm`` wrote: streamed token by token, with prefill and decode timings.

    gen = load_generator("out/tpu-v6e")             # or out/tpu-v6e/model.tpuexp, out/android/model.tflite,
    res = gen.generate("the cache", max_new_tokens=32, sampling=Sampling(temperature=0.7, top_k=40, seed=1),
                       on_text=lambda s: print(s, end=""))
    res.text, res.prefill_ms, res.decode_tokens_per_s

- ``LoopGenerator``: a TPU artifact (PJRT: TPU, GPU or CPU) or a ``.tflite`` (LiteRT interpreter) run by
  tpu_export.generate's loop, with the ``tokenizer.json`` and ``lm.json`` written beside it (targets/lm.py).
- ``EngineGenerator``: a ``.litertlm`` bundle run by the LiteRT-LM engine (``litert_lm.Engine``): its own
  tokenizer, stop tokens, prompt template, prefill/decode loop and sampler (top_k / top_p / temperature / seed).
  The bundle is checked first (edge.litertlm_check); ``isolate=True`` runs the engine in a child process, so
  that bytes the check cannot judge (weights) that crash it end as one GeneratorError naming the signal.

All three check their arguments with the one tpu_export.generate.check_generate_args; chat templates render
within edge.chat_template's limits; lm.json is read bounded and must describe the model file's own caches.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from typing import Callable

from .generate import CacheFullError, GenerateArgumentError, Sampling, check_generate_args, generate_ids

__all__ = ["EngineGenerator", "GeneratorError", "LoopGenerator", "TextResult", "load_generator"]


class GeneratorError(ValueError):
    """An artifact that cannot be generated from; the message names the file and the fix."""


@dataclasses.dataclass
class TextResult:
    """What a generation returns: the text and its timings.

    Attributes:
        text: The generated text (without the prompt and the stop token).
        prompt_tokens: The prompt's length in tokens (None where the engine does not say).
        new_tokens: How many tokens were generated.
        prefill_ms: The prompt's prefill time in milliseconds.
        decode_tokens_per_s: Decode speed in tokens per second.
        tokens: The new token ids (from a TPU artifact or ``.tflite``; the LiteRT-LM engine gives text only).
        warm_up_ms: The first calls' time (compiling), spent before the timed run and not counted in it.
    """

    text: str
    prompt_tokens: int | None
    new_tokens: int
    prefill_ms: float | None
    decode_tokens_per_s: float | None
    tokens: list | None = None  # the new token ids (LoopGenerator; the engine gives text)
    warm_up_ms: float | None = None  # LoopGenerator: first calls (compiling) before the timed run

    def timing_line(self) -> str:
        """One line with the prefill time and the decode speed, as ``tpu-export generate`` prints it."""
        pre = f"{self.prefill_ms:.1f} ms" if self.prefill_ms is not None else "n/a"
        dec = f"{self.decode_tokens_per_s:.1f} tokens/s" if self.decode_tokens_per_s else "n/a"
        warm = f"; warm-up (compile) {self.warm_up_ms:.0f} ms, not counted" if self.warm_up_ms else ""
        return (f"prefill: {pre} ({self.prompt_tokens if self.prompt_tokens is not None else '?'} tokens); "
                f"decode: {dec} ({self.new_tokens} new tokens){warm}")


def load_generator(path: str | os.PathLike[str], *, verbose: bool = False, isolate: bool = False,
                   isolate_timeout: float | None = None) -> LoopGenerator | EngineGenerator:
    """Open what ``convert_lm`` wrote for text generation.

    A ``.litertlm`` bundle runs on the LiteRT-LM engine (``EngineGenerator``); a TPU artifact (``model.tpuexp``)
    or a ``.tflite`` runs on this project's generation loop (``LoopGenerator``), with the ``lm.json`` and
    ``tokenizer.json`` written beside it. A TPU artifact runs on jax's default backend (a TPU, else a GPU, else
    this machine's CPU). A target folder opens whichever of those it holds, the ``.litertlm`` first. Every file
    is checked before a runtime reads it.

    Args:
        path: A target folder written by ``convert_lm`` (``out/android``, ``out/tpu-v6e``), or a ``.litertlm``,
            ``.tpuexp`` or ``.tflite`` file in one.
        verbose: Show the LiteRT-LM engine's own log lines (by default they are held back, and only their last
            line joins an error).
        isolate: Run the LiteRT-LM engine in a child process, so that a bundle whose bytes crash it ends as one
            ``GeneratorError`` naming the signal (``.litertlm`` only).
        isolate_timeout: With ``isolate``: the most seconds between the child's answers (default 60).

    Returns:
        A generator: ``.generate(prompt, max_new_tokens)`` returns a ``TextResult``.

    Raises:
        tpu_export.generators.GeneratorError: Nothing to generate from at ``path`` (no such file, no model in the
            folder, no ``lm.json`` or ``tokenizer.json`` beside it, or a file that cannot be read), or ``isolate``
            for a file that is not a ``.litertlm`` (a ValueError; the message names the file and the fix).
        tpu_export.edge.litertlm_check.BundleFormatError: The ``.litertlm`` is not a well-formed bundle (a
            ValueError).

    Examples:
        ``model_dir`` is a Hugging Face model directory (here a tiny seeded Llama):

        >>> import os, tempfile
        >>> import tpu_export
        >>> out = os.path.join(tempfile.mkdtemp(), "out")
        >>> _ = tpu_export.convert_lm(model_dir, {"android": {}, "tpu-v6e": {"aot": False}}, out,
        ...                           prefill_lengths=(8,), cache_len=64)
        >>> engine = tpu_export.load_generator(os.path.join(out, "android"))     # the .litertlm: LiteRT-LM
        >>> loop = tpu_export.load_generator(os.path.join(out, "tpu-v6e"))       # the TPU artifact, here on CPU
        >>> type(engine).__name__, type(loop).__name__
        ('EngineGenerator', 'LoopGenerator')
        >>> result = loop.generate("hello", max_new_tokens=4)
        >>> isinstance(result.text, str), result.new_tokens <= 4
        (True, True)
    """
    path = os.fspath(path)
    if os.path.isdir(path) and not os.path.isfile(os.path.join(path, "manifest.json")):
        for f in ("model.litertlm", "model.tpuexp", "model.tflite"):
            if os.path.exists(os.path.join(path, f)):
                return load_generator(os.path.join(path, f), verbose=verbose, isolate=isolate,
                                      isolate_timeout=isolate_timeout)
        raise GeneratorError(f"{path}: no model.litertlm, model.tpuexp or model.tflite in it; give a folder or "
                             "file written by `tpu-export convert-lm`")
    if not os.path.lexists(path):
        raise GeneratorError(f"{path}: no such file or folder")
    if path.endswith(".litertlm"):
        return EngineGenerator(path, verbose=verbose, isolate=isolate,
                               isolate_timeout=DEFAULT_ISOLATE_TIMEOUT if isolate_timeout is None else isolate_timeout)
    if isolate:
        raise GeneratorError(f"{path}: isolate runs the LiteRT-LM engine of a .litertlm in a child process; a "
                             ".tflite is checked structurally before the interpreter sees it and a TPU artifact's "
                             "isolation is `tpu-export inspect --isolate`: drop --isolate")
    return LoopGenerator.from_artifact(path)


_CACHE_DTYPES = ("float32", "bfloat16", "float16")


def _read_beside(folder: str, name: str, cap: str) -> bytes:
    """A file beside the model (lm.json, tokenizer.json), read by converter.untrusted's rule inside ``folder``:
    a regular file, no link out of the folder, at most the ``cap`` limit's bytes."""
    from tpu_export.converter.untrusted import UntrustedFileError, limit, read_bytes

    try:
        return read_bytes(name, root=folder, what=name, max_bytes=limit(cap), cap_name=cap)
    except UntrustedFileError as e:
        if e.reason == "missing":
            raise FileNotFoundError(e.path) from None
        raise GeneratorError(str(e)) from None


def _bounded_int(value, name: str, where: str, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise GeneratorError(f"{where}: {name} is {value!r}; it must be an integer in [{lo}, {hi}]: convert the "
                             "model again")
    return value


def read_lm_json(folder: str) -> tuple[dict, "object"]:
    """lm.json beside an exported LM, read bounded and checked field by field before anything is sized from it:
    (the metadata, its CacheSpec). The cache's shape is checked against the model's own inputs afterwards
    (``_check_cache``)."""
    import torch

    from tpu_export.converter.llm import CacheSpec

    meta_path = os.path.join(folder, "lm.json")
    data = _read_beside(folder, "lm.json", "json")
    try:
        meta = json.loads(data)
    except (ValueError, RecursionError) as e:
        raise GeneratorError(f"{meta_path}: not JSON ({type(e).__name__}: {' '.join(str(e).split())[:120]}); "
                             "convert the model again") from None
    c = meta.get("cache") if isinstance(meta, dict) else None
    if not isinstance(c, dict):
        raise GeneratorError(f"{meta_path}: no 'cache' entry (num_layers, kv_heads, cache_len, head_dim); convert "
                             "the model again")
    dims = [_bounded_int(c.get(k), f"cache.{k}", meta_path, 1, 1 << 24)
            for k in ("num_layers", "kv_heads", "cache_len", "head_dim")]
    # V's width: lm.json files before it was written have K and V alike
    v_width = _bounded_int(c.get("v_head_dim", dims[3]), "cache.v_head_dim", meta_path, 1, 1 << 24)
    dtype = c.get("dtype", "float32")
    if dtype not in _CACHE_DTYPES:
        raise GeneratorError(f"{meta_path}: cache.dtype is {dtype!r}; one of {list(_CACHE_DTYPES)}: convert the "
                             "model again")
    stops = meta.get("stop_token_ids") or []
    if not isinstance(stops, list):
        raise GeneratorError(f"{meta_path}: stop_token_ids is {stops!r}, not a list of token ids")
    for i in stops:
        _bounded_int(i, "a stop token id", meta_path, 0, (1 << 31) - 1)
    template = meta.get("chat_template")
    if template is not None and not isinstance(template, str):
        raise GeneratorError(f"{meta_path}: chat_template is a {type(template).__name__}, not text")
    protocol = meta.get("cache_protocol", 1)  # lm.json files before it was written: the batch-1 signatures
    if protocol not in (1, 2) or isinstance(protocol, bool):
        raise GeneratorError(f"{meta_path}: cache_protocol is {protocol!r:.40}; this tpu-export runs 1 and 2: "
                             "upgrade tpu-export or convert the model again")
    if meta.get("slots") is not None:
        _bounded_int(meta["slots"], "slots", meta_path, 1, 1024)
    kv_layers, states = _states(c, dims[0], meta_path)
    return meta, CacheSpec(*dims, getattr(torch, dtype), v_head_dim=v_width, kv_layers=kv_layers, states=states)


def _states(c: dict, num_layers: int, meta_path: str) -> tuple:
    """lm.json's ``cache.kv_layers`` (the attention layers' indices; absent: every layer) and ``cache.states``
    ({name: shape without the batch axis}, the state beside the KV cache, e.g. a convolution's window)."""
    layers = c.get("kv_layers")
    if layers is not None:
        if not isinstance(layers, list) or len(layers) > num_layers:
            raise GeneratorError(f"{meta_path}: cache.kv_layers is {str(layers)[:80]}, not a list of at most "
                                 f"{num_layers} layer indices; convert the model again")
        layers = tuple(_bounded_int(i, "a cache.kv_layers index", meta_path, 0, num_layers - 1) for i in layers)
    states = c.get("states") or {}
    if not isinstance(states, dict) or len(states) > num_layers:
        raise GeneratorError(f"{meta_path}: cache.states is {str(states)[:80]}, not a map of at most {num_layers} "
                             "state names to shapes; convert the model again")
    checked = []
    for name, shape in states.items():
        if not (isinstance(name, str) and name.replace("_", "").isalnum() and len(name) <= 64) or \
                not isinstance(shape, list) or not 1 <= len(shape) <= 4:
            raise GeneratorError(f"{meta_path}: cache.states entry {str(name)[:64]!r}: {str(shape)[:80]} is not "
                                 "a state name and a shape of 1 to 4 sizes; convert the model again")
        checked.append((name, tuple(_bounded_int(d, f"cache.states.{name}", meta_path, 1, 1 << 24) for d in shape)))
    return layers, tuple(checked)


def _check_cache(spec, inputs: dict, meta_path: str, model: str) -> None:
    """lm.json's caches are the model's own: every kv_cache_* input of its decode signature, the same shape and
    dtype, and nothing more (the loop allocates what lm.json says; the model file, checked, says what it is)."""
    want = {n: (tuple(shape), str(spec.dtype).replace("torch.", "")) for n, shape in spec.shapes().items()}
    have = {n: v for n, v in inputs.items() if n not in ("tokens", "input_pos")}  # the state: all the rest
    if want != have:
        diff = sorted(set(want.items()) ^ set(have.items()))[:2]
        width = spec.head_dim if spec.v_width == spec.head_dim else f"{spec.head_dim} (K) / {spec.v_width} (V)"
        raise GeneratorError(f"{meta_path}: its cache ({spec.num_layers} layers x {spec.kv_heads} heads x "
                             f"{spec.cache_len} slots x {width}, {want and next(iter(want.values()))[1]}) is "
                             f"not {model}'s decode inputs (first differences: {diff}); convert the model again")
    from tpu_export.converter.machine import physical_memory

    need = 2 * spec.nbytes  # the loop holds the caches it passes in and the ones it gets back
    mem = physical_memory()
    if mem is not None and need > mem:
        raise GeneratorError(f"{meta_path}: its caches need {need >> 20} MiB (in and out), more than this machine's "
                             f"{mem >> 20} MiB of memory")


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
    """An exported LM (a TPU artifact or a ``.tflite``) run by this project's generation loop.

    ``load_generator`` makes one. It holds the runtime (the loaded artifact or model), the cache layout, the
    tokenizer and the ``lm.json`` metadata (stop tokens, chat template).
    """

    def __init__(self, runtime, spec, tokenizer, meta: dict, name: str = "the model", vocab: int | None = None):
        self.runtime, self.spec, self.tokenizer, self.meta, self.name = runtime, spec, tokenizer, meta, name
        # top_k's bound: the model's logits width where known, else the tokenizer's
        self.vocab = vocab if vocab is not None else tokenizer.get_vocab_size()
        self._warm: set = set()  # signatures run once already (compiled)

    @classmethod
    def from_artifact(cls, path: str) -> "LoopGenerator":
        folder = os.path.dirname(os.path.abspath(path))
        try:
            meta, spec = read_lm_json(folder)
        except FileNotFoundError:
            raise GeneratorError(f"{path}: no lm.json beside it (cache shapes, stop tokens); generate from the "
                                 "folder `tpu-export convert-lm` wrote") from None
        tok_path = os.path.join(folder, "tokenizer.json")
        if not os.path.lexists(tok_path):
            raise GeneratorError(f"{path}: no tokenizer.json beside it; convert from a model directory with one "
                                 "(or pass tokenizer= to convert_lm)")
        from tokenizers import Tokenizer

        text = _read_beside(folder, "tokenizer.json", "tokenizer")
        try:
            tok = Tokenizer.from_str(text.decode("utf-8"))
        except Exception as e:  # noqa: BLE001 - the Rust parser's own error class
            raise GeneratorError(f"{tok_path}: not a readable tokenizer.json ({type(e).__name__}: "
                                 f"{' '.join(str(e).split())[:120]}); convert the model again") from None
        from tpu_export.targets.lm_runtime import open_lm_runtime

        runtime, inputs, outputs = open_lm_runtime(path, spec)
        _check_cache(spec, inputs, os.path.join(folder, "lm.json"), path)
        logits = outputs.get("logits")
        vocab = int(logits[-1]) if logits and isinstance(logits[-1], int) else tok.get_vocab_size()
        return cls(runtime, spec, tok, meta, name=path, vocab=vocab)

    def encode(self, prompt: str, chat: bool = False) -> list[int]:
        if chat:
            where = os.path.join(os.path.dirname(os.path.abspath(self.name)), "lm.json") + "'s chat_template"
            prompt = render_chat(self.meta.get("chat_template"), prompt, where)
        return self.tokenizer.encode(prompt).ids

    def generate(self, prompt: str, max_new_tokens: int = 32, *, sampling: Sampling | None = None,
                 chat: bool = False, on_text: Callable[[str], None] | None = None) -> TextResult:
        """Generate text from ``prompt`` with the exported prefill and decode signatures.

        The first call of each signature compiles it (a TPU artifact); that time is reported as ``warm_up_ms``
        and not counted in the timings.

        Args:
            prompt: The prompt text (valid UTF-8).
            max_new_tokens: The most tokens to generate (at least 1); generation also stops at a stop token.
            sampling: How the next token is picked: ``Sampling(temperature=..., top_k=..., top_p=..., seed=...)``;
                None (or temperature 0): greedy.
            chat: Render the prompt as one user turn of the model's chat template first.
            on_text: Called with each new piece of text as it is generated (streaming).

        Returns:
            The generated text with its token count and timings.

        Raises:
            tpu_export.generate.GenerateArgumentError: An argument is out of its range (a ValueError naming it).
            tpu_export.generate.PromptTooLongError: A chunk of the prompt's prefill would run past the cache.
            tpu_export.generate.CacheFullError: The prompt and the new tokens need more cache slots than the model
                holds.

        Examples:
            ``model_dir`` is a Hugging Face model directory (here a tiny seeded Llama):

            >>> import os, tempfile
            >>> import tpu_export
            >>> from tpu_export.generate import Sampling
            >>> out = os.path.join(tempfile.mkdtemp(), "out")
            >>> _ = tpu_export.convert_lm(model_dir, {"tpu-v6e": {"aot": False}}, out, prefill_lengths=(8,),
            ...                           cache_len=64)
            >>> gen = tpu_export.load_generator(os.path.join(out, "tpu-v6e"))
            >>> pieces = []
            >>> result = gen.generate("hello", 8, sampling=Sampling(temperature=0.7, top_k=40, seed=1),
            ...                       on_text=pieces.append)
            >>> "".join(pieces) == result.text, result.new_tokens == len(result.tokens)
            (True, True)
            >>> gen.generate("hello", 0)
            Traceback (most recent call last):
            ...
            tpu_export.generate.GenerateArgumentError: max_new_tokens: ...
        """
        ids = check_generate_args(prompt, max_new_tokens, sampling, vocab=self.vocab,
                                  tokenize=lambda p: self.encode(p, chat))
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
    """The prompt as one user turn of the model's chat template, with the generation prompt added: sandboxed and
    bounded in time and size (edge.chat_template); ``where`` names the template's file or field."""
    if not template:
        raise GeneratorError(f"{where}: the model has no chat template; drop --chat")
    from tpu_export.edge.chat_template import render_chat_template

    return render_chat_template(template, [{"role": "user", "content": prompt}], where=where)


_ALL_TOKENS = 1 << 20  # top_k when none is given: the engine's own default is 1 (greedy)


DEFAULT_ISOLATE_TIMEOUT = 60.0  # seconds between the isolated engine's answers (a token, the load)
_START_TIMEOUT = 300.0  # the child's imports (~1 s, far longer on a loaded machine) are not the bundle's fault
_TAG = "@@tpu-export-engine"
_NO_CACHE = ":nocache"  # LiteRT-LM's cache_dir for no weight cache file at all


class _EngineLog:
    """The engine's log lines (absl / LiteRT write to file descriptor 2 directly, past sys.stderr), held in a
    temporary file while it loads and runs unless ``verbose``; ``tail()`` is their last line for an error. fd 2
    is the process's: anything else writing to it meanwhile is held too."""

    def __init__(self, verbose: bool):
        self.verbose, self.file, self._saved = verbose, None, None

    def __enter__(self):
        if not self.verbose:
            import tempfile

            sys.stderr.flush()
            self.file = tempfile.TemporaryFile()
            self._saved = os.dup(2)
            os.dup2(self.file.fileno(), 2)
        return self

    def __exit__(self, *exc):
        if self._saved is not None:
            os.dup2(self._saved, 2)
            os.close(self._saved)
            self._saved = None

    def tail(self, prefix: str = "; its last log line: ") -> str:
        from tpu_export.converter.child_process import stderr_tail

        return stderr_tail(self.file, prefix) if self.file is not None else ""


class EngineGenerator:
    """A ``.litertlm`` bundle run by the LiteRT-LM engine on this machine's CPU.

    ``load_generator`` makes one. The bundle is checked before the engine reads a byte of it. With
    ``isolate``, each generate runs the engine in a child process (a crash there is a ``GeneratorError`` naming
    the signal; no answer for ``isolate_timeout`` seconds kills it). The engine brings its own tokenizer, stop
    tokens and sampler.
    """

    def __init__(self, path: str, threads: int | None = None, verbose: bool = False, isolate: bool = False,
                 isolate_timeout: float = DEFAULT_ISOLATE_TIMEOUT, cache_dir: str | None = None):
        from tpu_export.edge.litertlm_check import check_litertlm

        if isolate and not isolate_timeout > 0:
            raise GeneratorError(f"isolate_timeout must be a positive number of seconds, got {isolate_timeout!r}")
        # the engine's XNNPACK weight cache: by default none, neither written beside the bundle nor read from there
        # (a cache file named after the bundle's mtime and size would be loaded unchecked, and a bundle rewritten
        # with the same mtime and size would run stale weights); ``cache_dir``: a folder of the caller's own
        self.path, self.threads, self.verbose, self.cache_dir = path, threads, verbose, cache_dir
        self.isolate, self.isolate_timeout = isolate, isolate_timeout
        info = check_litertlm(path)  # BundleFormatError, one line, before the engine reads a byte
        self.vocab = info["vocab"]
        self._meta = next((sec["metadata"] for sec in info["sections"]
                           if sec["type"] == "LlmMetadataProto" and "metadata" in sec), {})
        self.engine = None if isolate else self._create_engine()

    def _create_engine(self):
        import litert_lm

        if not self.verbose:  # process-wide: the engine logs every section it does not find at WARNING
            litert_lm.set_min_log_severity(litert_lm.LogSeverity.ERROR)
        backend = litert_lm.Backend.CPU(thread_count=self.threads) if self.threads else litert_lm.Backend.CPU()
        with _EngineLog(self.verbose) as log:
            try:
                return litert_lm.Engine(self.path, backend=backend, enable_benchmark=True,
                                        cache_dir=self.cache_dir or _NO_CACHE)
            except RuntimeError as e:
                raise GeneratorError(f"{self.path}: the LiteRT-LM engine cannot load it ({' '.join(str(e).split())}"
                                     f"{log.tail()}); is it a .litertlm bundle written by convert-lm or "
                                     "litert-lm-builder?") from None

    def generate(self, prompt: str, max_new_tokens: int = 32, *, sampling: Sampling | None = None,
                 chat: bool = False, on_text: Callable[[str], None] | None = None) -> TextResult:
        """Generate text from ``prompt`` on the LiteRT-LM engine.

        Args:
            prompt: The prompt text (valid UTF-8).
            max_new_tokens: The most tokens to generate (at least 1); generation also stops at a stop token.
            sampling: How the next token is picked: ``Sampling(temperature=..., top_k=..., top_p=..., seed=...)``;
                None (or temperature 0): greedy.
            chat: Render the prompt as one user turn of the model's chat template first.
            on_text: Called with each new piece of text as it is generated (streaming).

        Returns:
            The generated text with its token count and timings.

        Raises:
            tpu_export.generate.GenerateArgumentError: An argument is out of its range (a ValueError naming it).
            tpu_export.generate.CacheFullError: The prompt and the new tokens exceed the bundle's max tokens.
            tpu_export.generators.GeneratorError: The engine failed to start a session or to generate.

        Examples:
            ``model_dir`` is a Hugging Face model directory (here a tiny seeded Llama):

            >>> import os, tempfile
            >>> import tpu_export
            >>> out = os.path.join(tempfile.mkdtemp(), "out")
            >>> _ = tpu_export.convert_lm(model_dir, ["android"], out, prefill_lengths=(8,), cache_len=64)
            >>> gen = tpu_export.load_generator(os.path.join(out, "android"))
            >>> result = gen.generate("hello", max_new_tokens=4)
            >>> isinstance(result.text, str), 1 <= result.new_tokens <= 4
            (True, True)
            >>> gen.generate("hello", max_new_tokens=100)
            Traceback (most recent call last):
            ...
            tpu_export.generate.CacheFullError: max_new_tokens: ... exceed ...'s max_num_tokens 64: ...
        """
        if self.isolate:
            check_generate_args(prompt, max_new_tokens, sampling, vocab=self.vocab)  # before a child starts
            return _generate_isolated(self, prompt, max_new_tokens, sampling, chat, on_text)
        import litert_lm

        s = sampling or Sampling()
        text = {}

        def tokenize(p):
            if chat:  # rendered here, as for our loop: the session API does not apply the bundle's template itself
                p = render_chat(self._llm_meta().get("jinja_prompt_template"), p,
                                f"{self.path}'s jinja_prompt_template")
            text["prompt"] = p
            return self.engine.tokenize(p)

        n = len(check_generate_args(prompt, max_new_tokens, s, vocab=self.vocab, tokenize=tokenize))
        prompt = text["prompt"]
        # greedy is top-k 1 in the engine's top-p sampler
        cfg = (litert_lm.SamplerConfig(top_k=1, top_p=1.0, temperature=1.0, seed=0) if s.greedy else
               litert_lm.SamplerConfig(top_k=s.top_k or _ALL_TOKENS, top_p=s.top_p or 1.0,
                                       temperature=s.temperature, seed=s.seed))
        limit = self._llm_meta().get("max_num_tokens")
        # the engine counts prompt + reply against max_num_tokens and stops short silently past it: say it first
        if limit and n + max_new_tokens > int(limit):
            raise CacheFullError(f"{n} prompt tokens + {max_new_tokens} new tokens exceed {self.path}'s max_num_tokens "
                                 f"{limit}: ask for fewer new tokens or re-export with a longer cache")
        with _EngineLog(self.verbose) as log:
            try:
                session = self.engine.create_session(apply_prompt_template=False, sampler_config=cfg,
                                                     max_output_tokens=max_new_tokens)
            except RuntimeError as e:
                raise GeneratorError(f"{self.path}: the LiteRT-LM engine cannot start a session "
                                     f"({' '.join(str(e).split())}{log.tail()})") from None
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
            except RuntimeError as e:
                raise GeneratorError(f"{self.path}: the LiteRT-LM engine failed while generating "
                                     f"({' '.join(str(e).split())}{log.tail()})") from None
            finally:
                session.close()
        tps = info.last_decode_tokens_per_second or None
        if info.last_prefill_tokens_per_second:  # the engine's own figure, without the Python call around it
            prefill_ms = info.last_prefill_token_count / info.last_prefill_tokens_per_second * 1e3
        return TextResult("".join(parts), info.last_prefill_token_count or None, info.last_decode_token_count,
                          prefill_ms, tps)

    def _llm_meta(self) -> dict:
        """The bundle's LlmMetadata (max_num_tokens, stop tokens, jinja_prompt_template) as a dict."""
        return self._meta


# the child of EngineGenerator(isolate=True): one request on stdin, tagged lines out (payloads hex-coded JSON)
_CHILD = "from tpu_export.generators import _serve_isolated; _serve_isolated()"
_RAISED = {"GenerateArgumentError": lambda d: GenerateArgumentError(d["arg"], d["problem"]),
           "CacheFullError": lambda d: CacheFullError(d["problem"])}


def _say(kind: str, payload) -> None:
    sys.stdout.write(f"{_TAG} {kind} {json.dumps(payload).encode().hex()}\n")
    sys.stdout.flush()


def _serve_isolated() -> None:
    req = json.loads(sys.stdin.read())
    _say("ready", None)
    try:
        gen = EngineGenerator(req["path"], threads=req["threads"], verbose=req["verbose"], cache_dir=req["cache_dir"])
        s = req["sampling"]
        res = gen.generate(req["prompt"], req["max_new_tokens"], sampling=Sampling(**s) if s else None,
                           chat=req["chat"], on_text=lambda t: _say("text", t))
    except (GeneratorError, CacheFullError, GenerateArgumentError, ValueError) as e:
        _say("err", {"class": type(e).__name__, "message": str(e), "arg": getattr(e, "arg", None),
                     "problem": getattr(e, "problem", None)})
        sys.exit(3)
    _say("done", dataclasses.asdict(res))


def _generate_isolated(gen: EngineGenerator, prompt, max_new_tokens, sampling, chat, on_text) -> TextResult:
    import queue
    import tempfile

    from tpu_export.converter.child_process import TaggedChild, exit_status, signal_name, stderr_tail

    req = {"path": os.path.abspath(gen.path), "threads": gen.threads, "verbose": gen.verbose, "prompt": prompt,
           "cache_dir": gen.cache_dir and os.path.abspath(gen.cache_dir),
           "max_new_tokens": max_new_tokens, "chat": chat,
           "sampling": dataclasses.asdict(sampling) if sampling is not None else None}
    with tempfile.TemporaryDirectory(prefix="tpu-export-engine-") as tmp, \
            open(os.path.join(tmp, "stderr"), "w+b") as err:
        try:
            child = TaggedChild([sys.executable, "-c", _CHILD], tag=_TAG, stderr=None if gen.verbose else err,
                                cwd=tmp, stdin=subprocess.PIPE)
        except OSError as e:
            raise GeneratorError(f"{gen.path}: cannot start the isolated LiteRT-LM engine ({sys.executable!r}: "
                                 f"{e.strerror or e}); generate without --isolate") from None
        with child:
            child.proc.stdin.write(json.dumps(req).encode())
            child.proc.stdin.close()
            limit = _START_TIMEOUT
            while True:
                try:
                    msg = child.next(limit)
                except queue.Empty:
                    child.kill()
                    raise GeneratorError(f"generate: the LiteRT-LM engine did not answer within {limit:g} s on "
                                         f"{gen.path} (killed); the bundle may be hostile, or the machine "
                                         "overloaded: retry with a longer --isolate-timeout") from None
                if msg is None:
                    rc = child.wait()
                    if rc < 0:
                        raise GeneratorError(f"generate: the LiteRT-LM engine died with {signal_name(-rc)} on "
                                             f"{gen.path}; the bundle passed the structural check, so bytes only "
                                             "the engine reads (weights, kernels' inputs) are damaged or hostile: "
                                             "do not run it without --isolate; convert the model again")
                    raise GeneratorError(f"generate: the isolated LiteRT-LM engine ended ({exit_status(rc)}"
                                         f"{stderr_tail(err, ': ')}) on {gen.path} without an answer")
                kind, payload = msg[0], json.loads(bytes.fromhex(msg[1])) if len(msg) > 1 else None
                limit = gen.isolate_timeout
                if kind == "text" and on_text is not None:
                    on_text(payload)
                elif kind == "err":
                    make = _RAISED.get(payload["class"], lambda d: GeneratorError(d["message"]))
                    raise make(payload)
                elif kind == "done":
                    return TextResult(**payload)
