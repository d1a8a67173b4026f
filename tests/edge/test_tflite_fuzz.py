"""Corrupt .tflite files never crash or hang the process: they are refused (TfliteFormatError) or,
when the damage is only in weight bytes, run or fail with an ordinary Python error.

Seeded and bounded: mutations of three small real models (float CNN, float MLP with a reshape,
and a dynamic-int8 quantized MLP wide enough that ai-edge-quantizer stores its weights after the
flatbuffer), each loaded with ``litert_torch.load`` and, if accepted, called once. That runs in a
child process which regenerates mutation i from the seed file (many per child); a watchdog per
mutation catches a hang, a signal death is a crash, and either restarts the child after it.
"""

from __future__ import annotations

import json
import os
import random
import select
import struct
import subprocess
import sys
import time
import warnings

import numpy as np
import pytest
import torch
from torch import nn

from tpu_export import litert_torch
from tpu_export.edge import tflite_check

N_PER_SEED = 3000
HANG_S = 15.0  # per mutation, after the child's imports; a call here takes milliseconds
RNG_SEED = "tflite-fuzz-1"
SPECIAL = [0, 1, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, 0xFFFFFFFE, 0x10000, 0x7FFF]
# What may come out of a mutated file besides TfliteFormatError: the call's input checks (the mutated
# signature no longer matches the sample inputs: converter.input_check's classes, SignatureNotFoundError
# for a signature name that changed), TfliteFormatError when the interpreter itself refuses the model,
# and ModelRunError for its prepare/invoke failures. All of them are the project's own classes.
ALLOWED = {"InputTypeError", "InputValueError", "InputIndexError", "SignatureNotFoundError", "TfliteFormatError",
           "ModelRunError"}

_CHILD = r"""
import json, os, sys, numpy as np, torch, litert_torch
from tests.edge.test_tflite_fuzz import mutation
man = json.load(open(sys.argv[1]))
seeds = [(open(p, "rb").read(), [torch.from_numpy(np.load(a, allow_pickle=False)) for a in ins])
         for p, ins in man["seeds"]]
work = os.path.join(os.path.dirname(sys.argv[1]), f"child{os.getpid()}.tflite")
for k in range(int(sys.argv[2]), man["per_seed"] * len(seeds)):
    s, i = divmod(k, man["per_seed"])
    kind, data = mutation(seeds[s][0], s, i)
    with open(work, "wb") as f:
        f.write(data)
    print("BEGIN", k, flush=True)
    what = "load:"
    try:
        model = litert_torch.load(work)
        what = "call:"
        model(*seeds[s][1])
        what = "ran"
    except Exception as e:
        what += type(e).__name__
    print("END", k, what, kind, flush=True)
"""


class _Cnn(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3, padding=1)
        self.fc = nn.Linear(6, 4)

    def forward(self, x):
        y = torch.relu(self.conv(x)).mean((2, 3))
        return self.fc(y).softmax(-1)


class _Mlp(nn.Module):
    def __init__(self, d=16, hidden=32):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.a = nn.Linear(d, hidden)
        self.b = nn.Linear(hidden, d)

    def forward(self, x):
        h = self.b(nn.functional.gelu(self.a(self.norm(x))))
        return (x + h).reshape(x.shape[0], 4, -1).sum(-1)


_SEEDS: list = []


def _seeds():
    """(name, .tflite bytes, sample args) of the three seed models, converted once per process."""
    if not _SEEDS:
        torch.manual_seed(0)
        cnn, mlp, wide = _Cnn().eval(), _Mlp().eval(), _Mlp(64, 2048).eval()  # wide: 256 KiB of int8 weights
        x_img, x_vec, x_wide = torch.randn(1, 3, 8, 8), torch.randn(2, 16), torch.randn(2, 64)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _SEEDS.extend([
                ("cnn", litert_torch.convert(cnn, (x_img,)).tflite_model(), (x_img,)),
                ("mlp", litert_torch.convert(mlp, (x_vec,)).tflite_model(), (x_vec,)),
                ("wide_int8", litert_torch.convert(wide, (x_wide,), quant_config="dynamic_int8").tflite_model(),
                 (x_wide,)),
            ])
    return _SEEDS


