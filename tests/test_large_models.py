"""Large models (#16): weights streamed into the .tflite, the large-model form past 2 GiB, weights
from a weights_loader, parameters freed as they are written. Small models check that every path
gives the bytes of the in-memory conversion; one real > 2 GiB model runs when memory allows."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from tests.numerics import rel_err
from tpu_export import litert_torch

pytestmark = [pytest.mark.slow]


class Tied(torch.nn.Module):
    """Embedding tied to the output projection, a conv whose weights the lowering transforms, a
    parameter forward never reads, and a buffer."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(600, 48)
        self.conv = torch.nn.Conv1d(48, 48, 3, padding=1)
        self.unused = torch.nn.Linear(48, 48)
        self.head = torch.nn.Linear(48, 600, bias=False)
        self.head.weight = self.emb.weight
        self.register_buffer("scale", torch.linspace(0.5, 1.5, 48))

    def forward(self, ids):
        h = self.emb(ids) * self.scale
        h = self.conv(h.transpose(1, 2)).transpose(1, 2)
        return self.head(torch.relu(h))


def _tied():
    torch.manual_seed(0)
    return Tied().eval(), torch.randint(0, 600, (1, 8))


def test_every_large_model_path_writes_the_in_memory_bytes(tmp_path):
    m, ids = _tied()
    want = m(ids)
    ref = litert_torch.convert(m, (ids,)).tflite_model()

    out = litert_torch.convert(m, (ids,), output_file_path=tmp_path / "a.tflite")
    assert out.path == str(tmp_path / "a.tflite")
    assert (tmp_path / "a.tflite").read_bytes() == ref
    assert rel_err(out(ids), want) < 1e-5

    light = litert_torch.convert(m, (ids,), lightweight_conversion=True)
    assert light.tflite_model() == ref
    temp = light.path
    del light  # its temp file goes with it
    assert not os.path.exists(temp)

    state = {k: v.clone() for k, v in m.state_dict().items()}
    with torch.device("meta"):
        meta = Tied().eval()
    for loader in (state, state.__getitem__, lambda n: state[n.removeprefix("module.")]):
        got = litert_torch.convert(meta, (ids,), weights_loader=loader, output_file_path=tmp_path / "b.tflite")
        assert got.tflite_model() == ref
        assert all(p.is_meta for p in meta.parameters())  # the caller's module is given back as it was

    doomed = Tied().eval()
    doomed.load_state_dict(state)
    got = litert_torch.convert(doomed, (ids,), output_file_path=tmp_path / "c.tflite", delete_in_memory_params=True)
    assert got.tflite_model() == ref
    assert all(p.numel() == 0 for p in doomed.parameters())  # every parameter's storage was let go
    assert rel_err(got(ids), want) < 1e-5


def test_folded_weights_spilled_to_disk_write_the_same_bytes(tmp_path):
    """A norm's scale folded into the next linear's 1.5 MB weight: the copy waits in the builder's
    spill file (not memory) until it is written; the file has the in-memory conversion's bytes."""
    from tpu_export.converter import prepare
    from tpu_export.edge.builder import _Spilled
    from tpu_export.edge.convert import lower_program, write_model

    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.RMSNorm(512), torch.nn.Linear(512, 768)).eval()
    with torch.no_grad():
        m[0].weight.uniform_(0.5, 1.5)
    x = torch.randn(2, 512)
    want = m(x).detach()
    ref = litert_torch.convert(m, (x,)).tflite_model()
    lowered = lower_program(prepare(m, (x,)), spill=True, spill_folder=str(tmp_path))
    assert sum(isinstance(b.data, _Spilled) for b in lowered.buffers) == 1  # the folded weight
    assert open(write_model(lowered, tmp_path / "a.tflite"), "rb").read() == ref
    got = litert_torch.convert(m, (x,), output_file_path=tmp_path / "b.tflite", delete_in_memory_params=True)
    assert got.tflite_model() == ref
    assert rel_err(got(x), want) < 1e-5


