"""An LLM, captured once, written for every target: ``.tflite`` + ``.litertlm`` for edge targets, the StableHLO
artifact (AOT-compiled per TPU generation) for TPU targets.

    written = convert_lm("hf_dir", ["android", "tpu-v6e"], "out", prefill_lengths=(32, 128), cache_len=1024)
    # {"android": {"model.tflite": ..., "model.litertlm": ...}, "tpu-v6e": {"model.tpuexp": ...}}

The source is a model directory, a transformers model object (+ tokenizer) or a cache-protocol module
(targets/lm_source.py). Every target folder also gets ``lm.json`` (cache shapes, prefill lengths, stop tokens,
chat template) and ``tokenizer.json``, what tpu_export.generate needs to run the ``.tflite`` or the TPU artifact
with its own loop; the ``.litertlm`` carries the same inside for the LiteRT-LM engine. Targets and options are
checked before the model is loaded; everything is built in a staging folder and ``out_dir`` is replaced in one
step (converter/atomic.py), with ``summary.json`` (stage times, sizes, signatures): a failure leaves it as it was.
This lives in targets/ (not the application layer) so that litert_torch.generative.export_hf can share it.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import re
import time
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from tpu_export.converter.atomic import discard, publish_dir, staging_dir, write_file

from .files import artifact_size
from .lm_source import LmSource, LmSourceError, load_lm_source
from .registry import IotTarget, get_target

if TYPE_CHECKING:
    import torch

__all__ = ["DEFAULT_CACHE_LEN", "LM_META", "Stages", "capture_lm", "check_lm_chat_template", "convert_lm",
           "edge_lm_bytes", "lm_meta", "write_litertlm_bundle"]

DEFAULT_CACHE_LEN = 1024
LM_META = "lm.json"  # beside every artifact: what a generation loop needs that the graph does not say
_KIND = "tpu-export-lm"  # summary.json's kind: an out_dir this function wrote (and may replace)


class Stages:
    """Stage timer: says when a stage starts and how long it took, and keeps {stage: seconds}."""

    def __init__(self, say):
        self.say, self.times = say, {}

    @contextlib.contextmanager
    def __call__(self, key: str, what: str):
        self.say(f"{key}: {what}")
        t0 = time.perf_counter()
        yield
        dt = time.perf_counter() - t0
        self.times[key] = round(self.times.get(key, 0.0) + dt, 3)
        self.say(f"{key}: done in {dt:.2f} s")


def convert_lm(source: str | os.PathLike[str] | torch.nn.Module, targets: str | Sequence[str] | Mapping[str, Any],
               out_dir: str | os.PathLike[str], *, tokenizer: Any = None, prefill_lengths: Sequence[int] = (32,),
               cache_len: int | None = None, quantize: str | None = None,
               progress: Callable[[str], None] | None = None, allow_nonfinite_weights: bool = False,
               verify: bool = True) -> dict[str, dict[str, str]]:
    """Convert a causal LM, with its KV cache, for every target into ``out_dir``.

    The model is captured once (a prefill signature per prefill length and a decode signature, the cache as
    explicit state) and written per target: for edge targets a ``.tflite`` and a ``.litertlm`` bundle for the
    LiteRT-LM engine, for TPU targets the StableHLO artifact (AOT-compiled per TPU generation when libtpu is
    installed). Every target folder also gets ``lm.json`` and ``tokenizer.json``, so that ``load_generator`` can
    run it. Targets and options are checked before the model is loaded; everything is built in a staging folder
    and ``out_dir`` is replaced in one step, with a ``summary.json``: a failure leaves it as it was. Nothing is
    downloaded.

    Args:
        source: A Hugging Face model directory (``config.json``, safetensors weights, tokenizer), a transformers
            causal LM object (pass its ``tokenizer``), or a module that follows the cache protocol.
        targets: A target name, a list of names, or ``{name: options}`` (e.g. ``{"tpu-v6e": {"aot": False}}``).
            Not ``iot``.
        out_dir: The folder to write (replaced whole): a missing or empty folder, or one this function wrote.
        tokenizer: The tokenizer of a model object (a transformers tokenizer); a model directory brings its own.
        prefill_lengths: The prompt lengths to export a prefill signature for (a prompt runs in the shortest one
            that fits it).
        cache_len: Slots of the KV cache, which is also the bundle's max tokens (default 1024; a cache-protocol
            module brings its own).
        quantize: A scheme for every target that takes it (edge: ``dynamic_int8``, ``weight_only_int8``,
            ``weight_only_int4``, ``dynamic_int4_block32``, ``fp16``; TPU: ``weight_only_int8``). Per-target
            options override it; TPU bf16 is the target option ``dtype="bfloat16"``.
        progress: Called with one line per stage (load, capture, verify, each target's steps).
        allow_nonfinite_weights: Convert a model with NaN or infinite weights (with a warning) instead of refusing
            it.
        verify: Before publishing, run each artifact's prefill and decode on a sample prompt and compare the
            logits with the source model's own forward; past the target's bound nothing is published. False skips
            it.

    Returns:
        Target name -> {file name -> path}, e.g. ``{"android": {"model.tflite": ..., "model.litertlm": ...,
        "lm.json": ..., "tokenizer.json": ...}}``.

    Raises:
        ValueError: A target name is unknown, named twice or is ``iot``; static int8 is asked for; or ``out_dir``
            holds something this function did not write.
        TypeError: A target option is unknown or has the wrong type (``OptionsError``).
        tpu_export.targets.lm_source.LmSourceError: The model directory, object or tokenizer cannot be converted,
            or an artifact's logits are off the source model's past the target's bound (a ValueError; the message
            names the file and the fix).
        tpu_export.converter.UnsupportedModelError: The model uses a feature the export does not implement (named
            in the message).

    Examples:
        ``model_dir`` is a Hugging Face model directory (here a tiny seeded Llama):

        >>> import os, tempfile
        >>> import tpu_export
        >>> out = os.path.join(tempfile.mkdtemp(), "out")
        >>> written = tpu_export.convert_lm(model_dir, {"android": {}, "tpu-v6e": {"aot": False}}, out,
        ...                                 prefill_lengths=(8,), cache_len=64)
        >>> sorted(written["android"]), sorted(written["tpu-v6e"])
        (['lm.json', 'model.litertlm', 'model.tflite', 'tokenizer.json'], ['lm.json', 'model.tpuexp', 'tokenizer.json'])
        >>> tpu_export.load_generator(os.path.join(out, "tpu-v6e")).generate("hello", 4).new_tokens <= 4
        True
    """
    say = progress or (lambda msg: None)
    resolved, opts = _resolve(targets, quantize)
    slots = _slots(resolved, opts)
    out_dir = os.path.abspath(os.fspath(out_dir))
    _check_out_dir(out_dir)
    stages = Stages(say)
    with stages("load", f"reading {source if isinstance(source, (str, os.PathLike)) else type(source).__name__}"):
        src = load_lm_source(source, tokenizer, allow_nonfinite_weights=allow_nonfinite_weights)
    if any(t.backend == "edge" for t in resolved):
        src.require_tokenizer("the .litertlm bundle")  # before the capture, not after minutes of it
    check_lm_chat_template(source, src)
    if slots is not None and src.protocol:
        raise LmSourceError(f"{src.name}: slots need a transformers model (decode_slots is built from its layers); "
                            "a cache-protocol module brings its own signatures: drop slots")
    with stages("capture", f"torch.export of prefill {sorted(set(prefill_lengths))} and decode"
                           f"{f', decode_slots over {slots} slots' if slots else ''}, cache {cache_len or 'default'}"):
        prog, spec = capture_lm(src, prefill_lengths, cache_len, slots=slots)
    meta = lm_meta(src, spec, prefill_lengths)
    slotted = None
    if slots is not None:  # the slot signatures go to the targets that asked for them, the rest get the batch-1 ones
        from tpu_export.converter.llm import SLOT_SIGNATURES

        slotted = prog
        prog = _without(prog, SLOT_SIGNATURES)
    no_bundle = _bundle_refusal(src, spec)  # None, or why no .litertlm is written
    cache_comparison = _plain_kv_comparison(src)
    ref = None
    if verify:  # before any target is written: the last edge target releases the model
        from .lm_verify import reference_logits

        what = "the module's eager forward" if src.protocol else "transformers"
        with stages("verify", f"prefill logits against {what}"):
            ref = reference_logits(src, prog, spec, prefill_lengths)
        source_dtype = next((p.dtype for p in getattr(src.model, "parameters", lambda: iter(()))()), None)
    signatures = {s.name: {"inputs": [(i.name, list(i.shape), str(i.dtype)) for i in s.inputs]}
                  for s in (slotted or prog).signatures.values()}
    held = {"prog": prog}  # the only reference from here on: the last edge target drops it (see _edge_lm_bytes)
    del prog
    stage = staging_dir(out_dir)
    try:
        summary = {"kind": _KIND, "source": src.name, "prefill_lengths": meta["prefill_lengths"],
                   "cache": {**meta["cache"], **cache_comparison},
                   "stages": stages.times, "targets": {}}
        written = {}
        for k, (t, o) in enumerate(zip(resolved, opts)):
            d = os.path.join(stage, t.name)
            os.makedirs(d)
            ts = Stages(lambda m, n=t.name: say(f"{n}: {m}"))
            if t.backend == "edge":
                files, target_meta, tspec = (_write_edge(held, src, spec, t, o, d, ts, last=k == len(resolved) - 1,
                                                         no_bundle=no_bundle), meta, spec)
            else:
                mine = slotted if getattr(o, "slots", None) is not None else held["prog"]
                files, tspec = _write_tpu(mine, spec, t, o, d, ts)
                # bf16 caches under dtype=bfloat16
                target_meta = lm_meta(src, tspec, prefill_lengths, slots=getattr(o, "slots", None))
            files[LM_META] = write_file(os.path.join(d, LM_META), json.dumps(target_meta, indent=1).encode())
            if src.tokenizer_json is not None:
                files["tokenizer.json"] = write_file(os.path.join(d, "tokenizer.json"), src.tokenizer_json.encode())
            summary["targets"][t.name] = {"stages": ts.times,
                                          "bytes": {f: artifact_size(p) for f, p in sorted(files.items())},
                                          "verify": _verify(ref, t, o, files, tspec, ts, source_dtype)
                                          if verify else "off"}
            if t.backend == "edge" and no_bundle is not None:
                summary["targets"][t.name]["not_written"] = {"model.litertlm": no_bundle}
            written[t.name] = {f: os.path.join(out_dir, t.name, f) for f in files}
        summary["signatures"] = signatures
        write_file(os.path.join(stage, "summary.json"), json.dumps(summary, indent=2, default=str).encode())
        say(f"publishing {', '.join(t.name for t in resolved)} into {out_dir}")
        publish_dir(stage, out_dir)
    finally:
        discard(stage)
    return written


def _verify(ref, t, opts, files, spec, stages, source_dtype):
    """The summary record of the target's check (targets/lm_verify.py); raises LmSourceError on a mismatch."""
    if isinstance(ref, str):
        return {"skipped": ref}
    from .lm_verify import bound_for, verify_artifact

    path = files.get("model.tflite") or files.get("model.tpuexp")
    if path is None:
        return {"skipped": "no model.tflite or model.tpuexp written"}
    scheme, bound = bound_for(t, opts, source_dtype)
    with stages("verify", f"prefill logits against {ref.what}"):
        return verify_artifact(ref, path, spec, t.name, scheme, bound)


