"""converter.passes.dense_expert_splits: rows split per expert by counts read back with ``.tolist()``, each piece
through its expert's linear and concatenated back (JetMoE's ``JetMoeParallelExperts``), run on both backends as
masked sums, matching torch eager and transformers' JetMoE; a split by such counts used any other way is left as
it was, and the backends refuse it naming ``aten._local_scalar_dense.default``."""

from __future__ import annotations

import pytest
import torch

from tests.converter.pass_backends import call_targets, run_on
from tpu_export import converter, tpu_backend
from tpu_export.converter.errors import UnsupportedOpsError
from tpu_export.converter.numerics import rel_err
from tpu_export.edge import convert_program

aten = torch.ops.aten
E, K, H, TOP = 4, 8, 12, 2


class SortedExperts(torch.nn.Module):
    """Top-2 routing, rows sorted by expert, two expert matmuls split by the per-expert counts (JetMoE's MoE)."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.router = torch.nn.Parameter(torch.randn(E, K, generator=g))
        self.w_in = torch.nn.Parameter(torch.randn(E, H, K, generator=g) / K ** 0.5)
        self.w_out = torch.nn.Parameter(torch.randn(E, K, H, generator=g) / H ** 0.5)
        self.b_out = torch.nn.Parameter(torch.randn(E, K, generator=g))

    def forward(self, x):  # x [T, K]
        top = torch.topk(x @ self.router.t(), TOP, dim=1).indices
        counts = torch.zeros(x.shape[0], E).scatter(1, top, 1).long().sum(0)
        sizes = counts.tolist()
        order = top.flatten().sort(0).indices
        rows = x[order.div(TOP, rounding_mode="trunc")]
        h = torch.cat([torch.nn.functional.linear(p, self.w_in[i]) for i, p in enumerate(rows.split(sizes))])
        h = torch.relu(h)
        y = torch.cat([torch.nn.functional.linear(p, self.w_out[i], self.b_out[i])
                       for i, p in enumerate(h.split(sizes))])
        return torch.zeros(x.shape[0] * TOP, K).index_add(0, order, y)


class PieceSums(torch.nn.Module):
    """The pieces summed over their rows: not row by row, so no masked sum gives it."""

    def forward(self, x, counts):
        return torch.stack([p.sum(0) for p in x.split(counts.tolist())])


@pytest.mark.parametrize("backend", ["litert", "tpu"])
def test_expert_split_runs_as_masked_sums(backend):
    module = SortedExperts().eval()
    x = torch.randn(6, K, generator=torch.Generator().manual_seed(1))
    prog = converter.prepare(module, (x,))
    assert aten._local_scalar_dense.default not in call_targets(prog)
    assert aten.split_with_sizes.default not in call_targets(prog)
    run = run_on(prog, backend)
    for seed in (1, 2, 3):  # other inputs route other rows to other experts
        x = torch.randn(6, K, generator=torch.Generator().manual_seed(seed))
        with torch.no_grad():
            want = module(x)
        assert rel_err(run(x), want) <= 1e-5


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["litert", "tpu"])
def test_jetmoe_matches_transformers(backend):
    transformers = pytest.importorskip("transformers")
    config = transformers.JetMoeConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                       num_key_value_heads=2, kv_channels=8, intermediate_size=48,
                                       num_local_experts=4, num_experts_per_tok=2)
    torch.manual_seed(0)
    model = transformers.JetMoeModel(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):  # zero-initialised: drawn so the experts' biases count
                p.normal_(0, 0.1)

    class Hidden(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, ids):
            return self.model(input_ids=ids).last_hidden_state

    ids = torch.randint(0, 100, (1, 8), generator=torch.Generator().manual_seed(0), dtype=torch.int32)
    prog = converter.prepare(Hidden().eval(), (ids,))
    assert aten._local_scalar_dense.default not in call_targets(prog)
    with torch.no_grad():
        want = model(input_ids=ids.long()).last_hidden_state
    assert rel_err(run_on(prog, backend)(ids), want) <= 1e-5


def test_split_by_counts_used_otherwise_is_refused_naming_it():
    args = (torch.randn(6, 3), torch.tensor([1, 3, 2], dtype=torch.int32))
    prog = converter.prepare(PieceSums().eval(), args)
    with pytest.raises(UnsupportedOpsError, match=r"aten\._local_scalar_dense\.default"):
        convert_program(prog)
    with pytest.raises(UnsupportedOpsError, match=r"aten\._local_scalar_dense\.default"):
        tpu_backend.export_program(prog, platforms=("cpu",))