def test_equal_large_weights_are_stored_once():
    """Large buffers are compared by sampled pages first, then whole: two 1 MiB weights with the same
    values (separate tensors) are stored once, two of the same size that differ in one value twice."""
    torch.manual_seed(0)
    m = torch.nn.Sequential(*[torch.nn.Linear(512, 512, bias=False) for _ in range(4)]).eval()
    with torch.no_grad():
        m[2].weight.copy_(m[0].weight)
        m[3].weight.copy_(m[1].weight)
        m[3].weight[300, 7] += 1.0  # off the sampled pages: only the whole digest tells them apart
    x = torch.randn(2, 512)
    model = litert_torch.convert(m, (x,))
    assert 3 * 2**20 < len(model.tflite_model()) < 3 * 2**20 + 65536
    assert rel_err(model(x), m(x)) < 1e-5


def test_weights_loader_errors_name_the_parameter():
    m, ids = _tied()
    with torch.device("meta"):
        meta = Tied().eval()
    state = m.state_dict()
    missing = {k: v for k, v in state.items() if k != "conv.weight"}
    with pytest.raises(KeyError, match=r"'conv\.weight' \(48, 48, 3\) is on the meta device and weights_loader"):
        litert_torch.convert(meta, (ids,), weights_loader=missing)
    wrong = dict(state, **{"conv.bias": torch.zeros(7)})
    with pytest.raises(KeyError, match=r"gave 'conv\.bias' the shape \(7,\).*has \(48,\)"):
        litert_torch.convert(meta, (ids,), weights_loader=wrong)
    assert all(p.is_meta for p in meta.parameters())


def test_large_model_form_reads_everywhere(tmp_path):
    """The large-model form (forced on a small model): the checker, the interpreter from a path,
    litert_torch.load, `tpu-export inspect` and ai-edge-quantizer all read it."""
    from tpu_export.converter import prepare
    from tpu_export.edge.convert import write_program
    from tpu_export.edge.quantize import quantize_tflite
    from tpu_export.edge.tflite_check import TfliteFormatError, check_tflite
    from tpu_export.targets.describe import describe_tflite

    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 64)).eval()
    x = torch.randn(2, 256)
    path = write_program(prepare(m, (x,)), tmp_path / "m.tflite", large=True)
    data = open(path, "rb").read()
    classic = litert_torch.convert(m, (x,)).tflite_model()
    assert data != classic and abs(len(data) - len(classic)) < 4096
    check_tflite(data, path)
    assert rel_err(litert_torch.Model(path)(x), m(x)) < 1e-5
    assert rel_err(litert_torch.load(path)(x), m(x)) < 1e-5
    assert "FULLY_CONNECTED                  2" in describe_tflite(path)
    q = litert_torch.Model(quantize_tflite(data, "weight_only_int8"))
    assert len(q.tflite_model()) < len(data) / 3 and rel_err(q(x), m(x)) < 0.02
    # a weight's offset/size past the end of the file is refused before any interpreter sees it
    with pytest.raises(TfliteFormatError, match="past the end of the"):
        check_tflite(data[:-1000], "cut.tflite")


def test_memory_check_refuses_before_any_work(monkeypatch):
    from tpu_export.litert_torch import _large

    m, ids = _tied()
    monkeypatch.setattr(_large, "mem_available", lambda: 1 << 20)
    with pytest.raises(MemoryError, match=r"needs about .* GiB more, but the machine has 0\.0 GiB available.*Fix: "):
        litert_torch.convert(m, (ids,))


# ~620 M fp32 parameters: two big layers, a 2.5 GB .tflite
_VOCAB, _DIM = 302_000, 1024
_NEEDS = 9 << 30  # the module, the page cache of the file the interpreter maps, and headroom


def _mem_available() -> int:
    from tpu_export.litert_torch._large import mem_available

    return mem_available() or 0


