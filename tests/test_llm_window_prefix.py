"""A sliding-window layer's decode on the edge reads the cache's first slots while its window is those (before
position W), through edge.attention_prefix's IF chain, and gathers its window only past that: checked on the
LiteRT interpreter against transformers' attention over the whole cache (converter.llm's window read off), with
random values in every cache slot, so that a slot read that the mask would hide, or the reverse, changes the
logits."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from tests.numerics import rel_err  # noqa: E402
from tpu_export import litert_torch  # noqa: E402
from tpu_export.converter.llm import KVCacheLM, prepare_lm  # noqa: E402

pytestmark = [pytest.mark.slow]

CACHE, WINDOW = 1024, 512


@pytest.fixture(scope="module")
def gemma3():
    """A tiny Gemma 3 (one sliding layer, one global; GQA 4 / 2 heads of 16), its .tflite and random caches."""
    from tpu_export.edge import convert_program

    torch.manual_seed(0)
    cfg = transformers.Gemma3TextConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, sliding_window=WINDOW, max_position_embeddings=2 * CACHE,
        layer_types=["sliding_attention", "full_attention"], bos_token_id=1, eos_token_id=2)
    model = transformers.Gemma3ForCausalLM(cfg).eval()
    with torch.no_grad():  # the (1 + w) norms away from their zero init, so a norm read wrong shows
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.normal_(0.0, 0.5)
    prog, spec = prepare_lm(model, prefill_lengths=(8,), cache_len=CACHE)
    lite = convert_program(prog)
    caches = {n: torch.randn(spec.shape, generator=torch.Generator().manual_seed(1)) for n in spec.names()}
    return model, lite, caches


def _subgraphs(lite):
    from ai_edge_litert import schema_py_generated as schema

    from tpu_export.edge.inspect import op_histogram

    model = schema.Model.GetRootAs(lite, 0)
    index = {model.SignatureDefs(i).SignatureKey().decode(): model.SignatureDefs(i).SubgraphIndex()
             for i in range(model.SignatureDefsLength())}
    names = {(model.Subgraphs(g).Name() or b"").decode(): g for g in range(model.SubgraphsLength())}
    return index, names, lambda g: op_histogram(lite, subgraph=g)


def test_the_window_is_gathered_only_in_the_chains_last_else(gemma3):
    _, lite, _ = gemma3
    index, names, ops = _subgraphs(lite)
    decode = ops(index["decode"])
    assert decode.get("GATHER") == 1  # the token's embedding row; no window GATHER in the decode graph itself
    assert decode.get("IF") == 2  # one chain per layer: the global layer's over the cache, the sliding one's
    assert ops(names["decode_attention_window"]).get("GATHER") == 2  # K and V of the window, past position W
    assert "IF" not in ops(index["prefill_8"])


# the window's start: 0 (prefix 256, prefix 512 = the window), then moving (gathered), then clamped at the end
@pytest.mark.parametrize("pos", [0, 255, 256, 511, 512, 700, CACHE - 1])
def test_sliding_decode_matches_the_whole_cache_attention(gemma3, pos):
    model, lite, caches = gemma3
    lm = KVCacheLM(model, CACHE).eval()
    lm._window = lambda *a: None  # transformers' attention over every slot of the cache, the window in the mask
    token, input_pos = torch.tensor([[7]], dtype=torch.int32), torch.tensor([pos], dtype=torch.int32)
    with torch.no_grad():
        want = lm(token, input_pos, **caches)
    got = litert_torch.Model(lite)(token, input_pos, signature_name="decode", **caches)
    assert rel_err(torch.as_tensor(got["logits"]), want["logits"]) <= 1e-5, pos
    for name in ("kv_cache_k_0", "kv_cache_v_0"):  # the sliding layer's cache write at pos
        assert rel_err(torch.as_tensor(got[name]), want[name]) <= 1e-6, (name, pos)
