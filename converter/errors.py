"""Errors raised by the shared pipeline. Every message names the cause and the fix."""

from __future__ import annotations

__all__ = [
    "ConversionError",
    "ExportFailedError",
    "UnsupportedOpsError",
    "DtypePolicyError",
    "UnsupportedOutputError",
    "UnsupportedModelError",
    "source_line",
    "one_line",
]


class ConversionError(Exception):
    """Base class: a model could not be converted. The message says why and what to do."""


class ExportFailedError(ConversionError):
    """torch.export rejected the model."""


class DtypePolicyError(ConversionError):
    """A value cannot be narrowed to 32 bits without changing the result."""


class UnsupportedOutputError(ConversionError):
    """The model returns something that is not a tensor (or a pytree of tensors)."""


class UnsupportedModelError(ConversionError, NotImplementedError):
    """The model uses a feature the export does not implement (named in the message): refused, never dropped.
    Raised from inside the traced forward, and passed through the capture as it is."""


def one_line(e: BaseException, limit: int = 300) -> str:
    """An exception's text on one line (whitespace runs collapsed), cut at ``limit`` characters: what our
    one-line errors quote of a library's multi-line message."""
    return " ".join(str(e).split())[:limit]


def source_line(node) -> str:
    """The user's source line for an fx node, from the stack trace torch.export recorded.

    The trace lists frames outermost first; the last frame outside torch itself is the line
    the user wrote (``File "model.py", line 12, in forward``) and the code on it.
    """
    trace = node.meta.get("stack_trace") or ""
    lines = [ln.strip() for ln in trace.strip().splitlines() if ln.strip()]
    best = None
    for i, ln in enumerate(lines):
        if ln.startswith("File ") and "/torch/" not in ln and "\\torch\\" not in ln:
            code = lines[i + 1] if i + 1 < len(lines) and not lines[i + 1].startswith("File ") else ""
            best = f"{ln}: {code}" if code else ln
    if best is None and lines:
        best = lines[-1]
    return best or "<unknown source line>"


# op name -> how to get past it, printed under the op when a backend refuses it
OP_HINTS: dict[str, str] = {
    "torchvision.nms.default": "LiteRT lowers it for float32 boxes of a static, non-zero count; the TPU needs a "
                               "static output length: call tpu_export.converter.nms_padded or batched_nms_padded "
                               "(a static max_output_size and a valid mask) instead",
    "torchvision.roi_align.default": "roi_align is lowered for a positive sampling_ratio on float32 inputs; "
                                     "pass sampling_ratio > 0 (torchvision's detection models use 2)",
    # transformers' default mixture-of-experts dispatch sorts tokens by expert: data-dependent shapes
    "transformers.grouped_mm_fallback.default": "call model.set_experts_implementation('batched_mm') before "
                                                "converting (transformers' static-shape expert dispatch, the same "
                                                "numbers)",
}


class UnsupportedOpsError(ConversionError):
    """One or more ops have no lowering on the chosen backend. Lists all of them at once."""

    def __init__(self, backend: str, missing: dict[str, list[str]]):
        # missing: op name -> list of source lines (one per node)
        self.backend = backend
        self.missing = missing
        parts = [f"{len(missing)} op(s) cannot be lowered by the {backend} backend (nothing was written):"]
        for op, where in sorted(missing.items()):
            parts.append(f"  {op}  x{len(where)}")
            if op in OP_HINTS:
                parts.append(f"      fix: {OP_HINTS[op]}")
            for src in sorted(set(where))[:5]:
                parts.append(f"      at {src}")
        parts.append(
            "Fix: rewrite those lines with supported ops (see `tpu-export ops`), "
            "or pick a target whose backend lowers them."
        )
        super().__init__("\n".join(parts))