class Big(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(_VOCAB, _DIM, _weight=torch.empty(_VOCAB, _DIM).uniform_(-1, 1))
        self.head = torch.nn.Linear(_DIM, _VOCAB, bias=False)
        with torch.no_grad():
            self.head.weight.uniform_(-0.03, 0.03)

    def forward(self, ids):
        return self.head(self.emb(ids))


@pytest.mark.skipif(_mem_available() < _NEEDS, reason=f"needs {_NEEDS >> 30} GiB of MemAvailable for a 2.5 GB model")
def test_a_model_past_2gib_converts_loads_and_matches_torch(tmp_path):
    from ai_edge_litert.interpreter import Interpreter

    torch.manual_seed(0)
    m = Big().eval()
    ids = torch.tensor([[1, 77, 5000, _VOCAB - 1]])
    want = m(ids).detach()
    path = tmp_path / "big.tflite"
    lines = []
    model = litert_torch.convert(m, (ids,), output_file_path=path, progress=lines.append)
    size = os.path.getsize(path)
    assert size > 2**31 + 2**28  # past the flatbuffer's 2 GiB
    assert lines and "tensors" in lines[-1] and "MiB/s" in lines[-1]
    assert rel_err(model(ids), want) < 1e-5
    del model
    # the LiteRT interpreter maps the file itself (a .tflite this size loads only from a path)
    it = Interpreter(model_path=str(path))
    runner = it.get_signature_runner()
    got = runner(ids=ids.numpy().astype(np.int32))
    assert rel_err(next(iter(got.values())), want) < 1e-5


def test_dynamic_int8_while_streaming_gives_ai_edge_quantizers_weights(tmp_path, monkeypatch):
    """Quantized tensor by tensor as the file is written: each FULLY_CONNECTED weight gets the int8
    bytes and per-channel scales ai-edge-quantizer's dynamic_int8 gives it, and the model computes
    what the quantizer's model computes."""
    from tpu_export.edge.inspect import read_model
    from tpu_export.edge.quantize import quantize_tflite
    from tpu_export.litert_torch import _large

    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 256)).eval()
    x = torch.randn(3, 256)
    theirs = litert_torch.Model(quantize_tflite(litert_torch.convert(m, (x,)).tflite_model(), "dynamic_int8"))
    monkeypatch.setattr(_large, "_STREAM_QUANT_FROM", 0)  # the 1 GiB threshold, for a 2 MB model
    ours = litert_torch.convert(m, (x,), quant_config="dynamic_int8", output_file_path=tmp_path / "q.tflite")

    def fc_weights(data):
        mt = read_model(data)
        out = {}
        for t in mt.subgraphs[0].tensors:
            if t.type == 9:  # INT8
                buf = mt.buffers[t.buffer]  # the quantizer writes the large-model form (data after the flatbuffer)
                raw = bytes(buf.data) if buf.data is not None else data[buf.offset:buf.offset + buf.size]
                out[t.name.decode()] = (np.frombuffer(raw, np.int8),
                                        np.asarray(t.quantization.scale), t.quantization.quantizedDimension)
        return out

    a, b = fc_weights(ours.tflite_model()), fc_weights(theirs.tflite_model())
    assert sorted(a) == sorted(b) == ["0.weight", "2.weight"]
    for k in a:
        assert np.array_equal(a[k][0], b[k][0]) and np.array_equal(a[k][1], b[k][1]) and a[k][2] == b[k][2] == 0
    assert os.path.getsize(tmp_path / "q.tflite") < 0.3 * 4 * sum(p.numel() for p in m.parameters())
    assert rel_err(ours(x), theirs(x)) < 1e-6
    assert rel_err(ours(x), m(x)) < 0.02


