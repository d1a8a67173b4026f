"""Inputs are checked the same way on both paths (converter/input_check.py), embedding ids
against their table, and a litert_torch.Model is safe to share between threads.

Every check runs the real runtimes: the LiteRT interpreter and PJRT on CPU."""

from __future__ import annotations

import threading
import warnings

import numpy as np
import pytest
import torch
from torch import nn

from tpu_export import converter, litert_torch, tpu_backend
from tpu_export.converter.index_bounds import index_bounds
from tpu_export.converter.input_check import InputIndexError, InputTypeError, InputValueError, check_inputs

VOCAB = 50


class Tagger(nn.Module):
    """ids -> embedding; ``shift`` is an integer input that feeds no embedding."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 8)
        self.head = nn.Linear(8, 3)

    def forward(self, ids, shift):
        return self.head(self.emb(ids.view(-1, ids.shape[-1]))).sum(1) + shift.unsqueeze(-1).float()


def _quiet(fn, *a, **k):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*a, **k)


def _tagger_args(batch=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (batch, 6), generator=g), torch.randint(0, 4, (batch,), generator=g)


@pytest.fixture(scope="module")
def tagger():
    """(module, edge Model, TPU program): dynamic batch in [1, 8]."""
    torch.manual_seed(0)
    m = Tagger().eval()
    args = _tagger_args()
    b = torch.export.Dim("batch", min=1, max=8)
    dyn = ({0: b}, {0: b})
    edge = _quiet(litert_torch.convert, m, args, dynamic_shapes=dyn)
    prog = _quiet(converter.prepare, m, args, dynamic_shapes=dyn)
    tpu = tpu_backend.export_program(prog, platforms=("cpu",)).to_program()
    return m, edge, tpu


def _both(tagger):
    return [("edge", tagger[1]), ("tpu", tagger[2])]


def test_index_bound_found_and_carried_to_both_artifacts(tagger, tmp_path):
    m, edge, _ = tagger
    prog = _quiet(converter.prepare, m, _tagger_args())
    assert [s.index_bound for s in prog.signature().inputs] == [VOCAB, None]
    assert [s.get("index_bound") for s in edge._signatures["serving_default"]["specs"]] == [VOCAB, None]
    path = tpu_backend.export_program(prog, platforms=("cpu",)).save(tmp_path / "t.tpuexp")
    loaded = tpu_backend.load(path)
    assert [s.index_bound for s in loaded.signature().inputs] == [VOCAB, None]
    ids, shift = _tagger_args(batch=2, seed=4)
    np.testing.assert_allclose(loaded(ids, shift).numpy(), m(ids, shift).detach().numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("bad", [VOCAB, -1, 2**32 + 5])
def test_out_of_vocabulary_ids_fail_like_torch_on_both_paths(tagger, bad):
    m = tagger[0]
    ids, shift = _tagger_args()
    ids[1, 3] = bad
    with pytest.raises(IndexError, match="index out of range in self"):
        m(ids, shift)
    for _path, run in _both(tagger):
        with pytest.raises(InputIndexError, match=rf"index out of range in self: input 'ids' holds ids from "
                                                  rf"-?\d+ to \d+; the embedding it feeds has {VOCAB} rows"):
            run(ids, shift)
    if bad >= 0:  # the same ids as uint64 (numpy): bounded too, never wrapped into range
        for _path, run in _both(tagger):
            with pytest.raises(InputIndexError, match="index out of range in self"):
                run(ids.numpy().astype(np.uint64), shift)


def test_valid_ids_match_torch_on_both_paths(tagger):
    m = tagger[0]
    ids, shift = _tagger_args(batch=3, seed=1)
    ids[0, 0], ids[0, 1] = 0, VOCAB - 1  # both ends of the table
    want = m(ids, shift).detach().numpy()
    for path, run in _both(tagger):
        np.testing.assert_allclose(run(ids, shift).numpy(), want, rtol=1e-5, atol=1e-5, err_msg=path)


@pytest.mark.parametrize("dtype", [torch.int64, np.uint64])
def test_integers_outside_int32_are_refused_not_wrapped(tagger, dtype):
    ids, shift = _tagger_args()
    big = np.full(shift.shape, 2**32 + 5, dtype=np.uint64 if dtype is np.uint64 else np.int64)
    big = torch.from_numpy(big) if dtype is torch.int64 else big
    for _path, run in _both(tagger):
        with pytest.raises(InputValueError, match=r"input 'shift': (int64|uint64) values outside the int32 range"):
            run(ids, big)


def test_wrong_keyword_lists_the_valid_names(tagger):
    ids, shift = _tagger_args()
    for _path, run in _both(tagger):
        with pytest.raises(InputTypeError, match=r"unexpected keyword argument\(s\) \['shfit'\]; valid names: "
                                                 r"\['ids', 'shift'\]"):
            run(ids, shfit=shift)
        got = run(ids, shift=shift)  # the right name binds as Python would
        np.testing.assert_array_equal(got.numpy(), run(ids, shift).numpy())
        with pytest.raises(InputTypeError, match=r"takes inputs \['ids', 'shift'\].*missing \['shift'\]"):
            run(ids)
        with pytest.raises(InputTypeError, match="3 positional values for 2 inputs"):
            run(ids, shift, shift)


def test_dynamic_batch_range_rank_and_shared_dims(tagger):
    for _path, run in _both(tagger):
        for n in (1, 8):
            run(*_tagger_args(batch=n, seed=n))
        with pytest.raises(InputValueError, match=r"input 'ids': dim 0 \(batch\) is 9, outside its range \[1, 8\]"):
            run(*_tagger_args(batch=9))
        ids, shift = _tagger_args(batch=2)
        run(ids, shift)
        with pytest.raises(InputValueError, match=r"input 'ids' has shape \[2, 2, 6\]; .* \(rank 2\)"):
            run(ids.view(2, 1, 6).expand(2, 2, 6), shift)  # the rank-3 call after a call at batch 2
        with pytest.raises(InputValueError, match=r"input 'shift': dim 0 \(batch\) is 3, but input 'ids' has "
                                                  r"batch = 2"):
            run(ids, torch.zeros(3, dtype=torch.long))
        with pytest.raises(InputTypeError, match=r"input 'ids' is float32; signature 'serving_default' takes int32"):
            run(ids.float(), shift)


class SmallConv(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.fc = nn.Linear(4, 5)

    def forward(self, x):
        return self.fc(torch.relu(self.conv(x)).mean((2, 3)))


def test_static_batch_and_channel_last_layout_on_edge():
    torch.manual_seed(0)
    m = SmallConv().eval()
    x = torch.randn(1, 3, 8, 8)
    model = _quiet(litert_torch.convert, m, (x,))
    with pytest.raises(InputValueError, match=r"input 'x' has shape \[4, 3, 8, 8\]; signature 'serving_default' "
                                              r"takes \[1, 3, 8, 8\] \(dim 0 must be 1\)"):
        model(torch.randn(4, 3, 8, 8))
    nhwc = _quiet(litert_torch.convert, litert_torch.to_channel_last_io(m, args=[0]), (x.permute(0, 2, 3, 1),))
    np.testing.assert_allclose(nhwc(x.permute(0, 2, 3, 1)).numpy(), m(x).detach().numpy(), rtol=1e-5, atol=1e-6)
    fix = r"laid out NCHW; the model takes NHWC \(channel-last\) \[1, 8, 8, 3\]. Fix: pass \w+.permute\(0, 2, 3, 1\)"
    with pytest.raises(InputValueError, match=fix):
        nhwc(x)
    # the edge backend's own channel-last boundary (the graph stays NCHW) says the same
    from tpu_export.edge import convert_program

    prog = _quiet(converter.prepare, m, (x,))
    boundary = litert_torch.Model(convert_program(prog, to_channel_last_io=((0,), ())))
    np.testing.assert_allclose(boundary(x.permute(0, 2, 3, 1)).numpy(), m(x).detach().numpy(), rtol=1e-5, atol=1e-6)
    with pytest.raises(InputValueError, match=fix):
        boundary(x)


def test_foreign_tflite_without_metadata_is_checked_by_its_own_signature():
    import flatbuffers
    from ai_edge_litert import schema_py_generated as s

    torch.manual_seed(0)
    m = SmallConv().eval()
    x = torch.randn(1, 3, 8, 8)
    ours = _quiet(litert_torch.convert, m, (x,)).tflite_model()
    obj = s.ModelT.InitFromObj(s.Model.GetRootAs(ours, 0))
    obj.metadata = None  # as another converter would write it: no tpu_export.structure
    b = flatbuffers.Builder(0)
    b.Finish(obj.Pack(b), file_identifier=b"TFL3")
    foreign = litert_torch.Model(bytes(b.Output()))
    assert foreign._signatures["serving_default"]["specs"] == [{"name": "x", "dtype": "float32", "shape": [1, 3, 8, 8]}]
    np.testing.assert_allclose(foreign(x).numpy(), m(x).detach().numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(foreign(x=x).numpy(), m(x).detach().numpy(), rtol=1e-5, atol=1e-6)
    with pytest.raises(InputValueError, match=r"dim 0 must be 1"):
        foreign(torch.randn(2, 3, 8, 8))
    with pytest.raises(InputTypeError, match=r"valid names: \['x'\]"):
        foreign(y=x)


class Residual(nn.Module):
    """Its last op reads the input again, so a call that overwrote the input mid-run shows."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 3, 3, padding=1)

    def forward(self, x):
        return self.b(torch.relu(self.a(x))) + x


