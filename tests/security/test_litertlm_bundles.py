"""Hostile .litertlm bundles: each is refused before the LiteRT-LM engine sees it, by `tpu-export inspect`,
`tpu-export generate` and the Python loaders alike, in one line naming the file and the section; nothing is
written; a FIFO never blocks. Where the engine dies on bytes the check passes, `generate --isolate` says so in
one line and the caller lives on (the signal here is a real SIGSEGV delivered to the real engine's process)."""

from __future__ import annotations

import os
import random
import re
import signal
import struct
import subprocess
import sys
import time
import zlib

import pytest

pytest.importorskip("litert_lm")
pytest.importorskip("litert_lm_builder")

from tests.security.lm_outputs import PROMPT, converted, section, set_section_range  # noqa: E402
from tpu_export.cli import main  # noqa: E402
from tpu_export.edge.litertlm import read_litertlm  # noqa: E402
from tpu_export.edge.litertlm_check import BundleFormatError, check_litertlm  # noqa: E402
from tpu_export.generators import EngineGenerator, GeneratorError, load_generator  # noqa: E402


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> bytes:
    with open(converted(tmp_path_factory) / "android" / "model.litertlm", "rb") as f:
        return f.read()


def _refused_everywhere(tmp_path, capsys, data: bytes, match: str) -> str:
    """The bundle is refused by the checker, inspect, generate and load_generator with the same one line."""
    path = tmp_path / "bad.litertlm"
    path.write_bytes(data)
    before = sorted(os.listdir(tmp_path))
    with pytest.raises(BundleFormatError) as e:
        check_litertlm(path)
    msg = str(e.value)
    assert msg.startswith(f"{path}: ") and match in msg and "\n" not in msg and "Fix:" in msg, msg
    for argv in (["inspect", str(path)], ["generate", str(path), "--prompt", PROMPT, "--max-new-tokens", "2"]):
        assert main(argv) == 1
        cap = capsys.readouterr()
        assert cap.err.strip() == f"tpu-export: error: {msg}" and cap.out == "", (argv, cap)
    for load in (load_generator, EngineGenerator, read_litertlm):
        with pytest.raises(BundleFormatError, match="^" + __import__("re").escape(msg) + "$"):
            load(str(path))
    assert sorted(os.listdir(tmp_path)) == before  # nothing written beside it
    return msg


def test_a_bundle_truncated_to_1_kib_is_refused_naming_the_section(bundle, tmp_path, capsys):
    msg = _refused_everywhere(tmp_path, capsys, bundle[:1024], "section 0 (LlmMetadataProto): bytes [")
    assert "the file is 1024 bytes" in msg


