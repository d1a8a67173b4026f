"""Linear weights stored [in, out] (tpu_backend.weight_layout, ``<name>.io``) in exports without the TPU platform:
which weights are (only those every use of which is aten.linear's weight: not a tied embedding table, not one also
read by a matmul, not an int8 one; none in a TPU export),
that each platform's program is still the model (torch eager, PJRT CPU), that a partition rule written for torch's
[out, in] follows the weight, that XLA:CPU's dot reads the stored array in place, and that an LM artifact (tied
embeddings) stores its projections so and generates transformers' greedy tokens."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from torch import nn

from tpu_export import converter, tpu_backend
from tpu_export.converter.numerics import rel_err
from tpu_export.tpu_backend.platform_specialize import for_platform

VOCAB, HIDDEN, MLP = 50, 24, 40


class TiedLM(nn.Module):
    """An embedding whose table is also the head's weight (tied), an MLP of two linears, and a square weight read
    by a linear and as a matmul's right operand."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, HIDDEN)
        self.up = nn.Linear(HIDDEN, MLP)
        self.down = nn.Linear(MLP, HIDDEN, bias=False)
        self.mix = nn.Parameter(torch.randn(HIDDEN, HIDDEN) / HIDDEN**0.5)
        self.head = nn.Linear(HIDDEN, VOCAB, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids):
        h = self.emb(ids)
        h = h + self.down(torch.nn.functional.gelu(self.up(h)))
        h = nn.functional.linear(h, self.mix) + h @ self.mix
        return self.head(h)


