"""convert-lm's check of what it wrote, before it publishes: never silently wrong.

Each written artifact runs its first step on the export's sample prompt with the runtime ``tpu-export generate``
uses (targets.lm_runtime: the ``.tflite`` in the LiteRT interpreter, the TPU artifact on PJRT):
``prefill_<L>`` of all tokens but the last, then ``decode`` of the last, whose logits depend on every cache row the
prefill wrote. They are compared with the source model's own forward on the same tokens: transformers' model in
eager (its "eager" attention, no cache), or a cache-protocol module's own forward from empty caches. A difference
past the target's bound refuses the conversion (LmSourceError, out_dir untouched); ``verify=False`` /
``--no-verify`` publishes anyway.

The sample prompt: ``min(prefill) + 1`` tokens (prefill_<L> is run full, with no padding), seeded random ids of
the model's vocabulary.
"""

from __future__ import annotations

import dataclasses

from .lm_source import LmSourceError

__all__ = ["BOUNDS", "Reference", "bound_for", "reference_logits", "sample_tokens", "verify_artifact"]

# Largest rel err (converter.numerics.rel_err of the [vocab] logits) each scheme may show. float32 is the
# project's bound (measured: at most 4.4e-7 on the edge, 4.1e-7 on PJRT CPU). The others are set from the
# tests.llm_models families (llama, llama3_rope, qwen2, qwen3, phi3, gemma3, mixtral; random weights, 2 layers,
# prefill_8 + decode) at 2-4x the worst rel err measured there, so that a broken lowering (one weight negated:
# tests/test_lm_verify.py) stays far outside:
#   fp16 (edge)                 worst 4.9e-4 (qwen3)
#   bfloat16 (TPU dtype)        worst 8.3e-3 (gemma3)
#   weight_only_int8 (edge/TPU) worst 1.6e-2 (gemma3, both)
#   dynamic_int8 (edge)         worst 2.0e-2 (qwen3)
#   weight_only_int4 (edge)     worst 0.25 (gemma3)
#   dynamic_int4_block32 (edge) worst 0.28 (phi3)
# Random tiny models have near-flat logits: the int4 schemes moved the greedy next token on gemma3
# (weight_only_int4) and qwen3 (dynamic_int4_block32), every other scheme kept it on every family, so the same
# greedy next token is required of those (NEXT_TOKEN) and the int4 schemes are held to their rel err alone.
BOUNDS = {"float32": 1e-4, "fp16": 2e-3, "bfloat16": 3e-2, "weight_only_int8": 5e-2, "dynamic_int8": 6e-2,
          "weight_only_int4": 0.6, "dynamic_int4_block32": 0.6}
NEXT_TOKEN = frozenset({"fp16", "bfloat16", "weight_only_int8", "dynamic_int8"})


@dataclasses.dataclass
class Reference:
    tokens: list  # the sample prompt's ids
    logits: object  # torch float32 [vocab]: the source's own logits at the last position
    what: str  # "transformers" or "the module's eager forward", for messages
    prefill: int  # L of the prefill_<L> the artifact runs


def sample_tokens(vocab: int, n: int) -> list[int]:
    """``n`` ids drawn uniformly from [0, vocab) by a seeded generator: the same prompt on every run, spread over
    the whole vocabulary (every embedding row is as likely to be read as any other)."""
    import torch

    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(0)).tolist()


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
    tokens = sample_tokens(vocab, n)
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
            scheme = "weight_only_int8"  # the one TPU scheme (tpu_backend.quant.WeightOnlyInt8)
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

    from .lm_runtime import open_lm_runtime, prompt_step

    runtime, _, _ = open_lm_runtime(path, spec)
    got = torch.as_tensor(prompt_step(runtime, spec, ref.tokens, ref.prefill)["logits"])[0, 0].float()
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
