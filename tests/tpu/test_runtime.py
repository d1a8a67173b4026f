"""Runtime: export -> save -> tpu_backend.load -> run through PJRT (CPU here) == torch eager."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from tests.tpu.artifact_helpers import assert_close_tree, mlp_inputs, mlp_program, rel_err, zoo_program
from tests.zoo import batch_like
from tpu_export import converter, tpu_backend

FP32_TOL = 1e-5


@pytest.fixture(scope="module")
def mlp_artifacts(tmp_path_factory):
    model, prog = mlp_program()
    bundle = tpu_backend.export_program(prog)
    root = tmp_path_factory.mktemp("mlp")
    return model, bundle, bundle.save(root / "mlp.tpuexp"), bundle.save(root / "mlp.tpuexp.zip")


@pytest.mark.parametrize("kind", ["dir", "zip"])
def test_mlp_round_trip_matches_torch(mlp_artifacts, kind):
    model, _, d, z = mlp_artifacts
    prog = tpu_backend.load(d if kind == "dir" else z)
    for batch in (4, 1, 7):  # dynamic batch: any size in [1, 64]
        args, kwargs = mlp_inputs(batch, seed=batch)
        out = prog(*args, **kwargs)  # int64 offset is cast to the signature's int32
        assert isinstance(out["stats"], tuple)
        assert_close_tree(out, model(*args, **kwargs), FP32_TOL)


def test_numpy_inputs_and_signature_name(mlp_artifacts):
    model, _, d, _ = mlp_artifacts
    prog = tpu_backend.load(d)
    args, kwargs = mlp_inputs(3, seed=11)
    out = prog(args[0].numpy(), offset=kwargs["offset"].numpy(), signature_name="serving_default")
    assert_close_tree(out, model(*args, **kwargs), FP32_TOL)
    assert prog.signature_names == ["serving_default"]
    with pytest.raises(KeyError, match="no signature 'nope'"):
        prog(*args, signature_name="nope", **kwargs)


def test_bad_inputs_give_clear_errors(mlp_artifacts):
    _, _, d, _ = mlp_artifacts
    prog = tpu_backend.load(d)
    args, kwargs = mlp_inputs(2)
    with pytest.raises(ValueError, match=r"dim 1 must be 16"):
        prog(torch.randn(2, 15), **kwargs)
    with pytest.raises(ValueError, match=r"outside its range \[1, 64\]"):
        prog(torch.randn(65, 16), offset=torch.zeros(65, dtype=torch.long))
    with pytest.raises(ValueError, match="outside the int32 range"):
        prog(*args, offset=torch.full((2,), 2**40))
    with pytest.raises(TypeError, match=r"takes inputs \['x', 'offset'\]"):
        prog(*args)


def test_in_memory_bundle_runs_like_the_artifact(mlp_artifacts):
    model, bundle, _, _ = mlp_artifacts
    args, kwargs = mlp_inputs(5, seed=3)
    assert_close_tree(bundle(*args, **kwargs), model(*args, **kwargs), FP32_TOL)


@pytest.mark.parametrize("name", ["resnet18", "bert"])
def test_zoo_round_trip_dynamic_batch(tmp_path, name):
    """A CNN and a transformer (int64 token ids + attention mask) through the artifact."""
    model, args, prog = zoo_program(name, dynamic=True)
    path = tpu_backend.export_program(prog).save(tmp_path / f"{name}.tpuexp.zip")
    loaded = tpu_backend.load(path)
    for n in (2, 3):
        xs = batch_like(args, n, seed=n)
        with torch.no_grad():
            ref = model(*xs)
        assert_close_tree(loaded(*xs), ref, FP32_TOL)


@pytest.mark.libtpu
def test_stored_executable_is_used_when_it_matches(tmp_path, caplog):
    """The stored-executable path (raw PJRT bytes, no pickle) exercised with a CPU compile of
    this process's own in-memory bundle: used for the shapes it was compiled for; other shapes
    compile the StableHLO, said once. Read back from a file, the same CPU executable is never
    loaded, even on request: only TPU executables are (see test_artifact_security)."""
    import jax

    model, prog = mlp_program()
    bundle = tpu_backend.export_program(prog)
    tpu_backend.compile_on_devices(bundle, jax.devices(), target="cpu", topology="host", dim_values={"batch": 4})
    loaded = bundle.to_program()
    args, kwargs = mlp_inputs(4, seed=5)
    with caplog.at_level(logging.INFO, logger="tpu_export.tpu_backend.runtime"):
        assert_close_tree(loaded(*args, **kwargs), model(*args, **kwargs), FP32_TOL)
        assert loaded.uses_stored_executable()
        for b in (3, 5):
            args, kwargs = mlp_inputs(b, seed=b)
            assert_close_tree(loaded(*args, **kwargs), model(*args, **kwargs), FP32_TOL)
    compiling = [r for r in caplog.records if "compiling the StableHLO" in r.getMessage()]
    assert len(compiling) == 1, [r.getMessage() for r in caplog.records]
    assert "compiled for input shapes [[4, 16], [4]]" in compiling[0].getMessage()
    path = bundle.save(tmp_path / "mlp.tpuexp")
    for opt_in in (False, True):
        from_file = tpu_backend.load(path, use_compiled=opt_in)
        args, kwargs = mlp_inputs(4, seed=5)
        assert_close_tree(from_file(*args, **kwargs), model(*args, **kwargs), FP32_TOL)
        assert not from_file.uses_stored_executable()


def test_multi_signature_program_shares_weights(tmp_path):
    torch.manual_seed(0)
    enc = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh()).eval()

    class Twice(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            return self.inner(self.inner(x))

    x = torch.randn(2, 8)
    prog = converter.prepare_many([
        converter.SignatureRequest("serving_default", enc, (x,)),
        converter.SignatureRequest("twice", Twice(enc), (x,)),
    ])
    path = tpu_backend.export_program(prog).save(tmp_path / "two.tpuexp")
    loaded = tpu_backend.load(path)
    assert sorted(loaded.signature_names) == ["serving_default", "twice"]
    assert len(loaded.manifest["weights"]["tensors"]) == 2  # stored once, read by both
    with torch.no_grad():
        assert rel_err(loaded(x), enc(x)) <= FP32_TOL
        assert rel_err(loaded(x, signature_name="twice"), enc(enc(x))) <= FP32_TOL


def test_bfloat16_export_halves_weights_and_stays_close(tmp_path):
    model, args, prog = zoo_program("vit")
    path = tpu_backend.export_program(prog, dtype="bfloat16").save(tmp_path / "vit_bf16.tpuexp")
    loaded = tpu_backend.load(path)
    dtypes = {t["dtype"] for t in loaded.manifest["weights"]["tensors"].values()}
    assert "bfloat16" in dtypes and "float32" not in dtypes
    with torch.no_grad():
        ref = model(*args)
    out = loaded(*args)
    assert out.dtype == torch.float32  # the model's own output dtype
    # bf16 keeps 8 mantissa bits; through a few transformer blocks 5e-2 of the output range holds.
    assert rel_err(out, ref) <= 5e-2


def test_platforms_are_checked(tmp_path):
    _, prog = mlp_program()
    with pytest.raises(tpu_backend.ExportError, match="unknown platform"):
        tpu_backend.export_program(prog, platforms=("tpu", "metal"))
    path = tpu_backend.export_program(prog, platforms=("tpu",)).save(tmp_path / "tpu_only.tpuexp")
    with pytest.raises(RuntimeError, match=r"exported for platforms \['tpu'\].*runs on cpu"):
        tpu_backend.load(path)
    cuda = tpu_backend.export_program(prog, platforms=("cuda", "cpu"))
    assert tuple(cuda.signatures["serving_default"].exported.platforms) == ("cuda", "cpu")


def test_weights_are_memory_mapped(mlp_artifacts):
    from tpu_export.tpu_backend.artifact.load import read_artifact

    _, bundle, d, z = mlp_artifacts
    for path in (d, z):
        art = read_artifact(path)
        w = art.weights["fc1.weight"]
        assert isinstance(w.base, np.memmap) or isinstance(w, np.memmap)
        np.testing.assert_array_equal(w, bundle.weights["fc1.weight"].numpy())
