"""Generation from an exported LM (converter.llm's cache protocol) on any runtime that runs it: greedy or sampled,
token by token, with timings.

    from tpu_export.converter.llm import prepare_lm
    prog, spec = prepare_lm(hf_model, prefill_lengths=(32,), cache_len=256)
    lite = edge.convert_program(prog)  # or litert_torch.signature(...).convert(), tpu_backend.export_program(prog)
    ids = greedy_generate(litert_torch.Model(lite), spec, prompt_ids, max_new_tokens=32)
    run = generate_ids(runtime, spec, prompt_ids, 32, sampling=Sampling(temperature=0.8, top_p=0.9, seed=0),
                       on_token=print)           # run.tokens, run.prefill_ms, run.decode_tokens_per_s

A runtime is anything called as ``runtime(tokens, input_pos, signature_name=..., **caches)`` that returns a dict
with ``logits`` and the updated caches and lists its signatures (``signature_names`` or ``signatures``): a
``litert_torch.Model``, a TPU ``ExportedBundle`` or a loaded ``TpuProgram``. Text in, text out (a tokenizer, a
saved artifact or a ``.litertlm`` through the LiteRT-LM engine): tpu_export/generators.py.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Callable

import torch

from tpu_export.targets.lm_runtime import prefill_plan, prompt_step

__all__ = ["CacheFullError", "GenerateArgumentError", "GenerationRun", "PromptTooLongError", "SEED_MAX", "Sampling",
           "check_generate_args", "generate_ids", "greedy_generate", "prefill_lengths"]

SEED_MAX = 2**63 - 1  # the engine's sampler and torch's generator both take a 64-bit seed


class GenerateArgumentError(ValueError):
    """A generation argument out of its range. ``str()`` names it as Python does (``max_new_tokens``),
    ``for_cli()`` as the command line does (``--max-new-tokens``)."""

    def __init__(self, arg: str, problem: str):
        self.arg, self.problem = arg, problem
        super().__init__(f"{arg}: {problem}")

    def for_cli(self) -> str:
        return f"--{self.arg.replace('_', '-')}: {self.problem}"


class PromptTooLongError(GenerateArgumentError):
    """The prompt cannot be prefilled in the cache with the exported prefill lengths (``arg``: prompt)."""

    def __init__(self, problem: str):
        super().__init__("prompt", problem)


class CacheFullError(GenerateArgumentError):
    """Prompt + new tokens need more cache slots than the model holds (``arg``: max_new_tokens)."""

    def __init__(self, problem: str):
        super().__init__("max_new_tokens", problem)


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def check_generate_args(prompt=None, max_new_tokens=None, sampling=None, *, vocab: int | None = None,
                        tokenize: Callable[[str], list] | None = None):
    """The one check of what a generation is asked, the same for every runtime (the LiteRT-LM engine, the
    .tflite loop, the TPU artifact). Each argument given is checked: ``prompt`` valid UTF-8 text;
    ``max_new_tokens`` an int >= 1; ``sampling``'s temperature finite and >= 0, top_k an int >= 1 (and at most
    ``vocab``), top_p in (0, 1], seed an int in [0, SEED_MAX]. With ``tokenize`` (text -> ids) the prompt's ids
    are returned, refused when there are none. Raises GenerateArgumentError."""
    if prompt is not None:
        if not isinstance(prompt, str):
            raise GenerateArgumentError("prompt", f"must be text (str), got {type(prompt).__name__}")
        try:
            prompt.encode("utf-8")
        except UnicodeEncodeError as e:
            bad = prompt[e.start]
            what = f"the byte 0x{ord(bad) - 0xDC00:02x}" if 0xDC80 <= ord(bad) <= 0xDCFF else f"U+{ord(bad):04X}"
            raise GenerateArgumentError("prompt", f"is not valid UTF-8 ({what} at character {e.start}): pass UTF-8 "
                                                  "text") from None
        if not prompt:
            raise GenerateArgumentError("prompt", "is empty: give the text to continue")
    if max_new_tokens is not None and (not _is_int(max_new_tokens) or max_new_tokens < 1):
        raise GenerateArgumentError("max_new_tokens", f"must be an integer >= 1, got {max_new_tokens!r}: ask for at "
                                                      "least one new token")
    if sampling is not None:
        t, k, p, seed = sampling.temperature, sampling.top_k, sampling.top_p, sampling.seed
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
            raise GenerateArgumentError("temperature", f"must be a finite number >= 0 (0: greedy), got {t!r}")
        if k is not None and (not _is_int(k) or k < 1):
            raise GenerateArgumentError("top_k", f"must be an integer >= 1, got {k!r} (leave it out for all tokens)")
        if k is not None and vocab is not None and k > vocab:
            raise GenerateArgumentError("top_k", f"{k} is more than the model's {vocab}-token vocabulary: give at "
                                                 f"most {vocab} (or leave it out for all tokens)")
        if p is not None and (isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 < p <= 1):
            raise GenerateArgumentError("top_p", f"must be a number in (0, 1], got {p!r}")
        if seed is not None and (not _is_int(seed) or not 0 <= seed <= SEED_MAX):
            raise GenerateArgumentError("seed", f"must be an integer in [0, 2**63 - 1], got {seed!r}")
    if tokenize is None:
        return None
    ids = list(tokenize(prompt))
    if not ids:
        raise GenerateArgumentError("prompt", f"{prompt!r} tokenizes to no tokens: give some text")
    return ids


@dataclasses.dataclass(frozen=True)
class Sampling:
    """How the next token is picked from the logits: ``temperature`` 0 is greedy (argmax); otherwise the logits are
    divided by it, cut to the ``top_k`` largest and to the smallest set whose probability reaches ``top_p``
    (transformers' order), and sampled with a generator seeded by ``seed`` (the same seed, the same tokens)."""

    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None

    def __post_init__(self):
        check_generate_args(sampling=self)  # the vocabulary-free part; each generator checks top_k against its own

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1

    def picker(self) -> Callable[[torch.Tensor], int]:
        if self.greedy:
            return lambda logits: int(torch.argmax(logits))
        gen = torch.Generator().manual_seed(self.seed if self.seed is not None else
                                            int(torch.randint(0, 2**62, ()).item()))

        def pick(logits):
            x = logits.double() / self.temperature
            if self.top_k is not None and self.top_k < x.numel():
                x = x.masked_fill(x < torch.topk(x, self.top_k).values[-1], float("-inf"))
            if self.top_p is not None and self.top_p < 1:
                probs, order = torch.sort(torch.softmax(x, -1), descending=True)
                drop = torch.cumsum(probs, -1) - probs >= self.top_p  # keep the tokens until top_p is reached
                x = x.masked_fill(torch.zeros_like(drop).scatter(0, order, drop), float("-inf"))
            return int(torch.multinomial(torch.softmax(x, -1), 1, generator=gen))

        return pick


@dataclasses.dataclass
class GenerationRun:
    """The new tokens and the times: ``prefill_ms`` (to the first new token's logits: the prefill call of all
    prompt tokens but the last, and the decode call of the last) and ``decode_tokens_per_s`` (decode calls per
    second after it; None when no decode call ran)."""

    tokens: list
    prompt_tokens: int
    prefill_ms: float
    decode_s: float = 0.0
    decode_steps: int = 0

    @property
    def decode_tokens_per_s(self) -> float | None:
        return self.decode_steps / self.decode_s if self.decode_steps and self.decode_s > 0 else None


def prefill_lengths(runtime) -> list[int]:
    """The L of each ``prefill_<L>`` signature the runtime has, ascending."""
    names = getattr(runtime, "signature_names", None)
    names = list(names() if callable(names) else names) if names is not None else list(runtime.signatures)
    return sorted(int(n[len("prefill_"):]) for n in names if n.startswith("prefill_") and n[8:].isdigit())


def greedy_generate(runtime, spec, prompt_ids, max_new_tokens: int, *, eos_token_id: int | None = None) -> list[int]:
    """Prefill ``prompt_ids`` (a list of ints or a [1, n] tensor) but its last token with the shortest
    ``prefill_<L>`` that holds them (in chunks where none does, as LiteRT-LM's engine does), then decode the last
    prompt token and one token at a time, each the argmax of the last logits. Returns the new tokens (at most
    ``max_new_tokens``; it stops after ``eos_token_id``). ``spec``: the converter.llm.CacheSpec of the export.
    """
    return generate_ids(runtime, spec, prompt_ids, max_new_tokens, eos_token_id=eos_token_id).tokens


def generate_ids(runtime, spec, prompt_ids, max_new_tokens: int, *, eos_token_id=None, sampling: Sampling | None = None,
                 on_token: Callable[[int], None] | None = None) -> GenerationRun:
    """``greedy_generate`` with a ``sampling`` rule, a callback per new token and timings. ``eos_token_id``: an
    id or several (generation stops after any of them)."""
    prompt = [int(t) for t in (prompt_ids.reshape(-1).tolist() if hasattr(prompt_ids, "reshape") else prompt_ids)]
    n = len(prompt)
    check_generate_args(max_new_tokens=max_new_tokens, sampling=sampling)
    lengths = prefill_lengths(runtime)
    if not lengths:
        raise ValueError("the runtime has no prefill_<L> signature: export it with converter.llm.prepare_lm")
    if n == 0:
        raise GenerateArgumentError("prompt", "it is empty: give at least one token")
    # the last new token is never fed back, so the cache holds the prompt and max_new_tokens - 1 more
    if n + max_new_tokens - 1 > spec.cache_len:
        raise CacheFullError(f"{n} prompt tokens + {max_new_tokens} new tokens need {n + max_new_tokens - 1} cache "
                             f"slots; the cache holds {spec.cache_len}: ask for fewer new tokens or re-export with a "
                             f"longer cache")
    # as LiteRT-LM's engine does: prefill all prompt tokens but the last, in chunks where the prompt is longer than
    # a prefill length, then decode the last one, whose logits give the first new token (prefill signatures need
    # no logits; a 1-token prompt needs no prefill)
    try:
        prefill_plan(n - 1, lengths, spec.cache_len)
    except ValueError as e:
        raise PromptTooLongError(str(e)) from None
    stops = set() if eos_token_id is None else (
        {int(eos_token_id)} if isinstance(eos_token_id, int) else {int(e) for e in eos_token_id})
    pick = (sampling or Sampling()).picker()
    t0 = time.perf_counter()
    out = prompt_step(runtime, spec, prompt, lengths)
    logits = torch.as_tensor(out["logits"])[0, 0]  # fetched: the time to the first token includes its result
    run = GenerationRun([], n, (time.perf_counter() - t0) * 1e3)
    for pos in range(n, n + max_new_tokens):
        tok = pick(logits.float())
        run.tokens.append(tok)
        if on_token is not None:
            on_token(tok)
        if tok in stops or len(run.tokens) == max_new_tokens:
            break
        caches = {k: out[k] for k in spec.names()}
        t1 = time.perf_counter()
        out = runtime(torch.tensor([[tok]], dtype=torch.int32), torch.tensor([pos], dtype=torch.int32),
                      signature_name="decode", **caches)
        logits = torch.as_tensor(out["logits"])[0, 0]
        run.decode_s += time.perf_counter() - t1
        run.decode_steps += 1
    return run
