"""converter.passes.lower_complex: complex arithmetic between real inputs and outputs (Llama 4's RoPE form:
torch.polar, view_as_complex, a complex product, view_as_real; and the shape ops, sums and casts around such a
product) runs on both backends as real pairs, matching torch eager; a graph with a complex op the pass has no
rule for is left as it was, and the backend's op check names that op."""

from __future__ import annotations

import pytest
import torch

from tpu_export import converter, litert_torch, tpu_backend
from tpu_export.converter.errors import UnsupportedOpsError
from tpu_export.converter.numerics import rel_err
from tpu_export.edge import convert_program


class RotaryProduct(torch.nn.Module):
    """q [B, T, H, D] rotated by the angles [B, T, D/2] (as Llama 4's apply_rotary_emb), plus a complex sum,
    difference, transpose, slice, concatenation and a real scale on the way."""

    def forward(self, q, angles):
        freqs = torch.polar(torch.ones_like(angles), angles) * 0.5  # a complex times a real number
        qc = torch.view_as_complex(q.float().reshape(*q.shape[:-1], -1, 2))
        rot = qc * freqs[:, :, None, :]
        mixed = (rot + qc) - rot.transpose(1, 2).transpose(1, 2) * angles[:, :, None, :]  # complex x real tensor
        both = torch.cat([mixed[:, :1], rot[:, 1:]], dim=1).clone()
        return torch.view_as_real(both).flatten(3)


class ComplexMagnitude(torch.nn.Module):
    def forward(self, x):
        return torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2)).abs()  # abs of a complex: no rule


def _inputs():
    g = torch.Generator().manual_seed(0)
    return torch.randn(1, 5, 2, 8, generator=g), 3.0 * torch.randn(1, 5, 4, generator=g)


def _no_complex(prog) -> bool:
    return not any(n.meta["val"].dtype.is_complex for s in prog.signatures.values() for n in s.graph.nodes
                   if isinstance(n.meta.get("val"), torch.Tensor))


@pytest.mark.parametrize("backend", ["litert", "tpu"])
def test_complex_products_run_as_real_pairs(backend):
    args = _inputs()
    module = RotaryProduct().eval()
    prog = converter.prepare(module, args)
    assert _no_complex(prog)
    rt = litert_torch.Model(convert_program(prog)) if backend == "litert" else \
        tpu_backend.export_program(prog, platforms=("cpu",))
    got = rt(*args)
    with torch.no_grad():
        want = module(*args)
    assert got.shape == want.shape
    assert rel_err(got, want) <= 1e-6


def test_a_complex_op_without_a_rule_is_left_for_the_backend_to_name():
    prog = converter.prepare(ComplexMagnitude().eval(), (torch.randn(2, 8),))
    assert not _no_complex(prog)
    with pytest.raises(UnsupportedOpsError, match=r"aten\.abs\.default|aten\.view_as_complex"):
        convert_program(prog)
