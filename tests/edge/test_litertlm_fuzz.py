"""Corrupt .litertlm bundles never crash or hang the checker: they are refused (BundleFormatError) or pass, and
the ones that pass are run by the real LiteRT-LM engine, where a death by a signal is counted and reported
(what ``generate --isolate`` is for).

Seeded and bounded: mutations of a tiny Llama bundle (truncations at many lengths, 1 KiB among them, bit flips
anywhere and in the header, section offsets and sizes pointing past the end or over each other, the header's
end, garbage in the metadata protos, the tokenizer's declared size). A child process regenerates mutation i
from the seed (many per child), checks it with edge.litertlm_check and, when it passes, generates 4 tokens
with tpu_export.generators.EngineGenerator; a watchdog per mutation catches a hang, and a signal death before
the check's verdict is a checker crash, after it an engine crash. Either restarts the child after it.
"""

from __future__ import annotations

import os
import random
import select
import struct
import subprocess
import sys
import time

import pytest

pytest.importorskip("litert_lm")
pytest.importorskip("litert_lm_builder")

from tpu_export.edge import litertlm_check, tflite_check  # noqa: E402

N = int(os.environ.get("LITERTLM_FUZZ_N", 1500))
HANG_S = 20.0  # per mutation, after the child's imports; a check takes ~10 ms, the engine's 4 tokens ~20 ms
RNG_SEED = "litertlm-fuzz-1"
SPECIAL = [0, 1, 31, 32, 1 << 31, (1 << 32) - 1, 1 << 40, (1 << 63) - 1, (1 << 64) - 1]
PROTOS = ("LlmMetadataProto", "ExecutorMetadataProto")

_CHILD = r"""
import sys
from tests.edge.test_litertlm_fuzz import mutation
from tpu_export.edge.litertlm_check import BundleFormatError, check_litertlm
from tpu_export.generators import EngineGenerator
seed = open(sys.argv[1], "rb").read()
work = sys.argv[1] + f".child{__import__('os').getpid()}.litertlm"
for k in range(int(sys.argv[2]), int(sys.argv[3])):
    kind, data = mutation(seed, k)
    with open(work, "wb") as f:
        f.write(data)
    print("BEGIN", k, kind, flush=True)
    try:
        check_litertlm(work)
    except BundleFormatError:
        print("END", k, "refused", flush=True)
        continue
    except Exception as e:
        print("END", k, "check:" + type(e).__name__, flush=True)
        continue
    print("CHECKED", k, flush=True)
    try:
        EngineGenerator(work).generate("hello world", 4)
        what = "ran"
    except Exception as e:
        what = "engine:" + type(e).__name__
    print("END", k, what, flush=True)
"""


class _Recorder(tflite_check._Checker):
    """The header checker, noting where every scalar field it reads lies (the section offsets among them)."""

    def __init__(self, buf):
        super().__init__(buf)
        self.scalars = []

    def scalar(self, t, slot, fmt, default=0):
        pos = self._field(t, slot, struct.calcsize(fmt))
        if pos:
            self.scalars.append((pos, fmt, t[4], slot))
        return super().scalar(t, slot, fmt, default)


_LAYOUT: dict = {}


def _layout(seed: bytes) -> dict:
    """Where the header ends, the sections lie and their begin/end fields are (file offsets), for ``seed``."""
    if _LAYOUT.get("seed") != seed:
        _LAYOUT.clear()
        (end,) = struct.unpack_from("<Q", seed, 24)
        rec = _Recorder(memoryview(seed[32:end]))
        b = litertlm_check._Bundle("seed", memoryview(seed))
        b._header(rec)
        fields = [(32 + pos, fmt) for pos, fmt, what, slot in rec.scalars
                  if what.startswith("section") and fmt == "<Q" and slot in (1, 2)]
        info = _sections(seed)
        _LAYOUT.update(seed=seed, end=end, fields=fields, sections=info)
    return _LAYOUT


def _sections(seed: bytes) -> list:
    import tempfile

    with tempfile.NamedTemporaryFile(suffix=".litertlm") as f:
        f.write(seed)
        f.flush()
        return [(s["type"], s["begin"], s["end"]) for s in litertlm_check.check_litertlm(f.name)["sections"]]


def mutation(seed: bytes, i: int) -> tuple[str, bytes]:
    """Mutation ``i`` of the seed bundle: the same bytes in every process."""
    lay = _layout(seed)
    rng = random.Random(f"{RNG_SEED}:{i}")
    b = bytearray(seed)
    kind = rng.choice(["truncate", "bitflip", "bitflip_header", "section_range", "header_end", "proto_garbage",
                       "tokenizer_size", "zero"])
    if kind == "truncate":
        marks = [1024, 32, 31, 8, lay["end"], lay["end"] - 1] + [x for _, s, e in lay["sections"] for x in
                                                                  (s, s + 1, e - 1)]
        b = b[: rng.choice(marks) if rng.random() < 0.4 else rng.randrange(len(b))]
    elif kind == "bitflip":
        for _ in range(rng.randint(1, 4)):
            p = rng.randrange(len(b))
            b[p] ^= 1 << rng.randrange(8)
    elif kind == "bitflip_header":
        for _ in range(rng.randint(1, 3)):
            p = rng.randrange(lay["end"])
            b[p] ^= 1 << rng.randrange(8)
    elif kind == "section_range":  # a begin or end offset: past EOF, huge, inside another section, swapped
        pos, fmt = rng.choice(lay["fields"])
        other = rng.choice(lay["sections"])
        value = rng.choice(SPECIAL + [len(b), len(b) + 1, len(b) + (1 << 40), other[1], other[2] - 1,
                                      rng.randrange(len(b))])
        struct.pack_into(fmt, b, pos, value % (1 << 64))
    elif kind == "header_end":
        struct.pack_into("<Q", b, 24, rng.choice(SPECIAL + [len(b), lay["end"] - 8, lay["end"] + 8,
                                                            rng.randrange(len(b))]))
    elif kind == "proto_garbage":
        _, s, e = rng.choice([x for x in lay["sections"] if x[0] in PROTOS])
        n = rng.randint(1, e - s)
        p = rng.randrange(s, e - n + 1)
        b[p:p + n] = bytes(rng.randrange(256) for _ in range(n))
    elif kind == "tokenizer_size":
        _, s, _ = next(x for x in lay["sections"] if x[0] == "HF_Tokenizer_Zlib")
        struct.pack_into("<Q", b, s, rng.choice(SPECIAL + [rng.randrange(1 << 20)]))
    else:
        p, n = rng.randrange(len(b)), rng.randint(4, 256)
        b[p:p + n] = bytes(len(b[p:p + n]))
    return kind, bytes(b)