def _plain_kv_comparison(src: LmSource) -> dict:
    """For a model with multi-head latent attention (converter/llm_mla.py), the bytes per token a plain K/V cache
    of it would take (float32, as captured) and how many times the latent cache is smaller; {} for any other."""
    from tpu_export.converter.llm_mla import kv_bytes_per_token, mla_cache_widths

    if src.protocol or src.model is None or mla_cache_widths(src.model) is None:
        return {}
    sizes = kv_bytes_per_token(src.model.config)
    return {"plain_kv_bytes_per_token": sizes["plain_kv"], "plain_kv_over_mla": sizes["ratio"]}


def check_lm_chat_template(source, src: LmSource) -> None:
    """The chat template renders a user turn within edge.chat_template's limits, as ``generate --chat`` will: a
    template that loops for minutes or renders gigabytes is refused here, naming its file, not after the
    conversion."""
    from tpu_export.edge.chat_template import ChatTemplateError, check_chat_template

    if src.chat_template is None:
        return
    where = f"{src.name}'s chat template"
    if isinstance(source, (str, os.PathLike)) and os.path.isdir(source):
        jinja = os.path.join(os.fspath(source), "chat_template.jinja")
        where = jinja if os.path.isfile(jinja) else os.path.join(os.fspath(source), "tokenizer_config.json")
    try:
        check_chat_template(src.chat_template, where=where)
    except ChatTemplateError as e:
        raise LmSourceError(str(e)) from None


