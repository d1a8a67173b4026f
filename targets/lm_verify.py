"""convert-lm's check of what it wrote, before it publishes: never silently wrong.

Each written artifact runs its first step on the export's sample prompt with the runtime ``tpu-export generate``
uses (tpu_export.generate.prompt_logits: the ``.tflite`` in the LiteRT interpreter, the TPU artifact on PJRT):
``prefill_<L>`` of all tokens but the last, then ``decode`` of the last, whose logits depend on every cache row the
prefill wrote. They are compared with the source model's own forward on the same tokens: transformers' model in
eager (its "eager" attention, no cache), or a cache-protocol module's own forward from empty caches. A difference
past the target's bound refuses the conversion (LmSourceError, out_dir untouched); ``verify=False`` /
``--no-verify`` publishes anyway.

The sample prompt: ``min(prefill) + 1`` tokens (prefill_<L> is run full, with no padding), from the tokenizer's
encoding of a fixed text, else a fixed pattern; every id inside the model's vocabulary.
"""

from __future__ import annotations

import dataclasses

from .lm_source import LmSourceError

__all__ = ["BOUNDS", "Reference", "bound_for", "reference_logits", "sample_tokens", "verify_artifact"]

SAMPLE_TEXT = "The quick brown fox jumps over the lazy dog; the cache holds keys and values. 0123456789 "

# Largest rel err (converter.numerics.rel_err of the [vocab] logits) each scheme may show. float32 is the
# project's bound. The others are set from the tests.llm_models families (llama, llama3_rope, qwen2, qwen3, phi3,
# gemma3, mixtral; random weights, 2 layers, prefill_8 + decode) at about 3x the worst measured rel err, so that
# a broken lowering (rel err ~1, see tests/test_lm_verify.py) is still far outside:
#   fp16 (edge)                 worst 6.0e-4 (gemma3)
#   bfloat16 (TPU dtype)        worst 1.1e-2 (gemma3)
#   weight_only_int8 (edge/TPU) worst 1.6e-2 / 1.6e-2
#   dynamic_int8 (edge)         worst 3.4e-2
#   weight_only_int4 (edge)     worst 2.1e-1
#   dynamic_int4_block32 (edge) worst 2.2e-1
# Random tiny models have near-flat logits, so the int4 schemes' argmax moves on some families; the greedy
# next token is required only where the scheme keeps it on every family (NEXT_TOKEN below).
BOUNDS = {"float32": 1e-4, "fp16": 2e-3, "bfloat16": 3e-2, "weight_only_int8": 5e-2, "int8": 5e-2,
          "dynamic_int8": 0.1, "weight_only_int4": 0.6, "dynamic_int4_block32": 0.6}
NEXT_TOKEN = frozenset({"fp16", "bfloat16", "weight_only_int8", "int8", "dynamic_int8"})


@dataclasses.dataclass
class Reference:
    tokens: list  # the sample prompt's ids
    logits: object  # torch float32 [vocab]: the source's own logits at the last position
    what: str  # "transformers" or "the module's eager forward", for messages
    prefill: int  # L of the prefill_<L> the artifact runs


def sample_tokens(src, vocab: int, n: int) -> list[int]:
    """``n`` deterministic ids in [0, vocab): the tokenizer's ids of SAMPLE_TEXT, repeated as needed; without a
    tokenizer (or with one whose ids fall outside the model's vocabulary) a fixed stride over the vocabulary."""
    ids = []
    if src.tokenizer_json is not None:
        from tokenizers import Tokenizer

        ids = [i for i in Tokenizer.from_str(src.tokenizer_json).encode(SAMPLE_TEXT).ids if 0 <= i < vocab]
    if not ids:
        ids = [(3 + 7 * i) % vocab for i in range(min(n, vocab))]
    return [ids[i % len(ids)] for i in range(n)]


def _vocab(src, prog) -> int | None:
    emb = getattr(src.model, "get_input_embeddings", None)
    if emb is not None and not src.protocol:
        return int(emb().weight.shape[0])
    out = next((o for o in prog.signatures["decode"].outputs if o.name == "logits"), None)
    return int(out.shape[-1]) if out is not None and isinstance(out.shape[-1], int) else None


