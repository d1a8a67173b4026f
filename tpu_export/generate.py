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
import time
from typing import Callable

import torch

__all__ = ["CacheFullError", "GenerationRun", "PromptTooLongError", "Sampling", "generate_ids", "greedy_generate",
           "prefill_lengths"]


class PromptTooLongError(ValueError):
    pass


class CacheFullError(ValueError):
    pass


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
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0: greedy), got {self.temperature}")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {self.top_k}")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

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
    ``prefill_<L>`` that holds them, then decode the last prompt token and one token at a time, each the argmax of
    the last logits. Returns the new tokens (at most ``max_new_tokens``; it stops after ``eos_token_id``).
    ``spec``: the converter.llm.CacheSpec of the export.
    """
    return generate_ids(runtime, spec, prompt_ids, max_new_tokens, eos_token_id=eos_token_id).tokens


def generate_ids(runtime, spec, prompt_ids, max_new_tokens: int, *, eos_token_id=None, sampling: Sampling | None = None,
                 on_token: Callable[[int], None] | None = None) -> GenerationRun:
    """``greedy_generate`` with a ``sampling`` rule, a callback per new token and timings. ``eos_token_id``: an
    id or several (generation stops after any of them)."""
    prompt = [int(t) for t in (prompt_ids.reshape(-1).tolist() if hasattr(prompt_ids, "reshape") else prompt_ids)]
    n = len(prompt)
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    lengths = prefill_lengths(runtime)
    if not lengths:
        raise ValueError("the runtime has no prefill_<L> signature: export it with converter.llm.prepare_lm")
    # as LiteRT-LM's engine does: prefill all prompt tokens but the last, then decode the last one, whose logits
    # give the first new token (prefill signatures need no logits; a 1-token prompt needs no prefill)
    fits = [L for L in lengths if L >= n - 1]
    if n == 0 or not fits:
        raise PromptTooLongError(f"the prompt has {n} tokens; the exported prefill lengths are {lengths}: "
                                 f"re-export with a prefill length >= {n - 1} or shorten the prompt")
    # the last new token is never fed back, so the cache holds the prompt and max_new_tokens - 1 more
    if n + max_new_tokens - 1 > spec.cache_len:
        raise CacheFullError(f"{n} prompt tokens + {max_new_tokens} new tokens need {n + max_new_tokens - 1} cache "
                             f"slots; the cache holds {spec.cache_len}: lower max_new_tokens or re-export with a "
                             f"longer cache")
    stops = set() if eos_token_id is None else (
        {int(eos_token_id)} if isinstance(eos_token_id, int) else {int(e) for e in eos_token_id})
    pick = (sampling or Sampling()).picker()
    t0 = time.perf_counter()
    caches = spec.zeros()
    if n > 1:
        L = fits[0]
        tokens = torch.tensor([prompt[:-1] + [0] * (L - n + 1)], dtype=torch.int32)  # pad slots: overwritten first
        out = runtime(tokens, torch.arange(L, dtype=torch.int32), signature_name=f"prefill_{L}", **caches)
        caches = {k: out[k] for k in spec.names()}
    out = runtime(torch.tensor([[prompt[-1]]], dtype=torch.int32), torch.tensor([n - 1], dtype=torch.int32),
                  signature_name="decode", **caches)
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