@contextlib.contextmanager
def _lm_narrowing_said():
    """The 64-bit narrowing warning in convert_lm's terms: it has no enable_x64 (both LM runtimes feed int32 token
    ids and positions), so the advice to pass one is replaced; every other warning passes through as it was."""
    import warnings

    from tpu_export.converter.passes.dtype_policy import KEEP_64_ADVICE

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
    for w in caught:
        text = str(w.message)
        if KEEP_64_ADVICE in text:
            text = text.replace(KEEP_64_ADVICE,
                                "convert_lm exports LMs 32-bit: both runtimes feed int32 token ids and positions.")
            warnings.warn(text, w.category, stacklevel=3)
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)


def _slots(resolved, opts) -> int | None:
    """The one slot count the targets ask for (option ``slots``), or None; the capture is shared by every target,
    so two different counts are refused."""
    counts = {t.name: o.slots for t, o in zip(resolved, opts) if getattr(o, "slots", None) is not None}
    if len(set(counts.values())) > 1:
        raise ValueError(f"targets {', '.join(counts)} ask for different slots ({counts}); the model is captured "
                         "once for every target: give them one slot count")
    return next(iter(counts.values()), None)


def _without(prog, names):
    """``prog`` without the signatures ``names``, ``decode_slots_<k>`` and ``slots_prefill_<L>`` (the same
    weights, shared)."""
    import dataclasses

    return dataclasses.replace(prog, signatures={n: s for n, s in prog.signatures.items() if n not in names
                                                 and not n.startswith(("decode_slots_", "slots_prefill_"))})


