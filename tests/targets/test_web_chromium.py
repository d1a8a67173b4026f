"""The web target in a real browser: LiteRT.js (wasm/XNNPACK) in headless Chromium vs torch eager.

Skips only when Chromium or web/node_modules is missing (CI installs both: apt-get install chromium,
cd web && npm ci).
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.numerics import rel_err
from tests.targets.web_harness import missing_reason, run_in_chromium
from tpu_export.targets import package
from tpu_export.targets.web import es_module_snippet

pytestmark = [pytest.mark.chromium, pytest.mark.skipif(missing_reason() is not None, reason=str(missing_reason()))]

REL_ERR = 1e-4


def test_cnn_in_chromium_through_the_generated_es_module(cnn, tmp_path):
    module, args, prog, ref = cnn
    written = package("web", prog, str(tmp_path), say=lambda m: None)
    tfl = open(written["model.tflite"], "rb").read()
    snippet = open(written["model.js"]).read()
    out = run_in_chromium(tfl, {"x": args[0].numpy()}, snippet=snippet)
    assert rel_err(out["output_0"], ref.numpy()) <= REL_ERR


def test_encoder_in_chromium(encoder, tmp_path):
    module, args, prog, ref = encoder
    written = package("web", prog, str(tmp_path), say=lambda m: None)
    tfl = open(written["model.tflite"], "rb").read()
    inputs = {"input_ids": args[0].numpy().astype(np.int32), "attention_mask": args[1].numpy().astype(np.int32)}
    out = run_in_chromium(tfl, inputs)
    for name, r in zip(["output_0", "output_1"], ref):
        assert out[name].shape == tuple(r.shape)
        assert rel_err(out[name], r.numpy()) <= REL_ERR, name


def test_snippet_has_the_real_signature(encoder):
    from tpu_export.targets.checks import lower_for_target

    js = es_module_snippet(lower_for_target(encoder[2], "web"))
    assert '{"name": "input_ids", "shape": [1, 16], "dtype": "int32"}' in js
    assert '{"name": "output_1", "shape": [1, 64], "dtype": "float32"}' in js


def test_llm_decode_over_the_filled_prefix_in_chromium():
    """An LLM's decode over a 512-slot cache (edge.attention_prefix: IF ops over prefix subgraphs) in LiteRT.js: the
    eager decode's logits, at a position in the second prefix, with random values in every cache slot."""
    import torch
    transformers = pytest.importorskip("transformers")

    from tpu_export.converter.llm import KVCacheLM, prepare_lm
    from tpu_export.edge import convert_program

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024)
    model = transformers.LlamaForCausalLM(cfg).eval()
    lm = KVCacheLM(model, 512).eval()
    prog, spec = prepare_lm(model, prefill_lengths=(8,), cache_len=512)
    caches = {n: torch.randn(spec.shape) for n in spec.names()}
    token, pos = torch.tensor([[5]], dtype=torch.int32), torch.tensor([300], dtype=torch.int32)
    with torch.no_grad():
        want = lm(token, pos, **caches)["logits"]
    out = run_in_chromium(convert_program(prog), {"tokens": token.numpy(), "input_pos": pos.numpy(),
                                                  **{k: v.numpy() for k, v in caches.items()}}, signature="decode")
    assert rel_err(out["logits"], want.numpy()) <= REL_ERR