def _export(**kw):
    torch.manual_seed(0)
    model = TiedLM().eval()
    ids = torch.randint(0, VOCAB, (2, 5), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = model(ids)
    return tpu_backend.export_program(converter.prepare(model, (ids,)), **kw), ids, want, model


def _run(bundle, exported, ids) -> torch.Tensor:
    names = bundle.signatures["serving_default"].weight_names
    ws = [bundle.weights[w].float().numpy().astype(a.dtype) for w, a in zip(names, exported.in_avals)]
    (out,) = exported.call(ws, ids.numpy().astype(exported.in_avals[-1].dtype))
    return torch.from_numpy(np.array(out, dtype=np.float32))


def test_linear_only_weights_are_stored_in_out_off_the_tpu_and_each_platforms_program_is_the_model():
    bundle, ids, want, model = _export(platforms=("cuda", "cpu"))
    stored = {n: tuple(t.shape) for n, t in bundle.weights.items()}
    assert stored == {"emb.weight": (VOCAB, HIDDEN),  # gathered by the embedding and read by the head: as torch's
                      "up.weight.io": (HIDDEN, MLP), "up.bias": (MLP,), "down.weight.io": (MLP, HIDDEN),
                      "mix": (HIDDEN, HIDDEN)}  # also a matmul's [in, out] operand: as torch's
    torch.testing.assert_close(bundle.weights["up.weight.io"], model.up.weight.detach().T, rtol=0, atol=0)
    exported = bundle.signatures["serving_default"].exported
    assert rel_err(_run(bundle, for_platform(exported, "cpu"), ids), want) <= 1e-5


def test_an_export_for_the_tpu_keeps_torchs_linear_layout():
    # libtpu compiles the [in, out] form more slowly (tpu_backend.weight_layout): a TPU export stores [out, in]
    bundle, ids, want, model = _export()
    assert {n: tuple(t.shape) for n, t in bundle.weights.items() if n.startswith(("up.", "down."))} == {
        "up.weight": (MLP, HIDDEN), "up.bias": (MLP,), "down.weight": (HIDDEN, MLP)}
    exported = bundle.signatures["serving_default"].exported
    for platform in ("tpu", "cpu"):  # each platform's program, run here on PJRT CPU
        assert rel_err(_run(bundle, for_platform(exported, platform), ids), want) <= 1e-5, platform


def test_a_saved_artifact_loads_and_matches_torch(tmp_path):
    bundle, ids, want, _ = _export(platforms=("cpu",))
    got = tpu_backend.load(bundle.save(tmp_path / "m.tpuexp"))(ids)
    assert rel_err(np.asarray(got), want) <= 1e-5


def test_int8_weights_keep_their_parts_and_small_linears_are_stored_in_out():
    from tpu_export.tpu_backend.quant import WeightOnlyInt8

    bundle, ids, want, _ = _export(quant=WeightOnlyInt8(min_elements=HIDDEN * MLP), platforms=("cpu",))
    names = set(bundle.weights)
    assert {"up.weight.int8", "down.weight.int8", "emb.weight.int8"} <= names  # quantized: [out, in] int8 + scales
    assert not {"up.weight.io", "down.weight.io"} & names
    # an int8 table of 1200 values through three matmuls: int8 rounding of the output's scale
    assert rel_err(_run(bundle, bundle.signatures["serving_default"].exported, ids), want) <= 3e-2


def test_a_partition_rule_for_the_torch_weight_follows_it_into_in_out():
    bundle, *_ = _export(platforms=("cpu",), mesh={"data": 2, "model": 2},
                         partition_rules=[(r"up\.weight", ("model", None))])
    assert bundle.weight_shardings["up.weight.io"] == [None, "model"]  # torch's output dim, now dim 1


def test_xla_cpu_dots_read_the_stored_weights_in_place():
    import jax

    bundle, ids, *_ = _export(platforms=("cpu",))
    sig = bundle.signatures["serving_default"]
    ws = [jax.ShapeDtypeStruct(tuple(bundle.weights[w].shape), np.float32) for w in sig.weight_names]
    hlo = jax.jit(sig.exported.call).lower(ws, jax.ShapeDtypeStruct(tuple(ids.shape), np.int32)).compile().as_text()
    # every array of the stored MLP weights' shapes is the parameter or a bitcast of it: no transpose, no copy
    made = re.findall(rf"= f32\[(?:{HIDDEN},{MLP}|{MLP},{HIDDEN})\]\{{[\d,]*\}} (\w+)\(", hlo)
    assert made and set(made) <= {"parameter", "bitcast"}, made


def test_a_weight_named_like_a_stored_one_is_refused():
    from tpu_export.tpu_backend.weight_layout import layout_rewrite, plan_layouts

    prog = converter.prepare(TiedLM().eval(), (torch.zeros(1, 3, dtype=torch.long),))
    prog.weights["up.weight.io"] = torch.zeros(1)
    with pytest.raises(ValueError, match=r"already has a weight named 'up\.weight\.io'"):
        layout_rewrite(prog, "serving_default", plan_layouts(prog, ["serving_default"], platforms=("cpu",)))


@pytest.mark.slow
def test_a_tied_lm_artifact_stores_its_projections_in_out_and_generates_transformers_tokens():
    transformers = pytest.importorskip("transformers")
    from tpu_export.converter.llm import prepare_lm
    from tpu_export.generate import greedy_generate
    from tpu_export.tpu_backend.llm import OnDeviceLM, export_lm

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                   tie_word_embeddings=True)
    hf = transformers.LlamaForCausalLM(cfg).eval()
    prog, spec = prepare_lm(hf, prefill_lengths=(16,), cache_len=64)
    bundle, spec = export_lm(prog, spec, platforms=("cpu",))
    names = set(bundle.signatures["decode"].weight_names)
    two_d = {n for n in names if bundle.weights[n].dim() == 2}
    # the tied table (gathered, and the head's weight) keeps torch's layout; every projection is stored [in, out]
    (table,) = (n for n in two_d if not n.endswith(".io"))
    assert table.endswith("embed_tokens.weight") and len(two_d) == 1 + 2 * 7  # 7 projections a layer
    assert any(n.endswith("layers.0.self_attn.q_proj.weight.io") for n in two_d)
    ids = torch.randint(3, 128, (1, 11), generator=torch.Generator().manual_seed(11))
    with torch.no_grad():
        want = hf.generate(ids, do_sample=False, max_new_tokens=16)[0, 11:].tolist()
    assert greedy_generate(OnDeviceLM(bundle.to_program()), spec, ids, 16) == want