def capture_lm(src: LmSource, prefill_lengths, cache_len: int | None, slots: int | None = None):
    """One Program with ``prefill_<L>`` and ``decode`` sharing the weights (and with ``slots``, ``decode_slots``
    and ``insert_slot``: converter/llm.py); (program, CacheSpec of the batch-1 caches)."""
    import torch

    from tpu_export.converter.llm import lm_requests, prepare_lm
    from tpu_export.converter.pipeline import prepare_many

    if src.protocol:
        own = src.model.spec.cache_len
        if cache_len is not None and int(cache_len) != own:
            raise LmSourceError(f"{src.name}: its cache protocol spec holds {own} slots; cache_len={cache_len} cannot "
                                "change it (build the module with that cache length, or leave cache_len out)")
        with torch.no_grad(), _lm_narrowing_said():
            return prepare_many(lm_requests(src.model, prefill_lengths, prefill_logits=False)), src.model.spec
    from .lm_dir import check_lengths, layer_dims

    # before anything is allocated: the cache must fit this machine's memory, the prefill the cache
    layers, kv_heads, k_width, v_width = layer_dims(src.model.config)
    check_lengths(layers, kv_heads, k_width, list(prefill_lengths), int(cache_len or DEFAULT_CACHE_LEN), src.name,
                  v_head_dim=v_width)
    # prefill without logits: both runtimes' loops (LiteRT-LM's, tpu_export.generate's) never read them
    return prepare_lm(src.model, prefill_lengths=prefill_lengths, cache_len=int(cache_len or DEFAULT_CACHE_LEN),
                      prefill_logits=False, slots=slots)


def lm_meta(src: LmSource, spec, prefill_lengths, slots: int | None = None) -> dict:
    """The contents of lm.json: the cache's shapes, the prefill lengths, stop tokens, BOS, chat template; the
    cache protocol's version (1: prefill_<L> and decode; 2: also decode_slots and insert_slot over ``slots``
    rows, converter/llm.py)."""
    from tpu_export.converter.llm import CACHE_PROTOCOL

    return {"format": 1, "cache_protocol": CACHE_PROTOCOL if slots else 1, **({"slots": int(slots)} if slots else {}),
            "prefill_lengths": sorted({int(n) for n in prefill_lengths}),
            "cache": {"num_layers": spec.num_layers, "kv_heads": spec.kv_heads, "cache_len": spec.cache_len,
                      "head_dim": spec.head_dim, "v_head_dim": spec.v_width,
                      "dtype": str(spec.dtype).replace("torch.", ""), "bytes_per_token": spec.bytes_per_token,
                      **_state_meta(spec)},
            "stop_token_ids": list(src.stop_token_ids), "bos_token_id": src.bos_token_id,
            "chat_template": src.chat_template,
            "tokenizer": "tokenizer.json" if src.tokenizer_json is not None else None}


def _state_meta(spec) -> dict:
    """What a model with state beside its KV cache adds to lm.json's cache entry: the attention layers that hold
    K/V (``kv_layers``) and each other state tensor's shape without the batch axis (``states``, e.g. LFM2's
    ``conv_state_<i>``: converter/llm_conv.py); nothing for a model whose every layer is attention."""
    if spec.kv_layers is None and not spec.states:
        return {}
    return {"kv_layers": list(spec.kv_layer_ids), "states": {n: list(shape) for n, shape in spec.states}}