def test_model_is_safe_to_share_between_threads():
    # Before the lock, 8 threads x 20 calls gave 14-106 of 160 results from other calls (10 runs).
    torch.manual_seed(0)
    model = _quiet(litert_torch.convert, Residual().eval(), (torch.randn(1, 3, 64, 64),))
    inputs = [[torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(100 * t + i)) for i in range(20)]
              for t in range(8)]
    want = [[model(x) for x in xs] for xs in inputs]  # sequential results
    got = [[None] * 20 for _ in range(8)]
    start = threading.Barrier(8)

    def work(t):
        start.wait()
        for i, x in enumerate(inputs[t]):
            got[t][i] = model(x)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    wrong = sum(not torch.equal(g, w) for gs, ws in zip(got, want) for g, w in zip(gs, ws))
    assert wrong == 0, f"{wrong} of 160 concurrent results differ from the sequential ones"


class Lookup(nn.Module):
    def __init__(self):
        super().__init__()
        self.small, self.big = nn.Embedding(10, 4), nn.Embedding(30, 4)

    def forward(self, a, b, c, d):
        # a: through a cast and views into both tables; b: sliced first (not every value is an id);
        # c: arithmetic first; d: an embedding's weight argument is not its ids
        x = self.big(a.long().reshape(-1).unsqueeze(0)) + self.small(a)
        return x.sum() + self.big(b[:, :1]).sum() + self.small(c + 1).sum() + d.sum()


