"""The ``.litertlm`` bundle that Google's LiteRT-LM engine loads: a prefill/decode ``.tflite`` (converter.llm's
cache protocol), its Hugging Face tokenizer, and the metadata the engine reads, written with ``litert-lm-builder``.

    from tpu_export.converter.llm import prepare_lm
    prog, spec = prepare_lm(hf_model, prefill_lengths=(32,), cache_len=1024)
    write_litertlm("model.litertlm", edge.convert_program(prog), tokenizer_json="hf_dir/tokenizer.json",
                   stop_token_ids=[2], max_num_tokens=1024, cache_spec=spec)
    litert_lm.Engine("model.litertlm")   # then create_session(), run_prefill([text]), run_decode()

Sections, in order (what ``litert-lm-peek --litertlm_file F`` lists):

- LlmMetadata: start token (when the tokenizer does not add one itself), stop tokens, pad token, max_num_tokens,
  llm_model_type, jinja_prompt_template.
- ExecutorMetadata: one state buffer per cache tensor, ``kv_cache_k_<i>`` / ``kv_cache_v_<i>``, input and output
  of every signature under the same name, GLOBAL_KEY_CACHE / GLOBAL_VALUE_CACHE, sequence axis 2 for both (the
  protocol stores V like K, [1, kv_heads, cache_len, head_dim]), maximum_sequence_length = cache_len. K and V may
  differ in width (an MLA model's latent and rope key, converter/llm_mla.py): the engine allocates each cache
  buffer from the .tflite's own tensor of that name.
- HF_Tokenizer_Zlib: tokenizer.json.
- TFLiteModel (model_type tf_lite_prefill_decode).

What the engine needs of the .tflite, checked here before anything is written: a ``decode`` signature and at
least one ``prefill_<L>`` (it picks the prefill by the length of ``input_pos``), inputs named ``tokens`` int32
[1, T] and ``input_pos`` int32 [T] and the caches, a ``logits`` output [1, 1, vocab] from decode. It fills
unused prefill rows with token 0 at position 0 and it feeds the prompt's last token through decode, so prefill
logits are never read. The write is atomic (converter.atomic): a failed check or build leaves no file.
"""

from __future__ import annotations

import json
import os
import re

from tpu_export.converter.atomic import discard, staging_dir, write_file
from tpu_export.converter.untrusted import UntrustedFileError, limit, read_bytes

__all__ = ["LitertLmError", "MODEL_TYPES", "engine_state_refusal", "engine_vocab", "read_litertlm",
           "write_litertlm"]

# LlmMetadata.llm_model_type's choices in litert-lm-builder 0.18.1 (the oneof's field names); "generic_model" is
# the engine's default handling (the jinja template and the stop tokens, nothing model-specific)
MODEL_TYPES = ("generic_model", "gemma3", "gemma3n", "gemma4", "function_gemma", "qwen3", "qwen2p5", "lfm2",
               "fast_vlm", "minicpm5", "minicpmv4")

_PREFILL = re.compile(r"prefill_(\d+)$")


class LitertLmError(ValueError):
    """A bad argument to write_litertlm or an unreadable .litertlm; one line naming it and the fix."""


def _fail(msg: str):
    raise LitertLmError(msg)


def engine_state_refusal(cache_spec, family: str) -> str | None:
    """Why the LiteRT-LM engine cannot run a model whose state is more than its KV caches (converter.llm's
    CacheSpec.states, e.g. LFM2's convolution windows), as one line naming what runs it; None for a K/V-only
    model. The engine passes back from one call to the next only the inputs it takes for caches (the ``kv_cache_k_``
    / ``kv_cache_v_`` names, or the ExecutorMetadata state buffers); a convolution window declared as its
    TYPE_LINEAR_ATTENTION state buffer generated other text than transformers (docs/llm.md#lfm2)."""
    names = [n for n, _ in getattr(cache_spec, "states", ())]
    if not names:
        return None
    return (f"{family}: no .litertlm: the LiteRT-LM engine has no place for a convolution state "
            f"({names[0]}, ...: it carries only KV caches between calls, docs/llm.md#lfm2); the .tflite with "
            "`tpu-export generate` and the TPU artifact run it")


