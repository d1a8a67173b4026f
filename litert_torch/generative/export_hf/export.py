"""``export`` with litert-torch 0.10's ``litert_torch.generative.export_hf`` argument names, over tpu-export's one
capture (targets/lm.py): a causal LM -> ``output_dir/model.litertlm`` for the LiteRT-LM engine.

    from tpu_export.litert_torch.generative import export_hf
    export_hf.export(model="path/to/hf_dir", output_dir="out", prefill_lengths=[32], cache_length=1024,
                     quantization_recipe="dynamic_wi8_afp32")

``model`` is a local model directory (nothing is downloaded) or, beyond the peer, a transformers model object
(``tokenizer=`` then gives its tokenizer). The peer's defaults apply where an argument is left out: prefill 128,
cache 4096, recipe ``dynamic_wi8_afp32``. Every other peer argument is refused by name with the reason when it
asks for something this export does not do (its default, or None, is accepted); an unknown name is a TypeError.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Sequence

if TYPE_CHECKING:
    import torch

__all__ = ["RECIPES", "export"]

# the peer's recipe names (ai_edge_quantizer.recipe functions) -> our edge schemes (edge/quantize.py)
RECIPES = {"dynamic_wi8_afp32": "dynamic_int8", "weight_only_wi8_afp32": "weight_only_int8",
           "weight_only_wi4_afp32": "weight_only_int4", "dynamic_int8": "dynamic_int8",
           "weight_only_int8": "weight_only_int8", "weight_only_int4": "weight_only_int4", "fp16": "fp16"}
_NO_QUANT = ("", "none", "null", "false")

_STATIC = "shapes are static: export the prefill lengths you need (prefill_lengths=[32, 128, ...])"
_COMPOSITE = "GPU composites (odml.*) are not emitted; the graph is LiteRT builtin ops"
_ONE_MODEL = "one prefill/decode model holds the embedder, RoPE and the cache as explicit state (converter/llm.py)"
_TEXT = "text generation only"
_NPU = "NPU ahead-of-time compilation is not done (TPU: `tpu-export convert-lm --target tpu-v6e`)"
_CALIB = "calibrated (static) quantization of an LLM is not supported; use a dynamic or weight-only recipe"
# peer argument -> (the value that asks for nothing, why anything else is refused)
_UNSUPPORTED = {
    "enable_dynamic_shape": (False, _STATIC), "enable_gpu_dynamic_prefill": (False, _STATIC),
    "enable_gpu_dynamic_cache": (False, _STATIC),
    "use_rope_composite": (False, _COMPOSITE), "use_swiglu_composite": (False, _COMPOSITE),
    "use_qkv_norm_rope_composite": (False, _COMPOSITE), "use_short_conv_composite": (False, _COMPOSITE),
    "use_sdpa_composite": (False, _COMPOSITE), "apply_gpu_composites": (False, _COMPOSITE),
    "use_bool_mask": (False, _COMPOSITE), "use_fused_sdpa_cache_update": (False, _COMPOSITE),
    "prefill_logits": (None, "prefill returns the logits of every position (the generation loop reads the last)"),
    "externalize_embedder": (False, _ONE_MODEL), "single_token_embedder": (False, _ONE_MODEL),
    "split_cache": (False, _ONE_MODEL), "cache_implementation": (None, _ONE_MODEL),
    "sliding_window_ring_buffer_size": (None, "the cache keeps every slot; the mask applies sliding windows"),
    "stateful_after": (-1, "the cache is explicit input/output state of every call"),
    "auto_model_override": (None, "the directory loads as AutoModelForCausalLM; pass a model object instead"),
    "experimental_use_mixed_precision": (False, "float32 compute; use quantization_recipe for smaller weights"),
    "experimental_use_fp16": (False, "float32 compute; quantization_recipe='fp16' stores float16 weights"),
    "export_vision_encoder": (None, _TEXT), "export_audio_encoder": (None, _TEXT),
    "vision_encoder_quantization_recipe": (None, _TEXT), "audio_encoder_quantization_recipe": (None, _TEXT),
    "input_sec": (None, _TEXT), "t2i_output_image_size": (None, _TEXT),
    "litert_lm_model_type_override": (None, "the bundle's model type is the generic one"),
    "litert_lm_llm_metadata_override": (None, "the LlmMetadata comes from the model directory"),
    "sampler_top_p": (None, "the bundle keeps the engine's sampler; set it per session (SamplerConfig)"),
    "sampler_temperature": (None, "the bundle keeps the engine's sampler; set it per session (SamplerConfig)"),
    "sampler_top_k": (None, "the bundle keeps the engine's sampler; set it per session (SamplerConfig)"),
    "aot_backend": (None, _NPU), "aot_soc_model": (None, _NPU), "aot_compilation_config_dict": (None, _NPU),
    "use_litert_lm_compiler": (False, _NPU), "compile_configs": (None, _NPU),
    "experimental_transpile_chat_template_for_minijinja": (False, "the chat template is bundled as written"),
    "calibration_dataset_dir": (None, _CALIB), "static_quantization_recipe": (None, _CALIB),
    "calibration_dataset_format": ("jsonl", _CALIB), "calibration_eval_task_names": ("ALL", _CALIB),
    "max_calibration_decode_steps": (32, _CALIB), "calibration_range_scale": (1.0, _CALIB),
    "use_float_input_output_normalizer": (False, _CALIB), "use_profiler_based_calibration": (True, _CALIB),
    "enable_min_max_calibration_update": (True, _CALIB), "ema_smoothing_factor": (0.1, _CALIB),
    "delete_in_memory_params": (False, "the weights are read once from safetensors; nothing to stream"),
}
# accepted and without effect here: a choice between the peer's own converters
_NO_EFFECT = ("use_v2", "experimental_lightweight_conversion")


def export(model: str | os.PathLike[str] | torch.nn.Module, output_dir: str | os.PathLike[str],
           task: str = "text_generation", keep_temporary_files: bool = False, trust_remote_code: bool = False,
           prefill_lengths: int | str | Sequence[int] | None = None, cache_length: int | None = None,
           cache_lengths: int | str | Sequence[int] | None = None, quantization_recipe: str | None = None,
           k_ts_idx: int | None = None, v_ts_idx: int | None = None, use_jinja_template: bool | None = None,
           bundle_litert_lm: bool | None = None, model_dtype: str | None = None, tokenizer: Any = None,
           allow_nonfinite_weights: bool = False, **kwargs: Any) -> str:
    """Export a causal LM to ``output_dir/model.litertlm`` for the LiteRT-LM engine, with litert-torch 0.10's
    ``export_hf`` argument names.

    The peer's defaults apply where an argument is left out: prefill length 128, cache 4096, recipe
    ``dynamic_wi8_afp32``. Every other litert-torch argument is accepted by name and refused, with the reason,
    when it asks for something this export does not do (its default, or None, is accepted); ``use_v2`` and
    ``experimental_lightweight_conversion`` are accepted and have no effect. The export is the one
    ``tpu_export.convert_lm`` runs for the ``android`` target.

    Args:
        model: A local Hugging Face model directory (nothing is downloaded) or, beyond the peer, a transformers
            causal LM object (then pass ``tokenizer``).
        output_dir: The folder to write into (created if missing).
        task: ``"text_generation"`` (the only task).
        keep_temporary_files: Also keep ``model.tflite`` beside the bundle.
        trust_remote_code: Must be False: a model's own Python code is never run.
        prefill_lengths: The prompt lengths to export a prefill signature for: an int, a list, or ``"32,128"``
            (default 128).
        cache_length: Slots of the KV cache, the bundle's max tokens (default 4096).
        cache_lengths: The peer's list of cache lengths: only ``cache_length`` itself is accepted.
        quantization_recipe: ``"dynamic_wi8_afp32"`` (default), ``"weight_only_wi8_afp32"``,
            ``"weight_only_wi4_afp32"``, ``"fp16"`` (or this project's scheme names), ``"none"`` for float32, or
            a ``QuantConfig`` of one of those schemes (``generative.quantize.quant_recipes.full_dynamic_recipe()``).
        k_ts_idx: The sequence axis of the K cache: 2 (or None).
        v_ts_idx: The sequence axis of the V cache: 2 (or None).
        use_jinja_template: False: leave the model's chat template out of the bundle.
        bundle_litert_lm: False: write only ``model.tflite``, no bundle.
        model_dtype: ``"float32"`` (or None): the export computes in float32.
        tokenizer: The tokenizer of a model object; a model directory brings its own.
        allow_nonfinite_weights: Beyond the peer: convert a model with NaN or infinite weights (with a warning)
            instead of refusing it.
        **kwargs: The peer's other arguments (see above).

    Returns:
        The path of the main file written: ``model.litertlm``, or ``model.tflite`` with
        ``bundle_litert_lm=False``.

    Raises:
        NotImplementedError: An argument asks for something this export does not do (the message names it and
            why).
        TypeError: An argument name the peer does not have either.
        FileNotFoundError: ``model`` is a path but not a local directory.
        tpu_export.targets.lm_source.LmSourceError: The model directory, object or tokenizer cannot be converted
            (a ValueError naming the fix).

    Examples:
        ``model_dir`` is a Hugging Face model directory (here a tiny seeded Llama):

        >>> import os, tempfile
        >>> from tpu_export.litert_torch.generative import export_hf
        >>> out = tempfile.mkdtemp()
        >>> path = export_hf.export(model=model_dir, output_dir=out, prefill_lengths=[8], cache_length=64,
        ...                         quantization_recipe="dynamic_wi8_afp32")
        >>> os.path.basename(path)
        'model.litertlm'
        >>> export_hf.export(model=model_dir, output_dir=out, enable_dynamic_shape=True)
        Traceback (most recent call last):
        ...
        NotImplementedError: export_hf.export: enable_dynamic_shape=True is not supported: shapes are static: ...
    """
    _refuse(kwargs)
    if str(getattr(task, "value", task)) != "text_generation":
        raise NotImplementedError(f"export_hf.export: task={task!r} is not supported: {_TEXT}")
    if trust_remote_code:
        raise NotImplementedError("export_hf.export: trust_remote_code=True is not supported: a model's own "
                                  "Python code is never run; use an architecture transformers ships")
    if model_dtype not in (None, "float32", "fp32"):
        raise NotImplementedError(f"export_hf.export: model_dtype={model_dtype!r} is not supported: the edge export "
                                  "is float32 (quantization_recipe makes the weights smaller)")
    for name, v in (("k_ts_idx", k_ts_idx), ("v_ts_idx", v_ts_idx)):
        if v not in (None, 2):
            raise NotImplementedError(f"export_hf.export: {name}={v} is not supported: K and V caches are "
                                      "[1, kv_heads, cache_len, head_dim], sequence axis 2")
    lengths = _lengths(prefill_lengths) or [128]
    cache = int(cache_length) if cache_length is not None else 4096
    more = [c for c in (_lengths(cache_lengths) or []) if c != cache]
    if more:
        raise NotImplementedError(f"export_hf.export: cache_lengths={cache_lengths!r} is not supported: one cache "
                                  f"length per export (cache_length={cache}); export once per cache length")
    if isinstance(model, (str, os.PathLike)) and not os.path.isdir(model):
        raise FileNotFoundError(f"export_hf.export: model={os.fspath(model)!r} is not a local directory; nothing is "
                                "downloaded: fetch it first (huggingface-cli download ID --local-dir DIR)")
    return _export(model, tokenizer, os.fspath(output_dir), lengths, cache, _scheme(quantization_recipe),
                   keep_tflite=bool(keep_temporary_files) or bundle_litert_lm is False,
                   bundle=bundle_litert_lm is not False, template=use_jinja_template is not False,
                   allow_nonfinite=bool(allow_nonfinite_weights))


def _refuse(kwargs) -> None:
    for name, value in kwargs.items():
        if name in _NO_EFFECT:
            continue
        if name not in _UNSUPPORTED:
            raise TypeError(f"export_hf.export() got an unexpected keyword argument {name!r}")
        off, why = _UNSUPPORTED[name]
        if value is not None and value != off:
            raise NotImplementedError(f"export_hf.export: {name}={value!r} is not supported: {why}")


def _lengths(v) -> list[int] | None:
    if v is None:
        return None
    if isinstance(v, str):  # the peer's command line passes "32,128"
        return [int(x) for x in v.split(",") if x.strip()]
    return [int(x) for x in ([v] if isinstance(v, int) else v)]


def _scheme(recipe):
    if recipe is None:
        return RECIPES["dynamic_wi8_afp32"]  # the peer's default
    if getattr(recipe, "scheme", None) in RECIPES.values() and getattr(recipe, "recipe", None) is None:
        return recipe.scheme  # a QuantConfig, e.g. generative.quantize.quant_recipes.full_dynamic_recipe()
    r = str(recipe).strip()
    if r.lower() in _NO_QUANT:
        return None
    if r not in RECIPES:
        raise NotImplementedError(f"export_hf.export: quantization_recipe={recipe!r} is not supported; recipes: "
                                  f"{', '.join(sorted(RECIPES))} or 'none' (one recipe, not a list or .json)")
    return RECIPES[r]


def _export(model, tokenizer, output_dir, lengths, cache, scheme, *, keep_tflite, bundle, template,
            allow_nonfinite=False) -> str:
    from tpu_export.converter.atomic import write_file
    from tpu_export.targets import get_target, options_for
    from tpu_export.targets.lm import Stages, capture_lm, edge_lm_bytes, write_litertlm_bundle
    from tpu_export.targets.lm_source import load_lm_source

    target = get_target("android")
    opts = options_for(target, {"quant_config": scheme})  # the scheme checked before any work
    src = load_lm_source(model, tokenizer, allow_nonfinite_weights=allow_nonfinite)
    if bundle:
        src.require_tokenizer("the .litertlm bundle")
    if not template:
        src.chat_template = None
    prog, spec = capture_lm(src, lengths, cache)
    tflite = edge_lm_bytes(prog, target, opts, Stages(lambda msg: None))
    os.makedirs(output_dir, exist_ok=True)
    main = None
    if keep_tflite:
        main = write_file(os.path.join(output_dir, "model.tflite"), tflite)
    if bundle:
        main = write_litertlm_bundle(os.path.join(output_dir, "model.litertlm"), tflite, src, spec)
    return main