def edge_lm_bytes(prog, target, opts, stages) -> bytes:
    """The .tflite of an edge target: lowered, quantized by the target's scheme, checked against the target."""
    return _edge_lm_bytes({"prog": prog}, target, opts, stages)


def _edge_lm_bytes(held: dict, target, opts, stages, release=None) -> bytes:
    """edge_lm_bytes with the Program in ``held`` ({"prog": Program}). With ``release``, once the float .tflite
    exists the entry is dropped and ``release()`` called (the caller drops the torch model there): nothing after
    the lowering reads them, and a caller holding its only reference in ``held`` frees the weights before
    quantizing (a plain argument stays referenced from the caller's frame until the call returns). The float bytes
    go as soon as the quantizer's input exists (edge.quantize.prepare_tflite). Gemma-3-100M int8 through convert-lm
    (bench/llm.py): peak RSS 2.22 GB with the model, the float and the rewritten .tflite all held, 1.34 GB now (the
    peak is now the lowering's: the weights and the float .tflite)."""
    from tpu_export.edge.quantize import prepare_tflite, quantize_tflite

    from .checks import check_for_target, lower_for_target
    from .quantize import resolve_quant

    with stages("lower", "LiteRT flatbuffer (prefill and decode subgraphs, one copy of the weights)"):
        tflite = lower_for_target(held["prog"], target, channel_last_io=False)  # token ids, caches: no image layout
    if release is not None:
        held.clear()
        release()
    quant = resolve_quant(target, opts.quant_config, None)
    if quant is not None:
        with stages("quantize", f"{quant.scheme} (ai-edge-quantizer)"):
            tflite = prepare_tflite(tflite, quant)  # rebinding frees the float bytes
            tflite = quantize_tflite(tflite, quant)
    check_for_target(tflite, target, strict=opts.strict_ops, say=stages.say)
    return tflite


def write_litertlm_bundle(path: str, tflite: bytes, src: LmSource, spec) -> str:
    """The .litertlm (edge/litertlm.py: litert-lm-builder's sections) the LiteRT-LM engine runs. No start token:
    the engine then tokenizes a prompt as tokenizer.json does (with its own BOS, if it adds one), as our loop
    and transformers do."""
    from tpu_export.edge.litertlm import write_litertlm

    return write_litertlm(path, tflite, tokenizer_json=src.require_tokenizer("the .litertlm bundle").encode(),
                          stop_token_ids=list(src.stop_token_ids), max_num_tokens=spec.cache_len, cache_spec=spec,
                          prompt_template=src.chat_template)


def _bundle_refusal(src: LmSource, spec) -> str | None:
    """Why the edge targets write no .litertlm for this model (its state has no place in the engine), or None."""
    from tpu_export.converter.llm_errors import family_of
    from tpu_export.edge.litertlm import engine_state_refusal

    model = src.model
    return engine_state_refusal(spec, family_of(model) if getattr(model, "config", None) is not None else src.name)


def litertlm_files(d: str, tflite, src: LmSource, spec, no_bundle: str | None, say) -> dict:
    """{"model.litertlm": path} written into ``d``, or {} when ``no_bundle`` says why none is (said here)."""
    if no_bundle is not None:
        say(no_bundle)
        return {}
    return {"model.litertlm": write_litertlm_bundle(os.path.join(d, "model.litertlm"), tflite, src, spec)}


def _write_edge(held, src, spec, t, opts, d, stages, last: bool, no_bundle: str | None = None) -> dict:
    from .lm_stream import write_edge_lm_streamed

    # a large model: never bytes in memory
    streamed = write_edge_lm_streamed(held["prog"], src, spec, t, opts, d, stages, no_bundle=no_bundle)
    if streamed is not None:
        return streamed

    def release():
        src.model = None  # our LmSource's reference (a model object passed in stays the caller's)
        gc.collect()  # the captured graphs and the model hold reference cycles

    tflite = _edge_lm_bytes(held, t, opts, stages, release if last else None)
    with stages("write", "model.tflite" + (" and model.litertlm" if no_bundle is None else "")):
        return {"model.tflite": write_file(os.path.join(d, "model.tflite"), tflite),
                **litertlm_files(d, tflite, src, spec, no_bundle, stages.say)}


