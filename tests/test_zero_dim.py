"""0-dim parameters and buffers (swin_t's failure in #17: a 0-dim weight broke Program.fingerprint):
each backend converts, stores, reloads and matches torch eager."""

from __future__ import annotations

import pytest
import torch

import tpu_export
from tests.numerics import rel_err

pytestmark = [pytest.mark.libtpu]


class ZeroDim(torch.nn.Module):
    """A learned 0-dim scale (a Parameter), a 0-dim float buffer and a 0-dim integer buffer, each
    used with the input so that none can be folded away."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc = torch.nn.Linear(8, 8)
        self.logit_scale = torch.nn.Parameter(torch.tensor(2.5))
        self.register_buffer("shift", torch.tensor(-0.75))
        self.register_buffer("steps", torch.tensor(3, dtype=torch.int32))

    def forward(self, x):
        h = self.fc(x) * self.logit_scale.exp() + self.shift
        return h * self.steps.to(h.dtype)


@pytest.mark.parametrize("target", ["tpu-v6e", "android"])
def test_zero_dim_parameters_and_buffers(target, tmp_path):
    model = ZeroDim().eval()
    x = torch.randn(2, 8, generator=torch.Generator().manual_seed(1))
    written = tpu_export.convert(model, (x,), targets=[target], out_dir=tmp_path)
    if target == "android":
        from tpu_export import litert_torch

        got = litert_torch.load(written[target])(x)
    else:
        from tpu_export import tpu_backend

        art = tpu_backend.read_artifact(written[target])
        assert {n: tuple(t.shape) for n, t in art.weights.items() if t.ndim == 0}, "the 0-dim weights were folded"
        got = tpu_backend.load(written[target])(x)
    with torch.no_grad():
        want = model(x)
    assert rel_err(got, want) <= 1e-5
