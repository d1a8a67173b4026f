"""The one-line refusals of the LLM export, in the words of the model's author: the family (config.model_type),
its class, the layer or feature, and what exports instead. A failure inside transformers' modeling code while
the export traces it names the family, the modeling class and its source line (the innermost frame under
transformers/models/), never our wrapper's classes; the original exception stays chained as ``__cause__``.
"""

from __future__ import annotations

import os

from .errors import UnsupportedModelError, one_line

__all__ = ["FAMILIES_DOC", "LAYER_KINDS", "capture_failure", "family_of", "unsupported_layer_types"]

FAMILIES_DOC = "docs/llm.md#families"

# What a user calls the layer types transformers' configs name, for the refusal message.
LAYER_KINDS = {
    "conv": "short convolutions, whose state is a window of inputs, not a KV cache",
    "linear_attention": "linear attention, whose state is recurrent, not a KV cache",
    "mamba": "Mamba state-space mixers, whose state is recurrent, not a KV cache",
    "chunked_attention": "chunked local attention",
    "hybrid": "attention beside a state-space mixer, whose state is recurrent",
}


def family_of(model_or_config) -> str:
    """'llama (LlamaForCausalLM)': the config's model_type and the model's class (or the config's)."""
    cfg = getattr(model_or_config, "config", model_or_config)
    kind = getattr(cfg, "model_type", None) or type(cfg).__name__
    archs = getattr(cfg, "architectures", None) or [None]
    cls = type(model_or_config).__name__ if hasattr(model_or_config, "config") else archs[0]
    return f"{kind} ({cls})" if cls else str(kind)


def unsupported_layer_types(cfg, odd, supported, elsewhere=None) -> UnsupportedModelError:
    """``cfg.layer_types`` holds types the export has no form for in this family. ``elsewhere``: {layer type:
    the families whose layers of that type export (their own modeling classes)}."""
    what = ", ".join(f"'{t}'" + (f" ({LAYER_KINDS[t]})" if t in LAYER_KINDS else "") for t in odd)
    others = [f"{' and '.join(sorted(elsewhere[t]))}'s '{t}' layers" for t in odd if (elsewhere or {}).get(t)]
    also = f", and so do {', '.join(others)}" if others else ""
    return UnsupportedModelError(
        f"{family_of(cfg)}: its {what} layers have no export yet; models whose layers are all "
        f"{' or '.join(repr(s) for s in supported)} export{also} (the families listed in {FAMILIES_DOC})")


def _root(exc: BaseException) -> BaseException:
    """The innermost exception of the chain that still has a frame in transformers' modeling code (else the
    innermost one): the error the family's code raised, under torch.export's own wrapping."""
    chain, seen, x = [], set(), exc
    while x is not None and id(x) not in seen:
        seen.add(id(x))
        chain.append(x)
        x = x.__cause__ or x.__context__
    for x in reversed(chain):
        if _modeling_frame(x) is not None:
            return x
    return chain[-1]


def _modeling_frame(exc):
    """(class.function, 'transformers/models/<family>/modeling_x.py:<line>') of the innermost frame of ``exc``'s
    traceback in transformers' modeling code, else None."""
    tb, found = exc.__traceback__, None
    while tb is not None:
        path = tb.tb_frame.f_code.co_filename.replace(os.sep, "/")
        if "/transformers/models/" in path:
            me = tb.tb_frame.f_locals.get("self")
            fn = tb.tb_frame.f_code.co_name
            where = "transformers/models/" + path.rsplit("/transformers/models/", 1)[1]
            found = (f"{type(me).__name__}.{fn}" if me is not None else fn, f"{where}:{tb.tb_lineno}")
        tb = tb.tb_next
    return found


# the export's own wrapper classes, as a transformers message may name them: in the user's words instead
_OURS = {"_StateLayer": "the export's cache layer", "_CachesOnly": "the export", "KVCacheLM": "the export"}


def _scrub(text: str) -> str:
    for ours, said in _OURS.items():
        text = text.replace(ours, said)
    return text


def capture_failure(exc: BaseException, model) -> UnsupportedModelError:
    """The refusal for a family whose modeling code fails while the KV-cache export traces it."""
    root = _root(exc)
    frame = _modeling_frame(root)
    at = f" in {frame[0]} ({frame[1]})" if frame else ""
    said = _scrub(one_line(root, 240)).rstrip(" .") or type(root).__name__
    return UnsupportedModelError(
        f"{family_of(model)} does not export yet: its modeling code fails under the KV-cache export{at}: "
        f"{type(root).__name__}: {said}; the families that export are listed in {FAMILIES_DOC}")