class _Cnn(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.fc = torch.nn.Linear(8, 5)

    def forward(self, x):
        return self.fc(torch.relu(self.conv(x)).mean((2, 3))), torch.sigmoid(self.conv(x))


def test_multi_target_convert_streams_the_same_files(tmp_path, monkeypatch):
    """tpu_export.convert (the CLI's convert) writes android / cpu .tflite files straight to disk: no
    bytes of the whole model (convert_program is never called), the same file and compatibility figures
    as the bytes path, and the same numbers as torch."""
    import tpu_export
    from tpu_export import edge
    from tpu_export.converter.pipeline import SignatureRequest, prepare_many
    from tpu_export.targets.compat import compatibility
    from tpu_export.targets.mobile import lower_edge

    torch.manual_seed(0)
    m, x = _Cnn().eval(), torch.randn(1, 3, 12, 12)
    want = {n: lower_edge(prepare_many([SignatureRequest("serving_default", m, (x,))]), channel_last=cl)
            for n, cl in (("android", True), ("cpu", False))}

    def no_bytes(*a, **k):
        raise AssertionError("the multi-target convert built the model's bytes")

    monkeypatch.setattr(edge.convert, "convert_program", no_bytes)
    written = tpu_export.convert(m, (x,), targets=["android", "cpu"], out_dir=tmp_path)
    summary = __import__("json").loads((tmp_path / "summary.json").read_text())
    for name, data in want.items():
        assert open(written[name], "rb").read() == data
        t = summary["targets"][name]
        assert t["files"] == [f"{name}.tflite"] and t["bytes"] == len(data)
        for d, figs in t["compatibility"].items():
            rep = compatibility(data, name, delegate=d)
            assert figs == {"accelerated": rep.accelerated_count, "fallback": rep.fallback, "total": rep.total}
    got = litert_torch.load(written["cpu"])(x)
    assert all(rel_err(g, w) < 1e-5 for g, w in zip(got, m(x)))


def test_inspect_maps_the_file_instead_of_reading_it(tmp_path):
    """`tpu-export inspect` of a 64 MiB .tflite allocates no copy of it (the file is mapped; the
    interpreter maps it too), and still lists the signature and the ops."""
    import tracemalloc

    from tpu_export.targets.describe import describe_tflite

    torch.manual_seed(0)
    m, x = torch.nn.Linear(4096, 4096).eval(), torch.randn(1, 4096)
    path = tmp_path / "big.tflite"
    litert_torch.convert(m, (x,), output_file_path=path)
    size = os.path.getsize(path)
    assert size > 64 << 20
    describe_tflite(str(path))  # imports and first-use caches outside the measurement
    tracemalloc.start()
    try:
        text = describe_tflite(str(path))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < size // 16, f"describe allocated {peak:,} bytes for a {size:,}-byte file"
    assert f"LiteRT flatbuffer, {size:,} bytes" in text and "FULLY_CONNECTED                  1" in text


def test_a_computed_weight_is_compared_with_the_spilled_one_and_a_view_is_matched_by_address(tmp_path):
    """Deciding two large buffers equal (#15): a computed array (a fold, as the decode signature recomputes it) is
    compared byte for byte with the spilled earlier copy, so equal bytes share a buffer and a one-value difference
    off the sampled pages does not; a parameter's view read again is its buffer at once, by address."""
    from tpu_export.edge.builder import ModelBuilder, _Spilled

    rng = np.random.default_rng(0)
    b = ModelBuilder()
    b.spill_to(str(tmp_path))
    folded = rng.standard_normal((512, 1024), dtype=np.float32)
    first = b.buffer(folded * 2)
    assert isinstance(b.buffers[first].data, _Spilled)
    assert b.buffer(folded * 2) == first
    other = folded * 2
    other[300, 7] += 1.0  # off the 16 sampled pages
    assert b.buffer(other) not in (first, None)
    param = torch.nn.Parameter(torch.from_numpy(folded.copy()), requires_grad=False)
    view = b.buffer(param.detach().numpy())
    assert b.buffer(param.detach().numpy()) == view != first
    assert b.buffer(param.detach().clone().numpy()) == view  # another address, the same bytes: compared
    assert len(b.buffers) == 4
    spill = b._spill
    with open(tmp_path / "m.tflite", "wb") as f:
        b.write(f, large=True)
    assert spill.closed and b._spill is None  # its (unlinked) pages dropped once every spilled buffer is written
    data = (tmp_path / "m.tflite").read_bytes()
    assert data.count((folded * 2).tobytes()) == 1 and data.count(other.tobytes()) == 1
    assert data.count(folded.tobytes()) == 1
