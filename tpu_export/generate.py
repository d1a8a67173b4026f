"""Greedy generation from an exported LM (converter.llm's cache protocol) on any runtime that runs it.

    from converter.llm import prepare_lm
    prog, spec = prepare_lm(hf_model, prefill_lengths=(32,), cache_len=256)
    lite = edge.convert_program(prog)  # or litert_torch.signature(...).convert(), tpu_backend.export_program(prog)
    ids = greedy_generate(litert_torch.Model(lite), spec, prompt_ids, max_new_tokens=32)

A runtime is anything called as ``runtime(tokens, input_pos, signature_name=..., **caches)`` that returns a dict
with ``logits`` and the updated caches and lists its signatures (``signature_names`` or ``signatures``): a
``litert_torch.Model``, a TPU ``ExportedBundle`` or a loaded ``TpuProgram``.
"""

from __future__ import annotations

import torch

__all__ = ["CacheFullError", "PromptTooLongError", "greedy_generate", "prefill_lengths"]


class PromptTooLongError(ValueError):
    pass


class CacheFullError(ValueError):
    pass


def prefill_lengths(runtime) -> list[int]:
    """The L of each ``prefill_<L>`` signature the runtime has, ascending."""
    names = getattr(runtime, "signature_names", None)
    names = list(names() if callable(names) else names) if names is not None else list(runtime.signatures)
    return sorted(int(n[len("prefill_"):]) for n in names if n.startswith("prefill_") and n[8:].isdigit())


def greedy_generate(runtime, spec, prompt_ids, max_new_tokens: int, *, eos_token_id: int | None = None) -> list[int]:
    """Prefill ``prompt_ids`` (a list of ints or a [1, n] tensor) with the shortest ``prefill_<L>`` that holds it,
    then decode one token at a time, each the argmax of the last logits. Returns the new tokens (at most
    ``max_new_tokens``; it stops after ``eos_token_id``). ``spec``: the converter.llm.CacheSpec of the export.
    """
    prompt = [int(t) for t in (prompt_ids.reshape(-1).tolist() if hasattr(prompt_ids, "reshape") else prompt_ids)]
    n = len(prompt)
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    lengths = prefill_lengths(runtime)
    if not lengths:
        raise ValueError("the runtime has no prefill_<L> signature: export it with converter.llm.prepare_lm")
    fits = [L for L in lengths if L >= n]
    if n == 0 or not fits:
        raise PromptTooLongError(f"the prompt has {n} tokens; the exported prefill lengths are {lengths}: "
                                 f"re-export with a prefill length >= {n} or shorten the prompt")
    # the last new token is never fed back, so the cache holds the prompt and max_new_tokens - 1 more
    if n + max_new_tokens - 1 > spec.cache_len:
        raise CacheFullError(f"{n} prompt tokens + {max_new_tokens} new tokens need {n + max_new_tokens - 1} cache "
                             f"slots; the cache holds {spec.cache_len}: lower max_new_tokens or re-export with a "
                             f"longer cache")
    L = fits[0]
    tokens = torch.tensor([prompt + [0] * (L - n)], dtype=torch.int32)  # pad slots are overwritten before read
    out = runtime(tokens, torch.arange(L, dtype=torch.int32), signature_name=f"prefill_{L}", **spec.zeros())
    new = []
    logits = torch.as_tensor(out["logits"])[0, n - 1]
    for pos in range(n, n + max_new_tokens):
        tok = int(torch.argmax(logits))
        new.append(tok)
        if tok == eos_token_id or len(new) == max_new_tokens:
            break
        caches = {k: out[k] for k in spec.names()}
        out = runtime(torch.tensor([[tok]], dtype=torch.int32), torch.tensor([pos], dtype=torch.int32),
                      signature_name="decode", **caches)
        logits = torch.as_tensor(out["logits"])[0, 0]
    return new
