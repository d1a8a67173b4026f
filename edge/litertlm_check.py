"""Structural check of a ``.litertlm`` bundle before the LiteRT-LM engine sees it.

The engine trusts the bundle: a section whose byte range runs past the end of the file, a corrupt header
flatbuffer or a damaged model section aborts or crashes the process instead of raising. ``check_litertlm``
reads the file the way the engine will, with explicit bounds, and returns what ``tpu-export inspect`` shows:

- the 32-byte preamble (``LITERTLM``, version 1.x, the header's end) and the header flatbuffer (system
  metadata, one SectionObject per section), every table, vector and string walked with bounds
  (edge.tflite_check's flatbuffer reader);
- every section's byte range: after the header, inside the file, none overlapping;
- LlmMetadata / ExecutorMetadata / EmbeddingMetadata protos parsed from at most 16 MiB each; their token ids
  inside the model's vocabulary, the chat template rendering a user turn within edge.chat_template's limits,
  each cache buffer an input and output of every prefill and decode signature, its sequence axis and length
  inside that tensor;
- the HF_Tokenizer_Zlib section decompressed up to its declared size (at most converter.untrusted's
  ``tokenizer`` limit, the cap on a tokenizer.json file), JSON
  with a ``model`` entry, no token id past the model's vocabulary;
- each TFLiteModel section through edge.tflite_check (the large-model form's offsets count from the section's
  start); the prefill/decode model's signatures as the engine calls them.

Sections of other kinds (SentencePiece, TFLiteWeights, binary data) are range-checked only. Anything wrong is
a ``BundleFormatError``: one line, the file, the section, what is wrong and the fix. The file is mapped, never
read whole; a FIFO or device is refused without waiting for a writer.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
import zlib

from .litertlm import LitertLmError

__all__ = ["BundleFormatError", "check_litertlm", "max_token_id"]


class BundleFormatError(LitertLmError):
    """The file is not a well-formed ``.litertlm`` bundle (truncated, corrupt, or not one)."""


MAGIC = b"LITERTLM"
_HEADER_BEGIN = 32  # litert_lm_builder.litertlm_core: the flatbuffer starts here ...
_HEADER_END_AT = 24  # ... and ends at the uint64 stored here
_MAJOR_VERSIONS = (1,)  # the engine reads format 1.x
_MAX_HEADER = 16 << 20  # a header lists a few sections: kilobytes
_MAX_SECTIONS = 256
_MAX_PROTO = 16 << 20
_MAX_FILE = 1 << 40
_FIX = "Fix: write the bundle again (tpu-export convert-lm, or edge.litertlm.write_litertlm); this file is " \
       "truncated or corrupt"
# the VData union's member tables: field 0 is the value
_VALUE_FMT = {1: "<B", 2: "<b", 3: "<H", 4: "<h", 5: "<I", 6: "<i", 7: "<f", 8: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING_VALUE = 9


def _one_line(text) -> str:
    return " ".join(str(text).split())[:300]


def _open_bundle(path: str):
    """(file, size) of a regular file opened without waiting for a writer (converter.untrusted's rule)."""
    from tpu_export.converter.untrusted import UntrustedFileError, open_regular

    try:
        fd, size = open_regular(path, what="the bundle", max_bytes=_MAX_FILE)
    except UntrustedFileError as e:
        raise BundleFormatError(str(e)) from None
    return os.fdopen(fd, "rb"), size


def check_litertlm(path) -> dict:
    """Raise BundleFormatError unless the bundle at ``path`` is sound; else its version, system metadata and
    sections ({type, begin, end, items[, metadata]}: the metadata protos as dicts), and ``vocab`` (the
    prefill/decode model's logits width, None without one)."""
    path = os.fspath(path)
    f, size = _open_bundle(path)
    with f:
        if size < _HEADER_BEGIN:
            raise BundleFormatError(f"{path}: header: the file is {size} bytes, shorter than the {_HEADER_BEGIN}-byte "
                                    f"preamble. {_FIX}")
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    failure = None
    try:
        return _Bundle(path, memoryview(mm)).check()
    except BundleFormatError as e:
        failure = str(e)  # raised afresh below: this one's traceback holds views of the map
    finally:
        try:
            mm.close()
        except BufferError:  # views held by a traceback: the map closes with the last of them
            pass
    raise BundleFormatError(failure)


class _Bundle:
    def __init__(self, path: str, buf: memoryview):
        self.path, self.b, self.n = path, buf, len(buf)

    def fail(self, where: str, what: str):
        raise BundleFormatError(f"{self.path}: {where}: {_one_line(what)}. {_FIX}")

    def check(self) -> dict:
        if bytes(self.b[:8]) != MAGIC:
            self.fail("header", f"starts with {bytes(self.b[:8])!r}, not {MAGIC!r}: not a .litertlm")
        major, minor, patch = struct.unpack_from("<III", self.b, 8)
        if major not in _MAJOR_VERSIONS:
            self.fail("header", f"format version {major}.{minor}.{patch}; this tool and the engine read 1.x")
        (end,) = struct.unpack_from("<Q", self.b, _HEADER_END_AT)
        if not _HEADER_BEGIN + 8 <= end <= self.n or end - _HEADER_BEGIN > _MAX_HEADER:
            self.fail("header", f"it ends at byte {end}, outside [{_HEADER_BEGIN + 8}, {self.n}] (the file's "
                                f"{self.n} bytes)")
        from .tflite_check import _Bad, _Checker

        with self.b[_HEADER_BEGIN:end] as header:
            try:
                system, sections = self._header(_Checker(header.cast("B")))
            except _Bad as e:
                self.fail("header", f"corrupt flatbuffer: {e}")
            except (struct.error, IndexError, ValueError, OverflowError, UnicodeDecodeError) as e:
                self.fail("header", f"corrupt flatbuffer ({type(e).__name__}: {e})")
        return self._sections(system, sections, end)

    # ------------------------------------------------------------------ the header flatbuffer
    def _header(self, c) -> tuple[dict, list]:
        root = c.table(c._u32(0), "the header")
        system = {}
        at = c._ref(root, 0)
        if at is not None:
            for kv in c.tables(c.table(at, "the system metadata"), 0, "system metadata entry"):
                key, value = self._kv(c, kv)
                system[key] = value
        sections = []
        at = c._ref(root, 1)
        objects = c.tables(c.table(at, "the section list"), 0, "section") if at is not None else []
        if len(objects) > _MAX_SECTIONS:
            raise ValueError(f"{len(objects)} sections; a bundle holds a few")
        for obj in objects:
            items = dict(self._kv(c, kv) for kv in c.tables(obj, 0, f"{obj[4]} item"))
            sections.append((c.scalar(obj, 3, "<B"), c.scalar(obj, 1, "<Q"), c.scalar(obj, 2, "<Q"), items))
        return system, sections

    @staticmethod
    def _kv(c, kv) -> tuple:
        key = c.string(kv, 0)
        kind, at = c.scalar(kv, 1, "<B"), c._ref(kv, 2)
        if key is None:
            raise ValueError(f"{kv[4]} has no key")
        if at is None or kind == 0:
            return key, None
        t = c.table(at, f"the value of {key!r}")
        if kind == _STRING_VALUE:
            return key, c.string(t, 0)
        if kind not in _VALUE_FMT:
            raise ValueError(f"the value of {key!r} has the unknown type {kind}")
        return key, c.scalar(t, 0, _VALUE_FMT[kind])

    # ------------------------------------------------------------------ the sections
    def _sections(self, system: dict, sections: list, header_end: int) -> dict:
        from litert_lm_builder import litertlm_header_schema_py_generated as hs

        names = {v: k for k, v in vars(hs.AnySectionDataType).items() if not k.startswith("_")}
        out = {"version": "{}.{}.{}".format(*struct.unpack_from("<III", self.b, 8)), "system_metadata": system,
               "sections": [], "vocab": None}
        spans = []
        for i, (kind, begin, end, items) in enumerate(sections):
            name = names.get(kind)
            where = f"section {i} ({name or kind})"
            if name is None or name in ("NONE", "Deprecated"):
                self.fail(where, f"unknown section type {kind}")
            if not header_end <= begin <= end <= self.n:
                self.fail(where, f"bytes [{begin}, {end}) lie outside the file's sections [{header_end}, {self.n}) "
                                 f"(the file is {self.n} bytes)")
            spans.append((begin, end, i))
            out["sections"].append({"type": name, "begin": begin, "end": end, "items": items})
        spans.sort()
        for (b0, e0, i0), (b1, _, i1) in zip(spans, spans[1:]):
            if b1 < e0:
                self.fail(f"section {i1}", f"bytes from {b1} overlap section {i0}'s [{b0}, {e0})")
        kinds = [s["type"] for s in out["sections"]]
        if "TFLiteModel" not in kinds:
            self.fail("sections", f"no TFLiteModel section (sections: {kinds}); the engine has no model to run")
        if not {"HF_Tokenizer_Zlib", "SP_Tokenizer"} & set(kinds):
            self.fail("sections", f"no tokenizer section (sections: {kinds}); the engine needs HF_Tokenizer_Zlib "
                                  "or SP_Tokenizer")
        # the model first: its signatures give the vocabulary and cache tensors the metadata is checked against
        order = sorted(range(len(kinds)), key=lambda i: kinds[i] != "TFLiteModel")
        sigs = {}
        for i in order:
            sec = out["sections"][i]
            where = f"section {i} ({sec['type']})"
            with self.b[sec["begin"]:sec["end"]] as data:
                if sec["type"] == "TFLiteModel":
                    model_sigs = self._tflite(where, data, sec["items"])
                    if model_sigs is not None:
                        if sigs:
                            self.fail(where, "a second prefill/decode model; the engine runs one")
                        sigs = model_sigs
                        out["vocab"] = self._engine_vocab(where, sigs)
                elif sec["type"] in _PROTOS:
                    sec["metadata"] = self._proto(where, data, sec["type"], out["vocab"], sigs)
                elif sec["type"] == "HF_Tokenizer_Zlib":
                    sec["tokenizer_bytes"] = self._tokenizer(where, data, out["vocab"])
        return out

    def _tflite(self, where: str, data: memoryview, items: dict):
        """The prefill/decode model's signatures (None for another model kind), after check_tflite."""
        from .litertlm import _signatures
        from .tflite_check import TfliteFormatError, check_tflite

        try:
            check_tflite(data, where)
        except TfliteFormatError as e:
            self.fail(where, str(e).split(". Fix:")[0].removeprefix(f"{where}: "))
        if items.get("model_type", "tf_lite_prefill_decode") != "tf_lite_prefill_decode":
            return None
        try:
            return _signatures(data)
        except (KeyError, IndexError, ValueError, TypeError, AttributeError, UnicodeDecodeError) as e:
            self.fail(where, f"unreadable signatures ({type(e).__name__}: {e})")

    def _engine_vocab(self, where: str, sigs: dict) -> int:
        from .litertlm import LitertLmError, engine_vocab

        try:
            return engine_vocab(sigs)
        except LitertLmError as e:
            self.fail(where, str(e).split(": export it with")[0].removeprefix("tflite: "))

    def _proto(self, where: str, data: memoryview, kind: str, vocab, sigs) -> dict:
        from google.protobuf import json_format
        from google.protobuf.message import DecodeError

        if len(data) > _MAX_PROTO:
            self.fail(where, f"{len(data)} bytes of metadata; at most {_MAX_PROTO}")
        msg = _PROTOS[kind]()()
        try:
            msg.ParseFromString(bytes(data))
        except (DecodeError, RuntimeError, ValueError) as e:
            self.fail(where, f"not a {type(msg).__name__} proto ({e})")
        if kind == "LlmMetadataProto":
            self._llm(where, msg, vocab)
        elif kind == "ExecutorMetadataProto":
            self._executor(where, msg, sigs)
        try:
            return json_format.MessageToDict(msg, preserving_proto_field_name=True)
        except (ValueError, TypeError, UnicodeDecodeError) as e:
            self.fail(where, f"unreadable {type(msg).__name__} ({e})")

    def _llm(self, where: str, msg, vocab) -> None:
        tokens = [("start_token", msg.start_token), ("pad_token", msg.pad_token)]
        tokens += [(f"stop_tokens[{k}]", t) for k, t in enumerate(msg.stop_tokens)]
        for name, t in tokens:
            bad = [i for i in t.token_ids.ids if i < 0 or (vocab is not None and i >= vocab)]
            if bad:
                self.fail(where, f"{name} holds the token ids {bad[:4]}, outside the model's vocabulary "
                                 f"[0, {vocab})")
        if msg.max_num_tokens < 0:
            self.fail(where, f"max_num_tokens is {msg.max_num_tokens}")
        if msg.jinja_prompt_template:  # the engine renders it for a session that applies the prompt template
            from .chat_template import ChatTemplateError, check_chat_template

            try:
                check_chat_template(msg.jinja_prompt_template, where="jinja_prompt_template")
            except ChatTemplateError as e:
                self.fail(where, str(e))

    def _executor(self, where: str, msg, sigs: dict) -> None:
        """Each cache buffer the engine binds by name: an input and an output of every prefill and of decode,
        its sequence axis and maximum length inside that tensor."""
        if not sigs:
            return
        for k, sb in enumerate(msg.llm_executor_metadata.state_buffers):
            for sig, (ins, outs) in sigs.items():
                if sig != "decode" and not sig.startswith("prefill_"):
                    continue
                side = "decode" if sig == "decode" else "prefill"
                for io, name in ((ins, getattr(sb, f"{side}_input_name")), (outs, getattr(sb, f"{side}_output_name"))):
                    got = io.get(name)
                    if got is None:
                        self.fail(where, f"cache buffer {k} names {name!r}, which signature {sig!r} does not "
                                         f"{'take' if io is ins else 'return'}")
                    shape = got[0]
                    if not 0 <= sb.sequence_axis < len(shape):
                        self.fail(where, f"cache buffer {k}: sequence axis {sb.sequence_axis} of the rank-"
                                         f"{len(shape)} tensor {name!r}")
                    if sb.maximum_sequence_length > shape[sb.sequence_axis]:
                        self.fail(where, f"cache buffer {k}: maximum_sequence_length {sb.maximum_sequence_length} "
                                         f"exceeds {name!r}'s {shape[sb.sequence_axis]} slots")

    def _tokenizer(self, where: str, data: memoryview, vocab) -> int:
        if len(data) < 8:
            self.fail(where, f"{len(data)} bytes; it starts with the 8-byte uncompressed size")
        from tpu_export.converter.untrusted import limit

        (size,) = struct.unpack_from("<Q", data, 0)
        if size > limit("tokenizer"):
            self.fail(where, f"declares {size} bytes of tokenizer.json; at most {limit('tokenizer')} are read "
                             "(TPU_EXPORT_MAX_TOKENIZER_BYTES raises the cap)")
        z = zlib.decompressobj()
        try:
            text = z.decompress(data[8:], size + 1)
        except zlib.error as e:
            self.fail(where, f"not zlib data ({e})")
        if len(text) != size or not z.eof:
            self.fail(where, f"declares {size} bytes of tokenizer.json, the compressed data holds "
                             f"{'more' if len(text) > size else len(text) if z.eof else 'a truncated stream of'}")
        try:
            doc = json.loads(text)
        except (ValueError, RecursionError) as e:
            self.fail(where, f"the tokenizer is not JSON ({type(e).__name__}: {e})")
        if not isinstance(doc, dict) or not isinstance(doc.get("model"), dict):
            self.fail(where, "the tokenizer has no 'model' entry: not a Hugging Face tokenizer.json")
        top = max_token_id(doc)
        if vocab is not None and top is not None and top >= vocab:
            self.fail(where, f"the tokenizer has token id {top}, past the model's vocabulary of {vocab} (logits)")
        return size


def max_token_id(doc) -> int | None:
    """The largest id a parsed tokenizer.json can produce (its model's vocabulary and its added tokens), or None
    when it names none. Used where a tokenizer meets an embedding: the bundle check and a model directory's."""
    if not isinstance(doc, dict):
        return None
    ids = []
    model = doc.get("model")
    vocab = model.get("vocab") if isinstance(model, dict) else None
    if isinstance(vocab, dict):
        ids += [v for v in vocab.values() if type(v) is int]
    elif isinstance(vocab, list):  # Unigram: [[piece, score], ...], ids by position
        ids.append(len(vocab) - 1)
    ids += [t["id"] for t in doc.get("added_tokens") or () if isinstance(t, dict) and type(t.get("id")) is int]
    return max(ids) if ids else None


def _llm_proto():
    from litert_lm_builder.runtime.proto import llm_metadata_pb2

    return llm_metadata_pb2.LlmMetadata


def _executor_proto():
    from litert_lm_builder.runtime.proto import executor_metadata_pb2

    return executor_metadata_pb2.ExecutorMetadata


def _embedding_proto():
    from litert_lm_builder.runtime.proto import embedding_metadata_pb2

    return embedding_metadata_pb2.EmbeddingMetadata


_PROTOS = {"LlmMetadataProto": _llm_proto, "ExecutorMetadataProto": _executor_proto,
           "EmbeddingMetadataProto": _embedding_proto}
