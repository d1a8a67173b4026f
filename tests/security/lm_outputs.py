"""Test-only: what `tpu-export convert-lm` writes for the tiny Llama of tests.llm_models (android: model.tflite +
model.litertlm; cpu-xla: the TPU artifact that PJRT CPU runs), built once per test process and copied per test
where a test edits it; and edits of a bundle's bytes at its header's own offsets."""

from __future__ import annotations

import pathlib
import shutil
import struct

__all__ = ["PROMPT", "converted", "copy_target", "rebuilt_bundle", "section", "set_section_range"]

PROMPT = "the cache holds keys"  # 4 tokens of the test tokenizer
_BUILT: dict = {}


def converted(tmp_path_factory) -> pathlib.Path:
    """The convert-lm output folder (android/ and cpu-xla/; prefill 8, cache 64), built on first use."""
    if "out" not in _BUILT:
        from tests.llm_models import save_model_dir
        from tpu_export.targets.lm import convert_lm

        root = tmp_path_factory.mktemp("security_lm")
        d = save_model_dir("llama", root / "llama")
        out = root / "out"
        convert_lm(d, ["android", "cpu-xla"], out, prefill_lengths=(8,), cache_len=64)
        _BUILT["out"], _BUILT["model_dir"] = out, d
    return _BUILT["out"]


def model_dir(tmp_path_factory) -> pathlib.Path:
    converted(tmp_path_factory)
    return _BUILT["model_dir"]


def copy_target(tmp_path_factory, target: str, dest: pathlib.Path) -> pathlib.Path:
    """A private copy of one target folder, to edit."""
    return pathlib.Path(shutil.copytree(converted(tmp_path_factory) / target, dest))


def section(data: bytes, kind: str) -> tuple[int, int, int]:
    """(index, begin, end) of the first section of ``kind`` in a sound bundle's bytes."""
    import tempfile

    from tpu_export.edge.litertlm_check import check_litertlm

    with tempfile.NamedTemporaryFile(suffix=".litertlm") as f:
        f.write(data)
        f.flush()
        secs = check_litertlm(f.name)["sections"]
    i = next(k for k, s in enumerate(secs) if s["type"] == kind)
    return i, secs[i]["begin"], secs[i]["end"]


def set_section_range(data: bytes, index: int, begin: int | None = None, end: int | None = None) -> bytes:
    """The bundle with section ``index``'s begin / end offsets (uint64 fields of its SectionObject) rewritten."""
    from tests.edge.test_litertlm_fuzz import _Recorder
    from tpu_export.edge import litertlm_check

    (hend,) = struct.unpack_from("<Q", data, 24)
    rec = _Recorder(memoryview(data[32:hend]))
    litertlm_check._Bundle("bundle", memoryview(data))._header(rec)
    fields = {slot: 32 + pos for pos, fmt, what, slot in rec.scalars if what == f"section {index}" and fmt == "<Q"}
    b = bytearray(data)
    for slot, value in ((1, begin), (2, end)):
        if value is not None:
            struct.pack_into("<Q", b, fields[slot], value)
    return bytes(b)


def rebuilt_bundle(src: pathlib.Path, dest: pathlib.Path, change_llm) -> pathlib.Path:
    """``src``'s bundle built again by litert-lm-builder itself (not our checked writer) with its LlmMetadata
    changed by ``change_llm(msg)``: a bundle our writer would refuse, as a stranger could ship it. The tokenizer
    is the tokenizer.json beside ``src``."""
    from litert_lm_builder import litertlm_builder as lb
    from litert_lm_builder.runtime.proto import llm_metadata_pb2

    from tpu_export.edge.litertlm import read_litertlm

    secs = {s["type"]: s for s in read_litertlm(src)["sections"]}
    data = src.read_bytes()
    llm = llm_metadata_pb2.LlmMetadata()
    llm.ParseFromString(data[secs["LlmMetadataProto"]["begin"]:secs["LlmMetadataProto"]["end"]])
    change_llm(llm)
    parts = dest.parent / (dest.name + ".parts")
    parts.mkdir()
    blobs = {"l.pb": llm.SerializeToString()}
    for name, kind in (("e.pb", "ExecutorMetadataProto"), ("m.tflite", "TFLiteModel")):
        blobs[name] = data[secs[kind]["begin"]:secs[kind]["end"]]
    for name, blob in blobs.items():
        (parts / name).write_bytes(blob)
    b = lb.LitertLmFileBuilder()
    b.add_llm_metadata(str(parts / "l.pb"))
    b.add_executor_metadata(str(parts / "e.pb"))
    b.add_hf_tokenizer(str(src.parent / "tokenizer.json"))
    b.add_tflite_model(str(parts / "m.tflite"), lb.TfLiteModelType.PREFILL_DECODE)
    with open(dest, "wb") as f:
        b.build(f)
    shutil.rmtree(parts)
    return dest