class _Recorder(tflite_check._Checker):
    """The checker, noting where every offset, length, index and scalar field it reads lies."""

    def __init__(self, buf):
        super().__init__(buf)
        self.u32s, self.scalars, self.ints_at, self.tabvecs = [], [], [], []

    def _u32(self, p):
        self.u32s.append(p)
        return super()._u32(p)

    def scalar(self, t, slot, fmt, default=0):
        pos = self._field(t, slot, struct.calcsize(fmt))
        if pos:
            self.scalars.append((pos, fmt, t[4], slot))
        return super().scalar(t, slot, fmt, default)

    def ints(self, t, slot, fmt="i"):
        start, count = self.vector(t, slot, struct.calcsize(fmt))
        self.ints_at += [start + 4 * i for i in range(count)] if fmt == "i" else []
        return super().ints(t, slot, fmt)

    def tables(self, t, slot, what):
        start, count = self.vector(t, slot, 4)
        if count > 1:
            self.tabvecs.append((start, count))
        return super().tables(t, slot, what)


_RECORDS: dict = {}


def mutation(data: bytes, seed: int, i: int) -> tuple[str, bytes]:
    """Mutation ``i`` of seed model ``seed``: the same bytes in every process."""
    rec = _RECORDS.get(seed)
    if rec is None:
        rec = _RECORDS[seed] = _Recorder(memoryview(data))
        rec.model()
    return _mutate(data, rec, random.Random(f"{RNG_SEED}:{seed}:{i}"))


def _mutate(data: bytes, rec: _Recorder, rng: random.Random) -> tuple[str, bytes]:
    b = bytearray(data)
    kind = rng.choice(["bitflip", "truncate", "header", "offset", "index", "shape", "swap", "zero", "buffer_offset"])
    if kind == "bitflip":
        for _ in range(rng.randint(1, 4)):
            p = rng.randrange(len(b))
            b[p] ^= 1 << rng.randrange(8)
    elif kind == "truncate":
        b = b[: rng.randrange(len(b))]
    elif kind == "header":
        p = rng.choice([0, 4, rec.u32s[1] if len(rec.u32s) > 1 else 0])
        struct.pack_into("<I", b, p, rng.choice(SPECIAL + [len(b), len(b) - 4, rng.randrange(1 << 32)]))
    elif kind == "offset":  # a uoffset or vector length anywhere in the tree
        p = rng.choice(rec.u32s)
        struct.pack_into("<I", b, p, rng.choice(SPECIAL + [len(b), rng.randrange(len(b))]))
    elif kind == "index":  # tensor / opcode / buffer / subgraph indices: one past the end, negative, huge
        p = rng.choice(rec.ints_at or rec.u32s)
        struct.pack_into("<i", b, p, rng.choice([-2, -1, 1, 2**31 - 1, -2**31, rng.randrange(64)]))
    elif kind == "shape":
        pos, fmt, _, _ = rng.choice(rec.scalars)
        value = rng.choice([0, 1, 2, 255, -1, 2**31 - 1, 2**63 - 1, rng.randrange(1 << 16)])
        struct.pack_into(fmt, b, pos, _fit(value, fmt))
    elif kind == "swap" and rec.tabvecs:  # two entries of a vector of tables (tensors, operators ...)
        start, count = rng.choice(rec.tabvecs)
        i, j = rng.sample(range(count), 2)
        pi, pj = start + 4 * i, start + 4 * j
        ti, tj = pi + struct.unpack_from("<I", b, pi)[0], pj + struct.unpack_from("<I", b, pj)[0]
        struct.pack_into("<I", b, pi, (tj - pi) % (1 << 32))
        struct.pack_into("<I", b, pj, (ti - pj) % (1 << 32))
    elif kind == "buffer_offset":
        fields = [s for s in rec.scalars if s[2].startswith("buffer") and s[3] in (1, 2)] or rec.scalars
        pos, fmt, _, _ = rng.choice(fields)
        struct.pack_into(fmt, b, pos,
                         _fit(rng.choice([2, len(b), len(b) - 1, 2**62, 2**64 - 1, rng.randrange(len(b))]), fmt))
    else:
        kind, p, n = "zero", rng.randrange(len(b)), rng.randint(4, 64)
        b[p: p + n] = bytes(len(b[p: p + n]))
    return kind, bytes(b)


