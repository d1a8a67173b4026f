"""convert-lm's edge targets for a large LLM: the .tflite lowered once, its weights quantized tensor by tensor
(edge/quantize_stream.py: ai-edge-quantizer's bytes and scales) and streamed into ``model.tflite`` (the large-model
form past 2 GiB), and the ``.litertlm`` bundled from that file, so neither the float nor the quantized model is
ever one bytes object in memory. Past ``STREAM_LM_FROM`` bytes of weights, for a float model or a scheme in
``STREAM_SCHEMES`` on a target whose package is the file alone (android, ios, cpu); everything else keeps
targets.lm's in-memory path (ai-edge-quantizer on the whole flatbuffer)."""

from __future__ import annotations

import os

__all__ = ["STREAM_LM_FROM", "streamed_scheme", "write_edge_lm_streamed"]

# The in-memory path holds the float flatbuffer, the quantizer's copies and the bundle's; past 1 GiB of weights
# streaming is the one that fits (a 2 GiB flatbuffer cannot be built in memory at all).
STREAM_LM_FROM = 1 << 30


def streamed_scheme(prog, target, opts) -> tuple[bool, str | None]:
    """(whether this target's .tflite is streamed, the scheme quantized while streaming or None for float)."""
    from edge.quantize_stream import STREAM_SCHEMES

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


def write_edge_lm_streamed(prog, src, spec, target, opts, d: str, stages) -> dict | None:
    """{file: path} of ``model.tflite`` and ``model.litertlm`` written into ``d``, or None when this target keeps
    the in-memory path (see the module docstring)."""
    from edge.convert import lower_program, write_model
    from edge.tflite_check import map_tflite

    from .compat import compatibility
    from .lm import write_litertlm_bundle

    streams, scheme = streamed_scheme(prog, target, opts)
    if not streams:
        return None
    with stages("lower", "LiteRT flatbuffer (prefill and decode subgraphs, one copy of the weights; streamed)"):
        model = lower_program(prog, spill=True, spill_folder=d)
    if scheme is not None:
        from edge.quantize_stream import quantize_weights

        with stages("quantize", f"{scheme} tensor by tensor (ai-edge-quantizer's bytes and scales)"):
            quantize_weights(model, scheme)
    path = os.path.join(d, "model.tflite")
    with stages("write", "model.tflite (weights streamed) and model.litertlm"):
        write_model(model, path, progress=stages.say)
        del model
        data = map_tflite(path, check=True)
        try:
            reports = [compatibility(data, target, delegate=dl) for dl in target.delegates]
        finally:
            data.close()
        for r in reports:
            stages.say(r.summary())
            if opts.strict_ops:
                r.raise_if_fallback()
        return {"model.tflite": path, "model.litertlm": write_litertlm_bundle(os.path.join(d, "model.litertlm"), path,
                                                                                src, spec)}
