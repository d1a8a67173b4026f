"""Eager / torch.export sanity checks for the model zoo (tests/zoo.py) and the op table
(tests/op_rows.py).  Backend-independent: nothing here converts anything."""

from __future__ import annotations

import pytest
import torch
from torch.export import Dim

from tests.numerics import rel_err

try:  # run from the repository root (python -m pytest): tests/ is a namespace package
    from tests import op_rows, zoo
except ImportError:  # pytest's rootdir-relative import of tests/ as a plain directory
    import op_rows
    import zoo

pytestmark = [pytest.mark.zoo_selfcheck, pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel")]


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    # tiny graphs: intra-op threads only oversubscribe the cores that pytest-xdist uses
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _flat(out):
    if isinstance(out, torch.Tensor):
        return [out]
    return [t for o in out for t in _flat(o)]


def _assert_close(got, want, rtol=1e-5, what=""):
    got, want = _flat(got), _flat(want)
    assert len(got) == len(want), what
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.shape == w.shape and g.dtype == w.dtype, (what, i, g.shape, w.shape, g.dtype, w.dtype)
        if w.is_floating_point():
            assert torch.isfinite(w).all(), (what, i)
            err = rel_err(g, w)
            assert err <= rtol, f"{what} output {i}: rel err {err:.3g} > {rtol}"
        else:
            assert torch.equal(g, w), (what, i)


# --------------------------------------------------------------------------------------
# zoo
# --------------------------------------------------------------------------------------

ZOO_NAMES = list(zoo.ZOO)


@pytest.mark.parametrize("name", ZOO_NAMES)
def test_zoo_eager_and_export(name):
    entry = zoo.ZOO[name]
    assert entry.kind in ("cnn", "transformer")
    m, args = zoo.build(name)
    assert not m.training
    assert zoo.param_bytes(m) < 1_000_000

    # seeded: a second build gives the same weights and the same sample inputs
    m2, args2 = zoo.build(name)
    for (k, a), (_, b) in zip(m.state_dict().items(), m2.state_dict().items()):
        assert torch.equal(a, b), k
    for a, b in zip(args, args2):
        assert torch.equal(a, b)
    for bn in (x for x in m.modules() if isinstance(x, torch.nn.modules.batchnorm._BatchNorm)):
        assert not torch.allclose(bn.running_mean, torch.zeros_like(bn.running_mean))
        assert not torch.allclose(bn.running_var, torch.ones_like(bn.running_var))
        assert bool((bn.running_var > 0).all())

    with torch.no_grad():
        out1 = m(*args)
        out2 = m(*args)
    for a, b in zip(_flat(out1), _flat(out2)):
        assert torch.equal(a, b), "eager run is not deterministic"
        assert torch.isfinite(a).all()

    ep = torch.export.export(m, args, strict=False)
    with torch.no_grad():
        _assert_close(ep.module()(*args), out1, what=f"{name} exported")
    # the project consumes core ATen: the decomposition must go through too
    core = ep.run_decompositions()
    with torch.no_grad():
        _assert_close(core.module()(*args), out1, what=f"{name} core aten")


@pytest.mark.parametrize("name", [n for n in ZOO_NAMES if zoo.ZOO[n].dynamic_batch])
def test_zoo_dynamic_batch(name):
    m, args = zoo.build(name)
    batch = Dim("batch", min=1, max=64)
    # every tensor input is batched (ids + attention mask for bert/t5): all share dim 0
    dyn = tuple({0: batch} if isinstance(a, torch.Tensor) else None for a in args)
    # trace at batch 2: a batch-1 sample would be specialised
    ep = torch.export.export(m, zoo.batch_like(args, 2), dynamic_shapes=dyn, strict=False)
    exported = ep.module()
    for n in (1, 4):
        inp = zoo.batch_like(args, n, seed=n)
        with torch.no_grad():
            want = m(*inp)
            got = exported(*inp)
        assert _flat(got)[0].shape[0] == n
        _assert_close(got, want, rtol=1e-5, what=f"{name} batch {n}")


# --------------------------------------------------------------------------------------
# op rows
# --------------------------------------------------------------------------------------


def test_op_rows_table():
    ids = [r.id for r in op_rows.ROWS]
    assert len(ids) == len(set(ids))
    for r in op_rows.ROWS:
        assert r.kind in ("float", "int", "bool"), r.id
        if r.rtol > 1e-5 or r.atol > 0:
            assert r.why, r.id
        assert row_has_tensor(r), r.id


def row_has_tensor(r) -> bool:
    return len(op_rows.row_inputs(r)) > 0


@pytest.mark.parametrize("row", op_rows.ROWS, ids=[r.id for r in op_rows.ROWS])
def test_op_row_eager_and_export(row):
    with torch.no_grad():
        want = row.fn(*row.args, **row.kwargs)
        again = row.fn(*row.args, **row.kwargs)
    for a, b in zip(_flat(want), _flat(again)):
        assert torch.equal(a, b)
    main = _flat(want)[0]
    expected = {"float": main.is_floating_point(), "int": not main.is_floating_point() and main.dtype != torch.bool,
                "bool": main.dtype == torch.bool}[row.kind]
    assert expected, f"{row.id}: kind={row.kind} but output dtype is {main.dtype}"
    for t in _flat(want):
        if t.is_floating_point():
            assert torch.isfinite(t).all(), row.id

    for weights_as_params in (False, True) if row.weights else (False,):
        mod = op_rows.OpModule(row, weights_as_params=weights_as_params)
        inputs = op_rows.row_inputs(row, weights_as_params=weights_as_params)
        ep = torch.export.export(mod, inputs, strict=False)
        with torch.no_grad():
            got = ep.module()(*inputs)
        _assert_close(got, want, rtol=1e-6, what=f"{row.id} (weights_as_params={weights_as_params})")
