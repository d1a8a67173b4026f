"""Generation with the KV caches kept on the device and updated in place (donated) between calls."""

from __future__ import annotations

import numpy as np

from ..artifact.dtypes import numpy_to_torch

__all__ = ["OnDeviceLM"]


class OnDeviceLM:
    """A runtime for ``tpu_export.generate.greedy_generate`` (called as ``rt(tokens, input_pos, signature_name=...,
    **caches)``) over a loaded artifact (``tpu_backend.load``) or an in-memory bundle. Logits come back as torch
    tensors; the ``state`` outputs (the caches) stay jax arrays on the device, and passed back in they are donated:
    the next step writes into the same buffers (no host round trip, no second copy of the cache)."""

    def __init__(self, program, state=None):
        self.program = program.to_program() if hasattr(program, "to_program") else program
        self.state = None if state is None else set(state)

    @property
    def signature_names(self) -> list[str]:
        return self.program.signature_names

    def __call__(self, *args, signature_name: str | None = None, **kwargs):
        out = self.program.run_on_device(*args, signature_name=signature_name, **kwargs)
        state = self.state if self.state is not None else {k for k in out if k.startswith("kv_cache_")}
        return {k: v if k in state else numpy_to_torch(np.asarray(v)) for k, v in out.items()}
