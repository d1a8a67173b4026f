"""``tpu-export inspect model.litertlm``: what the LiteRT-LM engine will read from a bundle
(edge.litertlm.read_litertlm) and the signatures of its .tflite, in a few lines."""

from __future__ import annotations

import mmap
import os

from tpu_export.converter.untrusted import open_regular

__all__ = ["describe_litertlm"]


def describe_litertlm(path) -> str:
    from tpu_export.edge.litertlm import read_litertlm

    path = os.fspath(path)
    info = read_litertlm(path)
    lines = [f"{path}: LiteRT-LM bundle {info['version']}, {os.path.getsize(path)} bytes"]
    for sec in info["sections"]:
        size = sec["end"] - sec["begin"]
        meta, what = sec.get("metadata", {}), []
        if "max_num_tokens" in meta or "stop_tokens" in meta:
            stops = [s.get("token_ids", {}).get("ids") for s in meta.get("stop_tokens", [])]
            template = meta.get("jinja_prompt_template")
            what = [f"max_num_tokens {meta.get('max_num_tokens')}", f"stop tokens {stops}",
                    f"model type {next(iter(meta.get('llm_model_type', {})), 'unset')}",
                    f"chat template {len(template)} chars" if template else "no chat template"]
            if meta.get("start_token"):
                what.append(f"start token {meta['start_token'].get('token_ids', {}).get('ids')}")
        elif "llm_executor_metadata" in meta:
            bufs = meta["llm_executor_metadata"].get("state_buffers", [])
            axes = sorted({b.get("sequence_axis") for b in bufs})
            what = [f"{len(bufs)} cache buffers ({bufs[0]['prefill_input_name']} ... {bufs[-1]['prefill_input_name']})"
                    if bufs else "no cache buffers", f"sequence axis {axes}",
                    f"max history {meta['llm_executor_metadata'].get('max_history_size')}"]
        elif sec["type"] == "TFLiteModel":
            what = [f"{k} {v}" for k, v in sec["items"].items()] + _signatures(path, sec["begin"], sec["end"])
        lines.append(f"  {sec['type']:24s} {size:>12d} B  {'; '.join(what)}")
    return "\n".join(lines)


def _signatures(path: str, begin: int, end: int) -> list[str]:
    from .tflite_io import signatures

    # a view of the section, not a copy of it: a bundle past 2 GB holds a model section as large
    fd, _ = open_regular(path, what="the bundle")
    with os.fdopen(fd, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm, memoryview(mm) as whole:
        with whole[begin:end] as section:
            sigs = signatures(section)
    out = []
    for name in sorted(sigs):
        ins = sigs[name][0]
        tokens = next((i for i in ins if i.name == "tokens"), None)
        out.append(f"{name} (tokens {list(tokens.shape) if tokens else '?'}, {len(ins) - 2} cache inputs)")
    return out