def _fit(value: int, fmt: str) -> int:
    bits = struct.calcsize(fmt) * 8
    if fmt[-1].isupper() or fmt[-1] == "?":
        return value % (1 << bits)
    value %= 1 << bits
    return value - (1 << bits) if value >= 1 << (bits - 1) else value


def _run_children(manifest: str, n: int, log: str) -> tuple[dict, dict, list, list]:
    """Outcome counts, mutation kinds; the mutations that hung and the ones whose child died by a signal."""
    counts, kinds, hangs, crashes = {}, {}, [], []
    start = 0
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    while start < n:
        with open(log, "a") as err:
            proc = subprocess.Popen([sys.executable, "-c", _CHILD, manifest, str(start)], stdout=subprocess.PIPE,
                                    stderr=err, text=True, cwd=repo)
        current, deadline = None, time.monotonic() + 180  # the imports first
        while True:
            ready, _, _ = select.select([proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
            line = proc.stdout.readline() if ready else None
            if line is None or not line:  # no progress in time (a hang), or the child ended
                if line is None:
                    proc.kill()
                rc = proc.wait()
                if current is None:  # not inside a mutation: a broken child, reported by the count check
                    return counts, kinds, hangs, crashes
                (hangs if line is None else crashes).append((current, rc))
                start = current + 1
                break
            word, k, *rest = line.split()
            if word == "BEGIN":
                current, deadline = int(k), time.monotonic() + HANG_S
            elif word == "END":
                counts[rest[0]] = counts.get(rest[0], 0) + 1
                kinds[rest[1]] = kinds.get(rest[1], 0) + 1
                current = None
        proc.stdout.close()
    return counts, kinds, hangs, crashes


@pytest.mark.subprocess
@pytest.mark.slow
def test_mutated_tflite_files_are_refused_or_run_never_crash_or_hang(tmp_path):
    t0 = time.monotonic()
    seeds, manifest = _seeds(), {"per_seed": N_PER_SEED, "seeds": []}
    for name, data, args in seeds:
        tflite_check.check_tflite(data, name)  # the unmutated models pass
        (tmp_path / f"{name}.tflite").write_bytes(data)
        ins = []
        for k, a in enumerate(args):
            np.save(tmp_path / f"{name}_in{k}.npy", a.numpy(), allow_pickle=False)
            ins.append(str(tmp_path / f"{name}_in{k}.npy"))
        manifest["seeds"].append((str(tmp_path / f"{name}.tflite"), ins))
    assert any(b.offset > 1 for b in _model_t(seeds[2][1]).buffers)  # the large-model form is covered
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    n = N_PER_SEED * len(seeds)
    log = str(tmp_path / "children.log")
    counts, kinds, hangs, crashes = _run_children(str(tmp_path / "manifest.json"), n, log)

    def saved(k):  # the failing file, kept for a look
        s, i = divmod(k, N_PER_SEED)
        kind, data = mutation(seeds[s][1], s, i)
        path = tmp_path / f"{seeds[s][0]}_{i}_{kind}.tflite"
        path.write_bytes(data)
        return str(path)

    refused = counts.get("load:TfliteFormatError", 0)
    errors = {k: v for k, v in counts.items() if k not in ("ran", "load:TfliteFormatError")}
    print(f"\ntflite fuzz: {n} mutated files ({kinds}), {len(hangs)} hangs, {len(crashes)} crashes, "
          f"{refused} refused as TfliteFormatError, {counts.get('ran', 0)} ran, other errors {errors}, "
          f"{time.monotonic() - t0:.1f} s")
    assert not hangs, [saved(k) for k, _ in hangs]
    assert not crashes, [(saved(k), rc) for k, rc in crashes]
    with open(log) as f:
        assert sum(counts.values()) == n, f.read()[-2000:]  # a child that broke outside a mutation
    odd = {k: v for k, v in errors.items() if k.startswith("load:") or k.split(":", 1)[1] not in ALLOWED}
    assert not odd, odd  # at load, only the format error; at the call, only documented classes
    assert refused > n // 2  # the check, not the interpreter, stops most of them


# ---------------------------------------------------------------------- one test per defect class
# Each file below passes through flatbuffers (the object API) unharmed, so only the check stops it.

def _edit(data: bytes, change) -> bytes:
    import flatbuffers
    from ai_edge_litert import schema_py_generated as s

    m = s.ModelT.InitFromPackedBuf(data, 0)
    change(m, s)
    b = flatbuffers.Builder(len(data) + 1024)
    b.Finish(m.Pack(b), file_identifier=b"TFL3")
    return bytes(b.Output())


def _op(m, s, name):
    code = getattr(s.BuiltinOperator, name)
    sg = m.subgraphs[0]
    return next(op for op in sg.operators
                if max(m.operatorCodes[op.opcodeIndex].builtinCode,
                       m.operatorCodes[op.opcodeIndex].deprecatedBuiltinCode) == code)


def _refused(tmp_path, data: bytes, match: str) -> str:
    path = tmp_path / "bad.tflite"
    path.write_bytes(data)
    try:
        litert_torch.load(path)
    except litert_torch.TfliteFormatError as e:
        msg = str(e)
        assert str(path) in msg and match in msg and "\n" not in msg and "Fix:" in msg, msg
        assert isinstance(e, ValueError)
        return msg
    raise AssertionError(f"accepted a file that should be refused ({match})")


def test_defect_classes_are_refused_with_one_line_naming_the_file(tmp_path):
    (_, cnn, _), (_, mlp, _), (_, q8, _) = _seeds()
    _refused(tmp_path, cnn[: len(cnn) // 2], "past the end")  # truncated
    _refused(tmp_path, cnn[:4] + b"XXXX" + cnn[8:], "file identifier")
    _refused(tmp_path, b"", "too short")

    def fc_weights_left_out(m, s):  # the interpreter dereferences the missing weights: a segfault
        op = _op(m, s, "FULLY_CONNECTED")
        op.inputs = [op.inputs[0], -1, *op.inputs[2:]]
    _refused(tmp_path, _edit(cnn, fc_weights_left_out), "no optional input there")

    def two_op_codes(m, s):  # the deprecated byte no longer repeats the code: it runs SPLIT's kernel
        m.operatorCodes[_op(m, s, "FULLY_CONNECTED").opcodeIndex].deprecatedBuiltinCode = s.BuiltinOperator.SPLIT
    _refused(tmp_path, _edit(cnn, two_op_codes), "in its deprecated field")

    def foreign_options(m, s):  # SPLIT with SubOptions reads a zero num_splits: a segfault
        op = _op(m, s, "SOFTMAX")
        op.builtinOptionsType, op.builtinOptions = s.BuiltinOptions.SubOptions, s.SubOptionsT()
    _refused(tmp_path, _edit(cnn, foreign_options), "another operator's options")

    def buffer_out_of_range(m, s):
        m.subgraphs[0].tensors[0].buffer = len(m.buffers) + 5
    _refused(tmp_path, _edit(cnn, buffer_out_of_range), "buffers")

    def constant_shape_lies(m, s):
        weight = m.subgraphs[0].tensors[_op(m, s, "FULLY_CONNECTED").inputs[1]]
        weight.shape = [int(weight.shape[0]) * 2, int(weight.shape[1])]
    _refused(tmp_path, _edit(cnn, constant_shape_lies), "bytes, not")

    def huge_activation(m, s):
        m.subgraphs[0].tensors[_op(m, s, "SOFTMAX").outputs[0]].shape = [2**31 - 1, 4]
    _refused(tmp_path, _edit(cnn, huge_activation), "elements")

    def signature_out_of_range(m, s):
        m.signatureDefs[0].outputs[0].tensorIndex = 10_000
    _refused(tmp_path, _edit(mlp, signature_out_of_range), "points at tensor 10000")

    def metadata_not_json(m, s):  # our structure metadata (pytree specs) is data: corrupt JSON is a corrupt file
        md = next(x for x in m.metadata if x.name == b"tpu_export.structure")
        m.buffers[md.buffer].data = np.frombuffer(b"{not json", dtype=np.uint8)
    _refused(tmp_path, _edit(mlp, metadata_not_json), "metadata")

    # the large-model form (ai-edge-quantizer's output): weights after the flatbuffer
    with_offsets = [i for i, b in enumerate(_model_t(q8).buffers) if b.offset > 1]
    assert with_offsets
    pos = _Recorder(memoryview(q8))
    pos.model()
    offset_field = next(p for p, fmt, what, slot in pos.scalars if what == f"buffer {with_offsets[0]}" and slot == 1)
    bad = bytearray(q8)
    struct.pack_into("<Q", bad, offset_field, len(q8) - 2)
    _refused(tmp_path, bytes(bad), "past the end")


def _model_t(data):
    from ai_edge_litert import schema_py_generated as s

    return s.ModelT.InitFromPackedBuf(data, 0)


def test_sound_models_pass_and_a_100mb_model_checks_in_milliseconds(tmp_path):
    torch.manual_seed(0)
    big = nn.Sequential(nn.Linear(5000, 5000), nn.ReLU()).eval()  # 100 MB of float32 weights
    x = torch.randn(1, 5000)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        data = litert_torch.convert(big, (x,)).tflite_model()
    assert len(data) > 100e6
    best = min(_timed(tflite_check.check_tflite, data) for _ in range(3))
    assert best < 0.1, f"{best * 1e3:.1f} ms: the check must read offsets, never weight bytes"
    path = tmp_path / "big.tflite"
    path.write_bytes(data)
    with torch.no_grad():
        want = big(x)
    torch.testing.assert_close(litert_torch.load(path)(x), want, rtol=1e-4, atol=1e-4)


def _timed(fn, *args) -> float:
    t = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t


def test_inspect_refuses_a_corrupt_tflite_in_one_line(tmp_path):
    from tpu_export.targets.describe import describe

    good = tmp_path / "m.tflite"
    litert_torch.convert(_Cnn().eval(), (torch.randn(1, 3, 8, 8),)).export(good)
    assert "LiteRT flatbuffer" in describe(str(good))
    bad = tmp_path / "bad.tflite"
    bad.write_bytes(good.read_bytes()[:200])
    with pytest.raises(litert_torch.TfliteFormatError, match="bad.tflite"):
        describe(str(bad))


def test_a_fifo_or_device_is_refused_without_waiting(tmp_path):
    from tpu_export.targets.describe import describe

    fifo = tmp_path / "m.tflite"
    os.mkfifo(fifo)
    t0 = time.monotonic()
    for fn in (litert_torch.load, describe):
        with pytest.raises(litert_torch.TfliteFormatError, match="not a regular file"):
            fn(str(fifo))
    with pytest.raises(litert_torch.TfliteFormatError, match="not a regular file"):
        litert_torch.load("/dev/zero")
    assert time.monotonic() - t0 < 5