_TPU_STAGES = (("AOT-compiling", "compile"), ("lowering", "lower"), ("writing ", "write"))
# converter.progress.heartbeat's lines while a step runs ("what: 12 s") and when it ends
_HEARTBEAT = re.compile(r": \d+ s$")
_HEARTBEAT_END = re.compile(r": (done in|failed after) [\d.]+ s$")


def _write_tpu(prog, spec, t, opts, d, stages) -> tuple[dict, object]:
    """targets.tpu.write_tpu_artifact through tpu_backend.llm.export_lm (caches donated, stored bf16 under
    dtype=bfloat16; the compiled report gets its ``llm`` section), its progress messages mapped onto the lower /
    compile / write stages. Returns ({file: path}, the artifact's CacheSpec)."""
    from tpu_export.tpu_backend.llm import export_lm

    from .tpu import write_tpu_artifact

    exported_spec = []

    def export(prog, **kw):
        bundle, tspec = export_lm(prog, spec, **kw)
        exported_spec.append(tspec)
        return bundle

    path = os.path.join(d, "model.tpuexp")
    open_stage = []  # [(key, the stage's context manager)]

    def close():
        if open_stage:
            open_stage.pop()[1].__exit__(None, None, None)

    def say(msg):
        if _HEARTBEAT_END.search(msg):  # the step's own "done in": the stage's line says it
            close()
            return
        if _HEARTBEAT.search(msg) and open_stage:  # still running: "compile: 12 s"
            stages.say(f"{open_stage[-1][0]}: {msg.rsplit(': ', 1)[-1]}")
            return
        body = msg.split(": ", 1)[-1]
        key = next((k for word, k in _TPU_STAGES if body.startswith(word)), None)
        if key is None:  # a note ("aot off: writing StableHLO only ...") inside the current stage
            stages.say(body)
            return
        close()
        cm = stages(key, body)
        cm.__enter__()
        open_stage.append((key, cm))

    try:
        write_tpu_artifact(prog, t, opts, path, say, export=export)
    finally:
        close()
    return {"model.tpuexp": path}, exported_spec[0]


def _resolve(targets, quantize) -> tuple[list, list]:
    """[Target], [checked options]; every name and option is checked before any work."""
    from .options import options_for, split_shared

    if isinstance(targets, str):
        targets = [targets]
    own = dict(targets) if isinstance(targets, dict) else {}
    names = list(targets)
    if not names:
        raise ValueError("targets is empty; name at least one (see `tpu-export targets`)")
    resolved = [get_target(n) for n in names]
    seen = [t.name for t in resolved]
    twice = sorted({n for n in seen if seen.count(n) > 1})
    if twice:
        raise ValueError(f"target(s) {', '.join(twice)} named twice; name each target once")
    shared = {"quant_config": quantize} if quantize is not None else {}
    opts = []
    for t, name, common in zip(resolved, names, split_shared(resolved, shared)):
        if isinstance(t, IotTarget):
            raise ValueError("target 'iot' (TFLite Micro) cannot hold an LLM with its KV cache; LLM targets: "
                             "android, ios, web, cpu and the TPU/XLA targets")
        mine = {**common, **(own.get(name) or {})}
        if t.backend == "edge" and mine.get("quant_config") is not None:
            from tpu_export.edge.quantize import as_quant_config

            q = as_quant_config(mine["quant_config"])
            if q is not None and q.needs_calibration:
                raise ValueError(f"target {t.name!r}: static int8 of an LLM (calibrating prefill and decode) is "
                                 "not supported; use dynamic_int8, weight_only_int8, weight_only_int4, "
                                 "dynamic_int4_block32 or fp16")
        opts.append(options_for(t, mine))
    return resolved, opts


def _check_out_dir(out_dir: str) -> None:
    """out_dir is replaced whole: only a missing or empty folder, or one this function wrote, may be."""
    if not os.path.lexists(out_dir):
        return
    if not os.path.isdir(out_dir) or os.path.islink(out_dir):
        raise ValueError(f"out_dir {out_dir} exists and is not a directory; choose another")
    if not os.listdir(out_dir):
        return
    try:
        with open(os.path.join(out_dir, "summary.json"), "rb") as f:
            if json.loads(f.read(16 << 20)).get("kind") == _KIND:
                return
    except (OSError, ValueError, AttributeError):
        pass
    raise ValueError(f"refusing to replace {out_dir}: it is not empty and was not written by convert-lm (no "
                     f"summary.json of kind {_KIND!r}); choose another out_dir or remove it")