def _tflite_data(tflite):
    """The .tflite's bytes, or a read-only map of the file at a path (a multi-GB model is checked where it lies and
    copied into the bundle by the builder, never read into memory)."""
    if isinstance(tflite, (bytes, bytearray, memoryview)):
        return bytes(tflite)
    if isinstance(tflite, (str, os.PathLike)):
        from .tflite_check import map_tflite

        return map_tflite(tflite)
    _fail(f"tflite: expected the .tflite's bytes or path, got {type(tflite).__name__}: pass "
          f"edge.convert_program(prog) of converter.llm.prepare_lm's program")


def _signatures(data: bytes) -> dict:
    """signature name -> ({input name: (shape, dtype name)}, {output name: (shape, dtype name)})."""
    from .builder import schema, type_names

    s, types = schema(), type_names()
    m = s.Model.GetRootAs(data, 0)
    sigs = {}

    def side(sg, n, get):
        out = {}
        for j in range(n):
            tm = get(j)
            t = sg.Tensors(tm.TensorIndex())
            out[tm.Name().decode()] = (tuple(int(d) for d in t.ShapeAsNumpy()) if t.ShapeLength() else (),
                                       types[t.Type()])
        return out

    for i in range(m.SignatureDefsLength()):
        sd = m.SignatureDefs(i)
        sg = m.Subgraphs(sd.SubgraphIndex())
        sigs[sd.SignatureKey().decode()] = (side(sg, sd.InputsLength(), sd.Inputs),
                                            side(sg, sd.OutputsLength(), sd.Outputs))
    return sigs


_FIX_EXPORT = "export it with converter.llm.prepare_lm(model, prefill_lengths=..., cache_len=...) and " \
              "edge.convert_program"


def engine_vocab(sigs: dict) -> int:
    """What the LiteRT-LM engine calls in a prefill/decode .tflite (``_signatures``' dict): 'decode' and at least
    one 'prefill_<L>', each taking ``tokens`` int32 [1, T] and ``input_pos`` int32 [T], and decode's ``logits``
    float32 [1, 1, vocab]. Returns the vocabulary size."""
    if "decode" not in sigs or not any(_PREFILL.match(n) for n in sigs):
        _fail(f"tflite: signatures {sorted(sigs)}; LiteRT-LM needs 'decode' and at least one 'prefill_<L>': "
              f"{_FIX_EXPORT}")
    for name, (ins, _) in sigs.items():
        if name != "decode" and not _PREFILL.match(name):
            continue
        t = 1 if name == "decode" else int(_PREFILL.match(name).group(1))
        for n, w in {"tokens": ((1, t), "int32"), "input_pos": ((t,), "int32")}.items():
            if ins.get(n) != w:
                _fail(f"tflite: signature {name!r} input {n!r} is {ins.get(n)}, LiteRT-LM needs {w}: {_FIX_EXPORT}")
    logits = sigs["decode"][1].get("logits")
    if logits is None or len(logits[0]) != 3 or logits[0][:2] != (1, 1) or logits[1] != "float32" or \
            logits[0][2] < 1:
        _fail(f"tflite: decode's 'logits' output is {logits}; LiteRT-LM needs float32 [1, 1, vocab]: {_FIX_EXPORT}")
    return logits[0][2]


def _check_signatures(sigs: dict, spec) -> int:
    """The engine's view of the .tflite, checked against the cache spec; returns the vocabulary size."""
    vocab = engine_vocab(sigs)
    want = {n: (tuple(shape), "float32") for n, shape in spec.shapes().items()}
    for name, (ins, outs) in sigs.items():
        if name != "decode" and not _PREFILL.match(name):
            continue
        for n, w in want.items():
            if ins.get(n) != w:
                _fail(f"tflite: signature {name!r} input {n!r} is {ins.get(n)}, LiteRT-LM needs {w} for this cache "
                      f"spec: {_FIX_EXPORT}")
            if outs.get(n) != w:
                _fail(f"tflite: signature {name!r} output {n!r} is {outs.get(n)}, LiteRT-LM needs {w} "
                      f"(the updated cache under its input's name): {_FIX_EXPORT}")
    return vocab