def test_index_bounds_follow_only_value_keeping_ops():
    args = (torch.zeros(1, 3, dtype=torch.int32), torch.zeros(1, 3, dtype=torch.long),
            torch.zeros(1, 3, dtype=torch.long), torch.zeros(1, 3))
    prog = _quiet(converter.prepare, Lookup().eval(), args)
    sig = prog.signature()
    assert index_bounds(sig.input_nodes()) == [10, None, None, None]
    assert [s.index_bound for s in sig.inputs] == [10, None, None, None]


def test_check_inputs_on_plain_specs():
    specs = [{"name": "ids", "dtype": "int32", "shape": ["b", 4], "index_bound": 7},
             {"name": "x", "dtype": "float32", "shape": ["b", None]}]
    ranges = {"b": (1, 4)}
    ids, x = check_inputs("s", specs, [np.arange(8).reshape(2, 4) % 7, np.zeros((2, 9), np.float64)], ranges)
    assert ids.dtype == np.int32 and x.dtype == np.float32 and x.shape == (2, 9)  # None: any size
    with pytest.raises(InputIndexError, match="holds ids from 0 to 7; .* 7 rows"):
        check_inputs("s", specs, [np.arange(8).reshape(2, 4), np.zeros((2, 1))], ranges)
    with pytest.raises(InputTypeError, match="input 'x' is complex128"):
        check_inputs("s", specs, [np.zeros((2, 4), np.int64), np.zeros((2, 1), complex)], ranges)
    with pytest.raises(InputTypeError, match="input 'ids' is float32"):
        check_inputs("s", specs, [np.zeros((2, 4), np.float32), np.zeros((2, 1))], ranges)
