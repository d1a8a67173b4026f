"""converter.passes.lower_complex's Fourier transforms: an FFT over dims of static size runs on both backends as real
matmuls with constant cos / sin matrices, matching torch eager (FNet's ``fftn(x, dim=(1, 2)).real``, ``fft``'s
real and imaginary parts, an FFT convolution irfft(rfft(x) * rfft(k)), FNet itself in its three forms against
transformers); a ``.real`` computes only the real half of its last transform; an FFT the pass cannot rewrite (its
complex result read by an op without a rule, a dim of dynamic size) is refused by the backend naming the op."""

from __future__ import annotations

import pytest
import torch

from tests.converter.pass_backends import call_targets, run_on
from tpu_export import converter, tpu_backend
from tpu_export.converter.errors import UnsupportedOpsError
from tpu_export.converter.numerics import rel_err
from tpu_export.edge import convert_program

aten = torch.ops.aten
TOL = 1e-5  # float32 sums of at most 2 x 16 products per transformed dim: ~1e-7 measured


class FourierMix(torch.nn.Module):
    """FNet's token mixing."""

    def forward(self, x):
        return torch.fft.fftn(x, dim=(1, 2)).real


class FourierParts(torch.nn.Module):
    def forward(self, x):
        f = torch.fft.fft(x, dim=-1)
        return f.real, f.imag


class FourierConv(torch.nn.Module):
    """A circular convolution by its spectrum: complex products between a forward and an inverse transform."""

    def forward(self, x, k):
        return torch.fft.irfft(torch.fft.rfft(x, n=16) * torch.fft.rfft(k, n=16), n=16)[..., :8]


class FourierNorms(torch.nn.Module):
    """Transforms of the same size with other normalizations and directions, and of a real and a complex input."""

    def forward(self, x):
        f = torch.fft.fft(x, dim=-1)
        back = torch.fft.ifft(f * 2.0, dim=-1, norm="forward")
        return f.real, torch.fft.fft(x, dim=-1, norm="ortho").imag, back.real, torch.fft.fft(f * x, dim=-1).imag


class FourierMagnitude(torch.nn.Module):
    def forward(self, x):
        return torch.fft.fft(x, dim=-1).abs()  # abs of a complex: no rule


def _g():
    return torch.Generator().manual_seed(0)


CASES = {
    "fftn_dims_1_2_real": (FourierMix, (torch.randn(2, 6, 8, generator=_g()),)),
    "fft_last_real_imag": (FourierParts, (torch.randn(2, 5, 7, generator=_g()),)),
    "rfft_product_irfft": (FourierConv, (torch.randn(3, 8, generator=_g()), torch.randn(3, 8, generator=_g()))),
    "same_sizes_other_norms": (FourierNorms, (torch.randn(2, 6, generator=_g()),)),
}


@pytest.mark.parametrize("backend", ["litert", "tpu"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_fft_runs_as_real_matmuls(case, backend):
    cls, args = CASES[case]
    module = cls().eval()
    prog = converter.prepare(module, args)
    assert not [op for op in call_targets(prog) if "fft" in str(op)]
    got = run_on(prog, backend)(*args)
    with torch.no_grad():
        want = module(*args)
    got, want = (got, want) if isinstance(want, tuple) else ((got,), (want,))
    for g, w in zip(got, want):
        assert g.shape == w.shape
        assert rel_err(g, w) <= TOL, (case, backend, rel_err(g, w))


class TwoMixes(torch.nn.Module):
    def forward(self, x):
        return torch.fft.fftn(torch.fft.fftn(x, dim=(1, 2)).real + x, dim=(1, 2)).real


def test_real_part_computes_only_the_real_half_and_layers_share_the_matrices():
    prog = converter.prepare(TwoMixes().eval(), (torch.randn(2, 6, 8),))
    matmuls = [op for op in call_targets(prog) if op in (aten.linear.default, aten.matmul.default, aten.mm.default)]
    assert len(matmuls) == 6  # per mix: dim 1 real and imaginary parts, dim 2 the real part
    assert len([w for w in prog.weights if w.startswith("dft_")]) == 3


def test_fft_whose_complex_result_has_no_rule_is_refused_naming_it():
    prog = converter.prepare(FourierMagnitude().eval(), (torch.randn(2, 8),))
    with pytest.raises(UnsupportedOpsError, match=r"aten\._fft_r2c\.default"):
        convert_program(prog)
    with pytest.raises(UnsupportedOpsError, match=r"aten\._fft_r2c\.default"):
        tpu_backend.export_program(prog, platforms=("cpu",))


def test_fft_over_a_dynamic_dim_is_refused_naming_it():
    x = torch.randn(2, 8)
    dyn = {"x": {1: torch.export.Dim("n", min=2, max=64)}}
    prog = converter.prepare(FourierParts().eval(), (x,), dynamic_shapes=dyn)
    with pytest.raises(UnsupportedOpsError, match=r"aten\._fft_r2c\.default"):
        convert_program(prog)


def test_fft_over_static_dims_with_a_dynamic_batch():
    module = FourierMix().eval()
    dyn = {"x": {0: torch.export.Dim("batch", min=1, max=8)}}
    prog = converter.prepare(module, (torch.randn(2, 6, 8),), dynamic_shapes=dyn)
    x = torch.randn(3, 6, 8, generator=_g())
    got = tpu_backend.export_program(prog, platforms=("cpu",))(x)
    assert rel_err(got, module(x)) <= TOL


FNET_CONFIGS = {
    "fftn": {},  # torch.fft.fftn(x, dim=(1, 2)): the default
    "dft_matrices": {"use_tpu_fourier_optimizations": True},  # complex DFT weights in an einsum (scipy's dft)
    "fft_per_axis": {"use_tpu_fourier_optimizations": True, "max_position_embeddings": 8192},  # fft on each axis
}


@pytest.mark.parametrize("backend", ["litert", "tpu"])
@pytest.mark.parametrize("variant", sorted(FNET_CONFIGS))
def test_fnet_matches_transformers(variant, backend):
    transformers = pytest.importorskip("transformers")
    if variant == "dft_matrices":
        pytest.importorskip("scipy")
    kw = {"max_position_embeddings": 64, **FNET_CONFIGS[variant]}
    config = transformers.FNetConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, intermediate_size=64,
                                     tpu_short_seq_length=8, **kw)
    torch.manual_seed(0)
    model = transformers.FNetModel(config).eval()

    class Hidden(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, ids):
            return self.model(input_ids=ids).last_hidden_state

    ids = torch.randint(0, 100, (2, 8), generator=_g(), dtype=torch.int32)
    prog = converter.prepare(Hidden().eval(), (ids,))
    assert not [op for op in call_targets(prog) if "fft" in str(op) or "complex" in str(op)]
    with torch.no_grad():
        want = model(input_ids=ids.long()).last_hidden_state
    assert rel_err(run_on(prog, backend)(ids), want) <= TOL