def _run_children(seed_path: str, n: int, log: str):
    """{outcome: count}, {kind: count}, checker hangs/crashes and engine hangs/crashes as (mutation, kind, rc)."""
    counts, kinds = {}, {}
    bad = {"check_hang": [], "check_crash": [], "engine_hang": [], "engine_crash": []}
    start = 0
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    while start < n:
        with open(log, "a") as err:
            proc = subprocess.Popen([sys.executable, "-c", _CHILD, seed_path, str(start), str(n)],
                                    stdout=subprocess.PIPE, stderr=err, text=True, cwd=repo)
        current, checked, deadline = None, False, time.monotonic() + 300  # the imports first
        while True:
            ready, _, _ = select.select([proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
            line = proc.stdout.readline() if ready else None
            if not line:  # no progress in time (a hang), or the child ended
                if line is None:
                    proc.kill()
                rc = proc.wait()
                if current is None:  # done, or a child broken outside a mutation (the count check says so)
                    proc.stdout.close()
                    return counts, kinds, bad
                where = "engine" if checked else "check"
                bad[f"{where}_{'hang' if line is None else 'crash'}"].append((current[0], current[1], rc))
                start = current[0] + 1
                break
            word, k, *rest = line.split()
            if word == "BEGIN":
                current, checked, deadline = (int(k), rest[0]), False, time.monotonic() + HANG_S
                kinds[rest[0]] = kinds.get(rest[0], 0) + 1
            elif word == "CHECKED":
                checked = True
            elif word == "END":
                counts[rest[0]] = counts.get(rest[0], 0) + 1
                current = None
        proc.stdout.close()
    return counts, kinds, bad


@pytest.mark.slow
@pytest.mark.engine
@pytest.mark.subprocess
def test_mutated_bundles_are_refused_or_run_never_crash_or_hang_the_checker(litertlm_seed, tmp_path):
    t0 = time.monotonic()
    seed_path = tmp_path / "seed.litertlm"
    seed_path.write_bytes(litertlm_seed)
    log = str(tmp_path / "children.log")
    counts, kinds, bad = _run_children(str(seed_path), N, log)
    signals = sorted({rc for *_, rc in bad["engine_crash"]})
    print(f"\nlitertlm fuzz: {N} mutated bundles ({kinds}); refused {counts.get('refused', 0)}, ran "
          f"{counts.get('ran', 0)}, engine errors {sum(v for k, v in counts.items() if k.startswith('engine:'))}, "
          f"engine crashes {len(bad['engine_crash'])} (signals {signals}), engine hangs {len(bad['engine_hang'])}, "
          f"checker crashes {len(bad['check_crash'])}, checker hangs {len(bad['check_hang'])}, "
          f"{time.monotonic() - t0:.1f} s")

    def saved(k):
        kind, data = mutation(litertlm_seed, k)
        path = tmp_path / f"mutant_{k}_{kind}.litertlm"
        path.write_bytes(data)
        return str(path)

    assert not bad["check_crash"] and not bad["check_hang"], [saved(k) for k, *_ in bad["check_crash"] +
                                                              bad["check_hang"]]
    odd = {k: v for k, v in counts.items() if k.startswith("check:")}
    assert not odd, odd  # the checker raises its one error class, nothing else
    with open(log) as f:
        total = sum(counts.values()) + len(bad["engine_crash"]) + len(bad["engine_hang"])
        assert total == N, f.read()[-2000:]  # a child that broke outside a mutation
    assert counts.get("refused", 0) > N // 2 and counts.get("ran", 0) > 0
    assert all(k in kinds for k in ("truncate", "section_range", "proto_garbage"))


@pytest.fixture(scope="module")
def litertlm_seed(tmp_path_factory) -> bytes:
    """A tiny Llama bundle (prefill 8, cache 64, the test chat template)."""
    transformers = pytest.importorskip("transformers")
    from tests.llm_models import CHAT_TEMPLATE, SPECIAL, save_model_dir
    from tpu_export.converter.llm import prepare_lm
    from tpu_export.edge import convert_program
    from tpu_export.edge.litertlm import write_litertlm

    root = tmp_path_factory.mktemp("fuzz_seed")
    d = save_model_dir("llama", root / "llama")
    model = transformers.AutoModelForCausalLM.from_pretrained(d).eval()
    prog, spec = prepare_lm(model, prefill_lengths=(8,), cache_len=64)
    path = write_litertlm(root / "m.litertlm", convert_program(prog), tokenizer_json=d / "tokenizer.json",
                          stop_token_ids=[SPECIAL["eos"][1]], max_num_tokens=64, cache_spec=spec,
                          prompt_template=CHAT_TEMPLATE)
    with open(path, "rb") as f:
        return f.read()