def _tokenizer_bytes(tokenizer_json) -> bytes:
    if isinstance(tokenizer_json, (bytes, bytearray)):
        data = bytes(tokenizer_json)
    elif isinstance(tokenizer_json, (str, os.PathLike)):
        try:
            data = read_bytes(tokenizer_json, max_bytes=limit("tokenizer"), cap_name="tokenizer",
                              what="the tokenizer")
        except UntrustedFileError as e:
            _fail(f"tokenizer_json: {e}")
    else:
        _fail(f"tokenizer_json: expected bytes or a path to tokenizer.json, got {type(tokenizer_json).__name__}")
    try:
        doc = json.loads(data)
    except ValueError as e:
        _fail(f"tokenizer_json: not JSON ({e}): pass a Hugging Face tokenizer.json (save_pretrained writes one)")
    if not isinstance(doc, dict) or "model" not in doc:
        _fail("tokenizer_json: no 'model' entry, not a Hugging Face tokenizer.json: pass the one save_pretrained "
              "writes (sentencepiece .model files are not taken)")
    return data


def _token_ids(name: str, ids, vocab: int, allow_none=False) -> list[int]:
    if ids is None and allow_none:
        return []
    ids = [ids] if isinstance(ids, int) else ids
    try:
        ids = [int(i) for i in ids]
        ok = all(isinstance(i, int) for i in ids)
    except (TypeError, ValueError):
        ok = False
    if not ok or (not ids and not allow_none):
        _fail(f"{name}: expected a non-empty list of token ids, got {ids!r}: pass e.g. "
              f"generation_config.eos_token_id")
    bad = [i for i in ids if not 0 <= i < vocab]
    if bad:
        _fail(f"{name}: token ids {bad} are outside the model's vocabulary [0, {vocab}): pass ids of this "
              f"model's tokenizer")
    return ids


def _check_template(template):
    """The template renders a user turn within edge.chat_template's limits, as generate --chat renders it."""
    if template is None:
        return
    if not isinstance(template, str) or not template.strip():
        _fail(f"prompt_template: expected a jinja chat template string or None, got {template!r}")
    from .chat_template import ChatTemplateError, check_chat_template

    try:
        check_chat_template(template, where="prompt_template")
    except ChatTemplateError as e:
        _fail(f"{e} (tokenizer_config.json's chat_template or chat_template.jinja)")


_DIRECT_FROM = 256 << 20  # a .tflite from this size is copied into the bundle by edge.file_copy.copy_direct


