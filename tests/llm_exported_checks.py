"""Test-only: the checks the per-feature LLM tests (sinks and softcapping, Falcon and Llama 4, MLA) run on a tiny
model exported by their ``exported`` fixture, a dict with ``ids`` (the 14-token PROMPT, [1, 14]), ``spec``,
``rts`` ({"litert": the .tflite's Model, "tpu": the TPU artifact on PJRT CPU}), ``lite`` (the .tflite bytes),
``eager`` (transformers' eager logits of the prompt) and ``want`` (transformers' NEW greedy tokens)."""

from __future__ import annotations

import pytest
import torch

from tests.llm_models import tiny_tokenizer
from tpu_export.converter.numerics import rel_err
from tpu_export.generate import greedy_generate

__all__ = ["CACHE", "EOS", "NEW", "PROMPT", "check_engine", "check_greedy", "check_prefill_logits"]

CACHE = 64
NEW = 32
EOS = 2
# 14 tokens of tests.llm_models' tokenizer: past the 8-slot windows and chunks, inside prefill_16
PROMPT = "hello world, the cache holds keys and values; the decoder reads"


def check_prefill_logits(exported, backend: str) -> None:
    """The 14-token prompt padded into prefill_16: the logits of its rows within 1e-4 of transformers' eager."""
    ids, spec = exported["ids"], exported["spec"]
    tokens = torch.zeros(1, 16, dtype=torch.int32)
    tokens[0, :14] = ids[0]
    out = exported["rts"][backend](tokens, torch.arange(16, dtype=torch.int32), signature_name="prefill_16",
                                   **spec.zeros())
    assert rel_err(torch.as_tensor(out["logits"])[:, :14], exported["eager"]) <= 1e-4


def check_greedy(exported, backend: str) -> None:
    got = greedy_generate(exported["rts"][backend], exported["spec"], exported["ids"], NEW, eos_token_id=EOS)
    assert got == exported["want"]


def check_engine(exported, tmp_path) -> None:
    """The .tflite bundled as a .litertlm: the LiteRT-LM engine's greedy reply is transformers' text."""
    litert_lm = pytest.importorskip("litert_lm")
    pytest.importorskip("litert_lm_builder")
    from tpu_export.edge.litertlm import write_litertlm

    tok = tiny_tokenizer()
    tok_path = tmp_path / "tok"
    tok.save_pretrained(tok_path)
    path = write_litertlm(tmp_path / "lm.litertlm", exported["lite"], tokenizer_json=tok_path / "tokenizer.json",
                          stop_token_ids=[EOS], max_num_tokens=CACHE, cache_spec=exported["spec"])
    engine = litert_lm.Engine(str(path), max_num_tokens=CACHE)
    session = engine.create_session(apply_prompt_template=False, sampler_config=litert_lm.SamplerConfig(top_k=1),
                                    max_output_tokens=NEW)
    session.run_prefill([PROMPT])
    assert session.run_decode().texts[0] == tok.decode(exported["want"])
