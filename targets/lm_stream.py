"""convert-lm for a large LLM. A model directory past ``STREAM_LM_FROM`` float32 bytes is loaded with its parameters
mapped from its safetensors shards, or in a file-backed spool (``load_lazily``: one tensor in memory at a time, a bf16
directory never float32 in memory).
Its edge targets: the .tflite lowered once, its weights quantized tensor by tensor
(edge/quantize_stream.py: ai-edge-quantizer's bytes and scales) and streamed into ``model.tflite`` (the large-model
form past 2 GiB), and the ``.litertlm`` bundled from that file, so neither the float nor the quantized model is
ever one bytes object in memory. Past ``STREAM_LM_FROM`` bytes of weights, for a float model or a scheme in
``STREAM_SCHEMES`` on a target whose package is the file alone (android, ios, cpu); everything else keeps
targets.lm's in-memory path (ai-edge-quantizer on the whole flatbuffer)."""

from __future__ import annotations

import math
import os

__all__ = ["STREAM_LM_FROM", "load_lazily", "streamed_scheme", "write_edge_lm_streamed"]

# The in-memory path holds the float flatbuffer, the quantizer's copies and the bundle's; past 1 GiB of weights
# streaming is the one that fits (a 2 GiB flatbuffer cannot be built in memory at all).
STREAM_LM_FROM = 1 << 30


def load_lazily(path: str, dtype=None, *, config=None, checkpoint=None):
    """The directory's causal LM with its parameters in a file-backed spool, read one tensor at a time (cast to
    ``dtype`` as read: a bf16 directory never has a float32 copy in memory), or None under ``STREAM_LM_FROM`` bytes
    in ``dtype`` (a small model loads as before) or when the checkpoint's names or shapes are not the parameters' (a
    checkpoint transformers converts as it loads). Built from config.json with the parameters on the meta device and the
    buffers computed on the CPU (converter.lazy_weights.params_on_meta), then pointed at a private map of the shards
    (map_safetensors: a checkpoint stored in ``dtype`` is not copied) or filled by materialize from safetensors_loader
    (another dtype, cast as read); the conversion pages the weights in as it reads them and gives the pages back.
    ``dtype``: the parameters' (default float32, what convert-lm converts; bench/large.py keeps a bf16 directory
    bf16 for the TPU artifact). ``config``, ``checkpoint``: the directory already read and checked (targets/lm_dir.py);
    without them it is read here by the same rule."""
    import torch
    import transformers

    from tpu_export.converter.lazy_weights import materialize, params_on_meta
    from tpu_export.converter.safetensors_weights import map_safetensors, read_checkpoint, safetensors_loader

    dtype = torch.float32 if dtype is None else dtype
    ckpt = checkpoint if checkpoint is not None else read_checkpoint(path)
    try:
        shapes = {k: e.shape for k, e in ckpt.tensors.items()}
        if dtype.itemsize * sum(math.prod(s) for s in shapes.values()) <= STREAM_LM_FROM:
            return None
        if config is None:
            from .lm_dir import hf_config

            config = hf_config(ckpt.folder.read_json("config.json"), ckpt.folder.shown("config.json"))
        with params_on_meta():
            model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype, trust_remote_code=False)
        model.eval()
        if any(shapes.get(name) != tuple(p.shape) for name, p in model.named_parameters()):
            # checkpoint keys transformers renames or fuses as it loads (Mixtral's experts): its own loader, whole
            return None
        # a checkpoint stored in the parameters' dtype is mapped where it lies (no copy); another dtype is cast into
        # a spool as it is read
        mapped = map_safetensors(model, path, ckpt)
        if mapped is None:
            loader = safetensors_loader(path, ckpt)  # the index and headers read once
            try:
                mapped = materialize(model, loader)
            finally:
                loader.close()
        model.tpu_export_spool = mapped[1]  # alive as long as the model: drop_pages finds it by a weak reference
        return model
    finally:
        if checkpoint is None:
            ckpt.close()


def streamed_scheme(prog, target, opts) -> tuple[bool, str | None]:
    """(whether this target's .tflite is streamed, the scheme quantized while streaming or None for float)."""
    from tpu_export.edge.quantize_stream import STREAM_SCHEMES

    from .quantize import resolve_quant
    from .registry import EdgeTarget

    kind = type(target)
    plain = all(getattr(kind, h) is getattr(EdgeTarget, h) for h in ("finish", "package_files", "check_io"))
    quant = resolve_quant(target, opts.quant_config, None)
    weights = sum(w.numel() * w.element_size() for w in prog.weights.values())
    if not plain or weights <= STREAM_LM_FROM:
        return False, None
    if quant is None:
        return True, None
    return (quant.recipe is None and quant.scheme in STREAM_SCHEMES), quant.scheme


def write_edge_lm_streamed(prog, src, spec, target, opts, d: str, stages, no_bundle: str | None = None) -> dict | None:
    """{file: path} of ``model.tflite`` and ``model.litertlm`` written into ``d`` (no .litertlm when
    ``no_bundle`` says why), or None when this target keeps the in-memory path (see the module docstring)."""
    from tpu_export.converter.gc_pause import gc_paused

    streams, scheme = streamed_scheme(prog, target, opts)
    if not streams:
        return None
    # the collector paused as for the capture: the lowering's hundreds of thousands of schema objects made its full
    # collections ~6% of the 0.84 B Llama's convert-lm; nothing here waits on a collection to free memory
    with gc_paused():
        return _write_streamed(prog, src, spec, target, opts, d, stages, scheme, no_bundle)


def _write_streamed(prog, src, spec, target, opts, d: str, stages, scheme, no_bundle) -> dict:
    from tpu_export.edge.convert import lower_program, write_model
    from tpu_export.edge.tflite_check import map_tflite

    from .checks import check_for_target
    from .lm import litertlm_files

    with stages("lower", "LiteRT flatbuffer (prefill and decode subgraphs, one copy of the weights; streamed)"):
        model = lower_program(prog, spill=True, spill_folder=d)
    if scheme is not None:
        from tpu_export.edge.quantize_stream import quantize_weights

        with stages("quantize", f"{scheme} tensor by tensor (ai-edge-quantizer's bytes and scales)"):
            quantize_weights(model, scheme)
    path = os.path.join(d, "model.tflite")
    with stages("write", "model.tflite (weights streamed) and model.litertlm"):
        write_model(model, path, progress=stages.say)
        del model
        data = map_tflite(path, check=True)
        try:
            check_for_target(data, target, strict=opts.strict_ops, say=stages.say)
        finally:
            data.close()
        return {"model.tflite": path, **litertlm_files(d, path, src, spec, no_bundle, stages.say)}