@pytest.mark.parametrize("cut", ["preamble", "header", "section_start", "in_tokenizer", "in_model", "last_byte"])
def test_truncations_at_every_boundary_are_refused(bundle, tmp_path, capsys, cut):
    (hend,) = struct.unpack_from("<Q", bundle, 24)
    _, tb, te = section(bundle, "HF_Tokenizer_Zlib")
    _, mb, me = section(bundle, "TFLiteModel")
    n = {"preamble": 20, "header": hend - 1, "section_start": 16384, "in_tokenizer": (tb + te) // 2,
         "in_model": (mb + me) // 2, "last_byte": len(bundle) - 1}[cut]
    _refused_everywhere(tmp_path, capsys, bundle[:n], "")


def test_metadata_ending_a_tebibyte_past_eof_is_refused_and_inspect_lists_nothing(bundle, tmp_path, capsys):
    i, begin, _ = section(bundle, "LlmMetadataProto")
    bad = set_section_range(bundle, i, end=len(bundle) + (1 << 40))
    msg = _refused_everywhere(tmp_path, capsys, bad, f"section {i} (LlmMetadataProto): bytes [{begin}, ")
    assert f"the file is {len(bundle)} bytes" in msg


def test_overlapping_sections_and_a_header_end_past_eof_are_refused(bundle, tmp_path, capsys):
    i, _, _ = section(bundle, "ExecutorMetadataProto")
    _, tb, _ = section(bundle, "HF_Tokenizer_Zlib")
    _refused_everywhere(tmp_path, capsys, set_section_range(bundle, i, end=tb + 8), "overlap")
    bad = bytearray(bundle)
    struct.pack_into("<Q", bad, 24, len(bundle) + 1)
    _refused_everywhere(tmp_path, capsys, bytes(bad), "header: it ends at byte")


def test_garbage_metadata_and_a_corrupt_model_section_are_refused(bundle, tmp_path, capsys):
    i, begin, end = section(bundle, "LlmMetadataProto")
    bad = bytearray(bundle)
    bad[begin:end] = b"\xff" * (end - begin)
    _refused_everywhere(tmp_path, capsys, bytes(bad), f"section {i} (LlmMetadataProto): not a LlmMetadata proto")
    i, begin, _ = section(bundle, "TFLiteModel")
    bad = bytearray(bundle)
    struct.pack_into("<I", bad, begin, len(bundle))  # the .tflite's root offset, past its end
    _refused_everywhere(tmp_path, capsys, bytes(bad), f"section {i} (TFLiteModel): not a valid .tflite")


@pytest.mark.slow
def test_the_tokenizer_sections_declared_size_is_capped_before_decompressing(bundle, tmp_path, capsys):
    """A declared 1 TiB is refused without allocating; a zlib bomb (1 GiB of zeros declared as 11 KB) stops at the
    declared size: memory stays bounded either way."""
    import resource

    i, begin, end = section(bundle, "HF_Tokenizer_Zlib")
    bad = bytearray(bundle)
    struct.pack_into("<Q", bad, begin, 1 << 40)
    _refused_everywhere(tmp_path, capsys, bytes(bad), f"section {i} (HF_Tokenizer_Zlib): declares 1099511627776")
    bomb = zlib.compressobj(9)
    blob = b"".join(bomb.compress(bytes(1 << 24)) for _ in range(64)) + bomb.flush()  # 1 GiB of zeros, ~1 MB
    declared = struct.unpack_from("<Q", bundle, begin)[0]  # the real tokenizer.json's size, ~11 KB
    data = set_section_range(bundle + struct.pack("<Q", declared) + blob, i, begin=len(bundle),
                             end=len(bundle) + 8 + len(blob))  # the section moved to the end, over the bomb
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    _refused_everywhere(tmp_path, capsys, data, f"section {i} (HF_Tokenizer_Zlib): declares {declared} bytes of "
                                                "tokenizer.json, the compressed data holds more")
    assert (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak) * 1024 < 200 << 20


def test_bit_flips_in_the_header_are_refused_or_harmless(bundle, tmp_path):
    """Seeded flips in the preamble and header flatbuffer: each is refused in one line, or passes with a header
    that still describes the same sections inside the file (a flip in padding or in a metadata string)."""
    (hend,) = struct.unpack_from("<Q", bundle, 24)
    sound = [(s["type"], s["begin"], s["end"]) for s in check_litertlm_bytes(tmp_path, bundle)["sections"]]
    rng = random.Random("header-flips")
    refused = 0
    for _ in range(200):
        bad = bytearray(bundle)
        for _ in range(rng.randint(1, 3)):
            bad[rng.randrange(hend)] ^= 1 << rng.randrange(8)
        try:
            info = check_litertlm_bytes(tmp_path, bytes(bad))
        except BundleFormatError as e:
            assert "\n" not in str(e)
            refused += 1
            continue
        for s in info["sections"]:
            assert s["end"] <= len(bundle)
        assert len(info["sections"]) == len(sound)
    assert refused > 100


def check_litertlm_bytes(tmp_path, data: bytes) -> dict:
    path = tmp_path / "flip.litertlm"
    path.write_bytes(data)
    return check_litertlm(path)


@pytest.mark.subprocess
@pytest.mark.parametrize("command", ["inspect", "generate"])
def test_a_fifo_as_the_bundle_is_refused_without_waiting(tmp_path, command):
    fifo = tmp_path / "model.litertlm"
    os.mkfifo(fifo)
    argv = [sys.executable, "-m", "tpu_export.cli", command, str(fifo)]
    argv += ["--prompt", PROMPT] if command == "generate" else []
    t0 = time.monotonic()
    r = subprocess.run(argv, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert r.returncode == 1 and r.stderr.strip() == f"tpu-export: error: {fifo}: the bundle is a FIFO, not a " \
        "regular file. Fix: put the real file there (a FIFO or device never ends or never answers; it is never read)", \
        r.stderr
    assert time.monotonic() - t0 < 60 and os.listdir(tmp_path) == ["model.litertlm"]


# ---------------------------------------------------------------------- --isolate

def _children() -> list[int]:
    """This process's isolated-engine children (from /proc): only those, since a test worker can hold other
    children of earlier tests, which must never be signalled here."""
    from tpu_export.generators import _CHILD

    me, out = os.getpid(), []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                if int(f.read().rsplit(")", 1)[1].split()[1]) != me:
                    continue
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if _CHILD.encode() in f.read():
                    out.append(int(pid))
        except (OSError, IndexError, ValueError):
            pass
    return out


def _hit_engine_child(gen, sig):
    """Generate with ``gen`` and, at the first text, send ``sig`` to the isolated engine's process (stopped first,
    so that it cannot go on writing before the signal lands); (pids signalled, the GeneratorError raised). The tiny
    model can write all of its reply and end before the caller reads its first text: such a run, which the signal
    did not reach, is retried (5 runs at most)."""
    for _ in range(5):
        sent = []

        def on_text(_, sent=sent):
            if not sent:
                for pid in _children():
                    os.kill(pid, signal.SIGSTOP)
                    if sig != signal.SIGSTOP:
                        os.kill(pid, sig)
                        os.kill(pid, signal.SIGCONT)
                    sent.append(pid)

        try:
            gen.generate(PROMPT, 60, on_text=on_text)
        except GeneratorError as e:
            return sent, e
    pytest.fail(f"the isolated engine finished its reply before {sig.name} reached it, 5 times")


@pytest.mark.engine
@pytest.mark.subprocess
def test_isolate_runs_the_engine_in_a_child_with_the_same_reply(tmp_path_factory):
    path = converted(tmp_path_factory) / "android" / "model.litertlm"
    pids_before = set(_children())
    inproc = EngineGenerator(str(path)).generate(PROMPT, 16)
    isolated = EngineGenerator(str(path), isolate=True).generate(PROMPT, 16)
    assert isolated.text == inproc.text and isolated.new_tokens == inproc.new_tokens == 16
    assert set(_children()) == pids_before  # the child is reaped


@pytest.mark.engine
@pytest.mark.subprocess
def test_a_signal_in_the_isolated_engine_is_one_line_and_the_caller_lives(tmp_path_factory, capsys):
    path = str(converted(tmp_path_factory) / "android" / "model.litertlm")
    gen = load_generator(path, isolate=True)
    sent, e = _hit_engine_child(gen, signal.SIGSEGV)
    assert sent, f"the engine failed before its first text: {e}"
    msg = str(e)
    assert msg.startswith(f"generate: the LiteRT-LM engine died with SIGSEGV on {path}; ") and "\n" not in msg, msg
    assert "--isolate" in msg
    # the same process generates again, and the CLI says the same in one line
    assert gen.generate(PROMPT, 4).new_tokens == 4
    assert main(["generate", path, "--prompt", PROMPT, "--isolate", "--max-new-tokens", "3"]) == 0


@pytest.mark.engine
@pytest.mark.subprocess
def test_an_isolated_engine_that_stops_answering_is_killed_after_the_timeout(tmp_path_factory):
    path = str(converted(tmp_path_factory) / "android" / "model.litertlm")
    # 10 s between answers: a loaded CI machine (tests in parallel) takes seconds to a first token of the prefill
    gen = load_generator(path, isolate=True, isolate_timeout=10.0)
    t0 = time.monotonic()
    sent, e = _hit_engine_child(gen, signal.SIGSTOP)
    assert sent, f"the engine did not answer with its first text within the timeout: {e}"
    assert re.match(r"^generate: the LiteRT-LM engine did not answer within 10 s on .*\(killed\)", str(e)), str(e)
    assert time.monotonic() - t0 < 120
    time.sleep(0.2)
    assert not set(sent) & set(_children())  # killed and reaped