def write_litertlm(path, tflite, *, tokenizer_json, stop_token_ids, max_num_tokens: int, cache_spec,
                   prompt_template: str | None = None, model_type: str = "generic_model",
                   start_token_id: int | None = None, pad_token_id: int | None = None,
                   authors: str = "tpu-export") -> str:
    """Write the ``.litertlm`` bundle at ``path`` (atomically) and return its path.

    ``tflite``: the .tflite bytes or path (prefill_<L> / decode signatures of ``cache_spec``, batch 1; a path is
    mapped, not read, so a .tflite in the large-model form past 2 GiB bundles without its size in memory);
    ``tokenizer_json``: tokenizer.json bytes or path; ``stop_token_ids``: the ids that end a reply (eos);
    ``max_num_tokens``: the engine's context limit, prompt + reply, at most the cache length;
    ``prompt_template``: the jinja chat template (None: the engine formats no turns);
    ``start_token_id``: the id the engine prepends to a prompt (None when the tokenizer adds its own, or none);
    ``model_type``: one of MODEL_TYPES (LlmMetadata.llm_model_type).
    """
    from tpu_export.converter.llm import CacheSpec

    if not isinstance(path, (str, os.PathLike)) or not os.fspath(path).endswith(".litertlm"):
        _fail(f"path: {path!r} must be a file path ending in .litertlm (the engine picks the format by suffix)")
    if not isinstance(cache_spec, CacheSpec):
        _fail(f"cache_spec: expected the converter.llm.CacheSpec that prepare_lm returned, got "
              f"{type(cache_spec).__name__}")
    refusal = engine_state_refusal(cache_spec, "this model")
    if refusal is not None:
        _fail(refusal)
    if cache_spec.batch != 1:
        _fail(f"cache_spec: batch {cache_spec.batch}; LiteRT-LM runs batch 1: export with prepare_lm(batch=1)")
    if model_type not in MODEL_TYPES:
        _fail(f"model_type: {model_type!r} is not one of {list(MODEL_TYPES)}")
    if isinstance(max_num_tokens, bool) or not isinstance(max_num_tokens, int) or \
            not 1 <= max_num_tokens <= cache_spec.cache_len:
        _fail(f"max_num_tokens: {max_num_tokens!r} must be an int in [1, {cache_spec.cache_len}] (the cache length "
              f"bounds prompt + reply): lower it or re-export with a longer cache")
    data = _tflite_data(tflite)
    from .tflite_check import check_tflite

    try:
        check_tflite(data, "tflite")
        vocab = _check_signatures(_signatures(data), cache_spec)
    finally:
        if not isinstance(data, bytes):
            data.close()
    tok = _tokenizer_bytes(tokenizer_json)
    stops = _token_ids("stop_token_ids", stop_token_ids, vocab)
    start = _token_ids("start_token_id", start_token_id, vocab, allow_none=True)
    pad = _token_ids("pad_token_id", pad_token_id, vocab, allow_none=True)
    _check_template(prompt_template)

    from litert_lm_builder import litertlm_builder as lb
    from litert_lm_builder.runtime.proto import executor_metadata_pb2, llm_metadata_pb2

    from .file_copy import copy_direct

    llm = llm_metadata_pb2.LlmMetadata(max_num_tokens=max_num_tokens)
    if start:
        llm.start_token.token_ids.ids.extend(start)
    for i in stops:
        llm.stop_tokens.add().token_ids.ids.append(i)
    if pad:
        llm.pad_token.token_ids.ids.extend(pad)
    getattr(llm.llm_model_type, model_type).SetInParent()
    if prompt_template is not None:
        llm.jinja_prompt_template = prompt_template
    ex = executor_metadata_pb2.ExecutorMetadata()
    ex.llm_executor_metadata.max_history_size = cache_spec.cache_len
    kinds = {"k": executor_metadata_pb2.StateBuffer.TYPE_GLOBAL_KEY_CACHE,
             "v": executor_metadata_pb2.StateBuffer.TYPE_GLOBAL_VALUE_CACHE}
    for name in cache_spec.names():
        ex.llm_executor_metadata.state_buffers.add(
            prefill_input_name=name, prefill_output_name=name, decode_input_name=name, decode_output_name=name,
            type=kinds[name.split("_")[2]], sequence_axis=2, maximum_sequence_length=cache_spec.cache_len)

    # the builder reads its inputs from files: they go in a staging folder beside the bundle, removed after
    stage = staging_dir(os.fspath(path) + ".parts")
    try:
        files = {}
        parts = {"tokenizer.json": tok, "llm_metadata.pb": llm.SerializeToString(),
                 "executor_metadata.pb": ex.SerializeToString()}
        if isinstance(data, bytes):
            parts["model.tflite"] = data
        else:  # a file: the builder copies it into the bundle itself (sendfile), no staged copy
            files["model.tflite"] = os.path.abspath(os.fspath(tflite))
        for name, blob in parts.items():
            files[name] = write_file(os.path.join(stage, name), blob)
        b = lb.LitertLmFileBuilder()
        b.add_system_metadata(lb.Metadata(key="Authors", value=authors, dtype=lb.DType.STRING))
        b.add_llm_metadata(files["llm_metadata.pb"])
        b.add_executor_metadata(files["executor_metadata.pb"])
        b.add_hf_tokenizer(files["tokenizer.json"])
        b.add_tflite_model(files["model.tflite"], lb.TfLiteModelType.PREFILL_DECODE)
        section = b._sections[-1] if getattr(b, "_sections", None) else None
        if "model.tflite" not in parts and hasattr(section, "data_writer") and \
                os.path.getsize(files["model.tflite"]) >= _DIRECT_FROM:
            # a large file: its blocks go to disk straight from the page cache (the builder's sendfile would copy
            # them into the cache again); builder 0.18.1's section writer, the one it calls with the stream
            section.data_writer = lambda stream, src=files["model.tflite"]: copy_direct(src, stream)
        return write_file(path, lambda f: b.build(f))
    finally:
        discard(stage)


def read_litertlm(path) -> dict:
    """The bundle's version, system metadata and sections (type, byte range, items, and for the metadata sections
    their fields as a dict), for ``tpu-export inspect``; the bundle is checked first (edge.litertlm_check: a
    corrupt one is a BundleFormatError). The file is mapped, never read whole."""
    from .litertlm_check import check_litertlm

    return check_litertlm(path)
