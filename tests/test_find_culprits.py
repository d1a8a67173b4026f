"""litert_torch.debug.find_culprits and `tpu-export debug`: a model with one op planted to fail (a lowering that is
wrong on purpose, or no lowering at all) -> that op is the culprit, with the user's source line and a snippet that
runs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tpu_export import edge, litert_torch


@torch.library.custom_op("test_find_culprits::tripled", mutates_args=())
def tripled(x: torch.Tensor) -> torch.Tensor:
    return x * 3


@tripled.register_fake
def _(x):
    return torch.empty_like(x)


@edge.lowering(torch.ops.test_find_culprits.tripled.default)
def _tripled_wrong(lw, x):  # planted: multiplies by 2, where torch multiplies by 3
    two = lw.tensor(lw.const(np.asarray(2, x.dtype)))
    return lw.op("MUL", [lw.tensor(x), two], x.shape, x.dtype, x.perm, lw.options("Mul"))


@torch.library.custom_op("test_find_culprits::unlowered", mutates_args=())
def unlowered(x: torch.Tensor) -> torch.Tensor:
    return x + 1


@unlowered.register_fake
def _(x):
    return torch.empty_like(x)


class Planted(torch.nn.Module):
    def __init__(self, op):
        super().__init__()
        self.op = op
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        y = torch.relu(self.lin(x))
        y = torch.tanh(y) + 1
        z = self.op(y)  # the planted op
        return torch.sigmoid(z).sum(-1)


def make_planted():
    """The CLI's MODEL factory: (module, sample args)."""
    torch.manual_seed(0)
    return Planted(tripled).eval(), (torch.randn(2, 8),)


def test_a_wrong_lowering_is_the_one_culprit():
    m, args = make_planted()
    culprits = list(litert_torch.debug.find_culprits(m, args))
    assert len(culprits) == 1
    c = culprits[0]
    assert c.ops == ["test_find_culprits.tripled.default"]
    assert c.error is None and c.max_abs_diff > 0.5  # 3y vs 2y with y in [1, 2)
    assert any("test_find_culprits.py" in s and "z = self.op(y)" in s for s in c.stack_traces), c.stack_traces
    assert "z = self.op(y)" in c.code and "torch.ops.test_find_culprits.tripled.default" in c.code
    # the snippet runs as it is (the op's library is imported here) and shows the divergence
    ns: dict = {}
    exec(compile(c.code, "<culprit>", "exec"), ns)  # noqa: S102 - our own generated snippet
    got, ref = ns["converted"](*ns["inputs"]), ns["model"](*ns["inputs"])
    got, ref = (got[0] if isinstance(got, tuple) else got), ref[0]
    torch.testing.assert_close(got, ref * 2 / 3, atol=1e-6, rtol=1e-6)


def test_an_op_without_lowering_is_named_with_the_conversion_error():
    torch.manual_seed(0)
    m = Planted(unlowered).eval()
    (c,) = litert_torch.debug.find_culprits(m, (torch.randn(2, 8),))
    assert c.ops == ["test_find_culprits.unlowered.default"]
    assert c.max_abs_diff is None and c.error.startswith("conversion failed:") and "unlowered" in c.error


def test_max_granularity_stops_narrowing():
    m, args = make_planted()
    (c,) = litert_torch.debug.find_culprits(m, args, max_granularity=4)
    assert "test_find_culprits.tripled.default" in c.ops and 1 < len(c.ops) <= 4


def test_a_model_that_converts_has_no_culprit():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.Tanh()).eval()
    assert list(litert_torch.debug.find_culprits(m, (torch.randn(2, 8),))) == []


def test_errors_only_ignores_numbers():
    m, args = make_planted()
    assert list(litert_torch.debug.find_culprits(m, args, atol=None)) == []


def test_the_cli_names_the_culprit(capsys):
    from tpu_export.cli import main

    assert main(["debug", "tests.test_find_culprits:make_planted"]) == 1
    out = capsys.readouterr().out
    assert "culprit: test_find_culprits.tripled.default" in out and "z = self.op(y)" in out


def test_the_cli_checks_its_flags_first():
    from tpu_export.cli import main

    with pytest.raises(SystemExit):
        main(["debug"])
    assert main(["debug", "tests.test_find_culprits:make_planted", "--atol", "-1"]) == 2


def test_a_snippet_with_weights_runs(tmp_path):
    m, args = make_planted()
    (c,) = litert_torch.debug.find_culprits(m, args, max_granularity=100)  # the whole graph, the Linear included
    assert len(c.ops) == 7 and "register_buffer" in c.code
    ns: dict = {}
    exec(compile(c.code, "<culprit>", "exec"), ns)  # noqa: S102 - our own generated snippet
    (got,) = ns["converted"](*ns["inputs"])
    assert got.shape == (2,)


def test_the_cli_takes_a_pt2_file(tmp_path, capsys):
    from tpu_export.cli import main

    m, args = make_planted()
    path = str(tmp_path / "planted.pt2")
    torch.export.save(torch.export.export(m, args), path)
    assert main(["debug", path, "--max-granularity", "1"]) == 1
    assert "culprit: test_find_culprits.tripled.default" in capsys.readouterr().out
