"""The public litert_torch API: convert, Model, export/load, multi-signature, bad input."""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest
import torch
from torch import nn

from tests.edge._util import assert_close
from tpu_export import litert_torch

RTOL = 1e-5


def _convert(*a, **k):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return litert_torch.convert(*a, **k)


class TwoHeads(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(8, 16)
        self.a = nn.Linear(16, 4)
        self.b = nn.Linear(16, 3)

    def forward(self, x, scale):
        h = torch.relu(self.body(x)) * scale
        return {"a": self.a(h), "pair": (self.b(h), h.sum(-1))}


def _two_heads():
    torch.manual_seed(0)
    return TwoHeads().eval(), (torch.randn(2, 8), torch.rand(2, 1) + 0.5)


def test_convert_returns_model_with_output_structure():
    m, args = _two_heads()
    model = _convert(m, args)
    got = model(*args)
    with torch.no_grad():
        want = m(*args)
    assert isinstance(got, dict) and set(got) == {"a", "pair"} and isinstance(got["pair"], tuple)
    assert all(isinstance(t, torch.Tensor) for t in (got["a"], *got["pair"]))
    assert_close(got, want, RTOL)
    assert_close(model(args[0], scale=args[1]), want, RTOL)  # kwargs by name


def test_model_reuses_one_interpreter():
    m, args = _two_heads()
    model = _convert(m, args)
    model(*args)
    first = model._interpreter
    model(*args)
    assert model._interpreter is first


def test_export_and_load_roundtrip(tmp_path):
    m, args = _two_heads()
    model = _convert(m, args)
    path = tmp_path / "m.tflite"
    model.export(path)
    assert path.read_bytes() == model.tflite_model()
    assert path.read_bytes()[4:8] == b"TFL3"
    assert os.listdir(tmp_path) == ["m.tflite"]  # no temp file left behind
    loaded = litert_torch.load(path)
    with torch.no_grad():
        assert_close(loaded(*args), m(*args), RTOL)


def test_export_to_unwritable_path_is_clear_and_leaves_nothing(tmp_path):
    m, args = _two_heads()
    model = _convert(m, args)
    missing = tmp_path / "no_such_dir" / "m.tflite"
    with pytest.raises(litert_torch.ModelExportError, match="cannot write"):
        model.export(missing)
    assert not missing.exists()
    locked = tmp_path / "ro"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        if os.access(locked, os.W_OK):
            pytest.skip("running as a user that can write anywhere (root)")
        with pytest.raises(litert_torch.ModelExportError):
            model.export(locked / "m.tflite")
        assert os.listdir(locked) == []
    finally:
        locked.chmod(0o700)


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(32, 64)
        self.out = nn.Linear(64, 32)

    def forward(self, x):
        return self.out(torch.relu(self.proj(x)))


class Decode(nn.Module):
    """A second entry point over the same encoder weights."""

    def __init__(self, enc):
        super().__init__()
        self.enc = enc

    def forward(self, x, y):
        return self.enc(x) + self.enc.out(y)


def _buffers_equal_to(data: bytes, tensor: torch.Tensor) -> int:
    from tpu_export.edge.inspect import read_model

    want = tensor.detach().numpy().tobytes()
    return sum(1 for b in read_model(data).buffers if b.data is not None and bytes(b.data) == want)


@pytest.mark.parametrize("style", ["chain", "converter"])
def test_multi_signature_shares_weights(style):
    torch.manual_seed(0)
    enc = Encoder().eval()
    dec = Decode(enc).eval()
    x, y = torch.randn(2, 32), torch.randn(2, 64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if style == "chain":
            model = litert_torch.signature("encode", enc, (x,)).signature("decode", dec, (x, y)).convert()
        else:
            model = litert_torch.Converter().signature("encode", enc, (x,)).signature("decode", dec, (x, y)).convert()
    assert sorted(model.signature_names()) == ["decode", "encode"]
    with torch.no_grad():
        assert_close(model(x, signature_name="encode"), enc(x), RTOL)
        assert_close(model(x, y, signature_name="decode"), dec(x, y), RTOL)
    data = model.tflite_model()
    for w in (enc.proj.weight, enc.out.weight, enc.out.bias):
        assert _buffers_equal_to(data, w) == 1
    single = len(_convert(enc, (x,)).tflite_model()) + len(_convert(dec, (x, y)).tflite_model())
    assert len(data) < single


def test_load_keeps_signatures(tmp_path):
    torch.manual_seed(0)
    enc = Encoder().eval()
    x = torch.randn(2, 32)
    model = litert_torch.signature("a", enc, (x,)).signature("b", enc, (x * 2,)).convert()
    model.export(tmp_path / "m.tflite")
    loaded = litert_torch.load(tmp_path / "m.tflite")
    with torch.no_grad():
        assert_close(loaded(x, signature_name="b"), enc(x), RTOL)


def test_bad_quant_config_and_no_target_argument():
    m, args = _two_heads()
    with pytest.raises(litert_torch.QuantizationError, match="quant_config must be"):  # quantization: test_quant.py
        litert_torch.convert(m, args, quant_config=object())
    # litert-torch 0.10's convert has no target argument; a deployment target is tpu_export.convert's
    with pytest.raises(TypeError, match="target"):
        litert_torch.convert(m, args, target="android")


class Unsupported(nn.Module):
    def forward(self, x, k):
        a = torch.bitwise_and(k, 3)  # no integer AND builtin in LiteRT
        b = torch.bitwise_or(k, 5)  # nor OR
        return x * (a + b).float()


def test_unsupported_ops_listed_with_source_before_writing(tmp_path):
    from tpu_export.converter import UnsupportedOpsError

    x, k = torch.randn(4), torch.arange(4, dtype=torch.int32)
    with pytest.raises(UnsupportedOpsError) as e:
        _convert(Unsupported(), (x, k))
    msg = str(e.value)
    assert "bitwise_and" in msg and "bitwise_or" in msg
    assert msg.count("test_api.py") >= 2 and "nothing was written" in msg
    assert os.listdir(tmp_path) == []


class ReturnsNumber(nn.Module):
    def forward(self, x):
        return x + 1, x.shape[0]


def test_non_tensor_output_is_reported():
    from tpu_export.converter import UnsupportedOutputError

    with pytest.raises(UnsupportedOutputError, match="not a tensor"):
        _convert(ReturnsNumber(), (torch.randn(3),))


def test_int64_inputs_and_outputs_run_as_int32():
    class Idx(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(10, 4)

        def forward(self, ids):
            return self.emb(ids), ids.argmax(-1)

    torch.manual_seed(0)
    m = Idx().eval()
    ids = torch.tensor([[1, 7, 3]])
    model = _convert(m, (ids,))
    got = model(ids)
    with torch.no_grad():
        want = m(ids)
    assert_close(got[0], want[0], RTOL)
    np.testing.assert_array_equal(got[1].numpy(), want[1].numpy())