def reference_logits(src, prog, spec, prefill_lengths) -> "Reference | str":
    """The source's own last-position logits on the sample prompt, or the reason there is none (recorded)."""
    import torch

    L = min(int(n) for n in prefill_lengths)
    n = min(L + 1, spec.cache_len)
    vocab = _vocab(src, prog)
    if vocab is None:
        return "the decode signature's logits have no static vocabulary size"
    tokens = sample_tokens(src, vocab, n)
    model = src.model
    with torch.no_grad():
        if src.protocol:
            if type(model).forward is torch.nn.Module.forward:
                return "the cache-protocol module has no forward of its own to compare with"
            t = torch.tensor([tokens] * spec.batch, dtype=torch.int32)
            try:
                out = model(t, torch.arange(n, dtype=torch.int32), **spec.zeros())
            except Exception as e:  # noqa: BLE001 - a user module's own failure: recorded, not fatal
                from tpu_export.converter.errors import one_line

                return f"the cache-protocol module's eager forward failed on {n} tokens ({one_line(e)})"
            return Reference(tokens, torch.as_tensor(out["logits"])[0, -1].float(), "the module's eager forward", L)
        cfg = model.config
        saved = cfg._attn_implementation
        cfg._attn_implementation = "eager"  # transformers' own attention, not the export's (converter.llm)
        try:
            logits = model(input_ids=torch.tensor([tokens]), use_cache=False).logits[0, -1].float()
        finally:
            cfg._attn_implementation = saved
    return Reference(tokens, logits, "transformers", L)


def bound_for(target, opts, source_dtype=None) -> tuple[str, float]:
    """(scheme, bound) of a target's artifact: its quantization scheme, bf16 compute, or float32. A float32
    target whose matmuls take fewer passes (precision "high"/"default": bf16 on a TPU) gets the bf16 bound, as
    does any target of a source whose weights are not float32 (the artifact computes in them)."""
    scheme = "float32"
    if target.backend == "edge":
        from .quantize import resolve_quant

        q = resolve_quant(target, opts.quant_config, None)
        scheme = q.scheme if q is not None else scheme
    else:
        kw = opts.export_kwargs(target)
        if kw.get("quant") is not None:
            scheme = str(kw["quant"])
        elif kw.get("dtype") == "bfloat16" or kw.get("precision", "highest") != "highest":
            scheme = "bfloat16"
    if scheme == "float32" and source_dtype is not None and str(source_dtype) != "torch.float32":
        scheme = "bfloat16"
    return scheme, BOUNDS.get(scheme, max(BOUNDS.values()))


def verify_artifact(ref: Reference, path: str, spec, target_name: str, scheme: str, bound: float) -> dict:
    """Runs the artifact at ``path`` on the reference's tokens and compares; the summary record, or
    LmSourceError (one line) when the logits are past ``bound`` or the greedy next token differs."""
    import torch

    from tpu_export.converter.numerics import rel_err
    from tpu_export.generate import prompt_logits
    from tpu_export.generators import open_runtime

    runtime, _, _ = open_runtime(path, spec)
    got = prompt_logits(runtime, spec, ref.tokens).float()
    err = rel_err(got, ref.logits)
    sig = f"prefill_{ref.prefill}+decode"
    record = {"signature": sig, "rel_err": float(f"{err:.3g}"), "bound": bound, "tokens": len(ref.tokens),
              "scheme": scheme, "reference": ref.what}
    fix = ("report it (model, targets, options), or pass --no-verify / verify=False to publish anyway")
    if not err <= bound:
        raise LmSourceError(f"verify: target {target_name!r} signature {sig}: logits differ from {ref.what} by "
                            f"rel err {err:.3g} > bound {bound:g} ({scheme}) on {len(ref.tokens)} sample tokens; "
                            f"nothing was published: {fix}")
    if scheme in NEXT_TOKEN:
        want, have = int(torch.argmax(ref.logits)), int(torch.argmax(got))
        record["next_token"] = have
        if want != have:
            raise LmSourceError(f"verify: target {target_name!r} signature {sig}: greedy next token {have} != "
                                f"{ref.what}'s {want} (rel err {err:.3g}, bound {bound:g}, {scheme}); nothing was "
                                f"published: {fix}")
    return record
