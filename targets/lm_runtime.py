"""The runtimes an exported LLM runs on here, and its first step on a prompt: shared by convert-lm's check of what
it wrote (targets/lm_verify.py) and ``tpu-export generate``'s own loops (tpu_export.generate / generators).

A runtime is called ``rt(tokens, input_pos, signature_name=..., **caches)`` and returns {output name: tensor}:
the LiteRT interpreter for a ``.tflite`` (the file checked before the interpreter sees it), PJRT for a TPU
artifact (tpu_backend.llm.OnDeviceLM: the caches stay on the device, donated between steps).
"""

from __future__ import annotations

import threading

__all__ = ["TfliteLM", "open_lm_runtime", "prefill_plan", "prompt_step"]


class TfliteLM:
    """An LLM ``.tflite`` on the LiteRT interpreter (XNNPACK), one signature runner per signature; the logits and
    caches come back as torch tensors (copies). One call at a time per instance (a lock), as the interpreter
    shares its tensors between calls."""

    def __init__(self, path: str):
        from tpu_export.edge.tflite_check import map_tflite, open_interpreter

        from .tflite_io import signatures

        mapped = map_tflite(path, check=True)  # the interpreter trusts the flatbuffer: refuse a bad one first
        try:
            self.signatures = signatures(mapped)
        finally:
            mapped.close()
        self._interpreter = open_interpreter(path, path=path)  # maps the file itself; weights paged in as read
        self._path = path
        self._runners: dict = {}
        self._lock = threading.Lock()

    @property
    def signature_names(self) -> list[str]:
        return list(self.signatures)

    def __call__(self, tokens, input_pos, *, signature_name: str, **caches) -> dict:
        import numpy as np
        import torch

        from tpu_export.converter.errors import one_line

        feeds = {"tokens": tokens, "input_pos": input_pos, **caches}
        feeds = {k: np.ascontiguousarray(v.numpy() if isinstance(v, torch.Tensor) else np.asarray(v))
                 for k, v in feeds.items()}
        with self._lock:
            if signature_name not in self._runners:
                self._runners[signature_name] = self._interpreter.get_signature_runner(signature_name)
            try:
                out = self._runners[signature_name](**feeds)
            except (RuntimeError, ValueError) as e:
                raise RuntimeError(f"{self._path}: signature {signature_name!r}: the LiteRT interpreter failed: "
                                   f"{one_line(e)}") from e
        return {k: torch.from_numpy(np.array(v)) for k, v in out.items()}


def open_lm_runtime(path: str, spec) -> tuple:
    """(runtime, {decode input: (shape, dtype)}, {decode output: shape}) for the ``.tflite`` or TPU artifact at
    ``path``; ``spec``: the converter.llm.CacheSpec of its caches."""
    if path.endswith(".tflite"):
        runtime = TfliteLM(path)
        ins, outs = runtime.signatures.get("decode", ((), ()))
        return (runtime, {i.name: (tuple(i.shape), i.dtype) for i in ins},
                {o.name: tuple(o.shape) for o in outs})
    from tpu_export import tpu_backend
    from tpu_export.tpu_backend.llm import OnDeviceLM

    program = tpu_backend.load(path)
    sig = program.signature("decode") if "decode" in program.signature_names else None
    inputs = {i.name: (tuple(i.shape), i.dtype) for i in sig.inputs} if sig else {}
    outputs = {o.name: tuple(o.shape) for o in sig.outputs} if sig else {}
    return OnDeviceLM(program, spec.names()), inputs, outputs


def prefill_plan(n: int, lengths, cache_len: int) -> list[tuple[int, int, int]]:
    """``[(start, count, L)]``: ``n`` prompt tokens through the exported ``prefill_<L>`` signatures in chunks, as
    LiteRT-LM's engine prefills a long prompt: the shortest length that holds what is left, else the longest,
    and so on. A chunk writes all ``L`` rows from its start (its pad rows past its tokens), so each must end
    within the cache; ValueError where no length does."""
    lengths = sorted({int(x) for x in ([lengths] if isinstance(lengths, int) else lengths)})
    plan, start = [], 0
    while start < n:
        fit = [x for x in lengths if start + x <= cache_len]
        if not fit:
            raise ValueError(f"{n} prompt tokens to prefill: the chunk from position {start} needs a prefill length "
                             f"of at most {cache_len - start} to stay in the {cache_len}-slot cache; the exported "
                             f"lengths are {lengths}: shorten the prompt or re-export with a shorter prefill length "
                             f"or a longer cache")
        rest = n - start
        L = next((x for x in fit if x >= rest), fit[-1])
        plan.append((start, min(rest, L), L))
        start += min(rest, L)
    return plan


def prompt_step(runtime, spec, prompt: list, lengths) -> dict:
    """The prefill of ``prompt`` but its last token from empty caches, in the chunks of ``prefill_plan`` over the
    exported prefill ``lengths`` (one length, or several), then the decode of the last one; that decode's outputs
    (its logits and caches). Each chunk is padded to its length, the pad slots overwritten before they are read;
    the pad rows carry token 0 at position 0, as LiteRT-LM's engine passes them: a model with a convolution state
    counts its real rows by the positions (converter/llm_conv.py)."""
    import torch

    n = len(prompt)
    caches = spec.zeros()
    for start, count, L in prefill_plan(n - 1, lengths, spec.cache_len):
        pad = L - count
        tokens = torch.tensor([prompt[start:start + count] + [0] * pad], dtype=torch.int32)
        pos = torch.tensor(list(range(start, start + count)) + [0] * pad, dtype=torch.int32)
        out = runtime(tokens, pos, signature_name=f"prefill_{L}", **caches)
        caches = {k: out[k] for k in spec.names()}
    return runtime(torch.tensor([[prompt[-1]]], dtype=torch.int32), torch.tensor([n - 1], dtype=torch.int32),
                   signature_name="decode", **caches)
