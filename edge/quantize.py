"""Quantizing a float .tflite with ai-edge-quantizer recipes: the one place litert_torch.convert,
the CLI and the targets go through.

Schemes (``QuantConfig.scheme``, or the name alone):

- ``dynamic_int8``: int8 weights per output channel; activations stay float in the file and the
  kernels (FULLY_CONNECTED, CONV_2D...) quantize them on the fly (dynamic range).
- ``weight_only_int8`` / ``weight_only_int4``: int8 / int4 weights per output channel, dequantized
  to float by DEQUANTIZE ops; float compute (int4 ranges clipped by OCTAV, see ``recipe_for``).
  LiteRT runs blockwise int4 only in dynamic-range FULLY_CONNECTED and ai-edge-quantizer refuses
  blockwise weight-only configs, so weight-only int4 is channelwise.
- ``dynamic_int4_block32``: int4 weights in blocks of 32 input channels, a float16 scale each,
  in dynamic-range FULLY_CONNECTED / EMBEDDING_LOOKUP (the layout LiteRT-LM's int4 LLMs use); an
  all-zero block's scale is float16's smallest normal, not the quantizer's 0 (edge/quantize_post.py).
- ``fp16``: float16 weights (ai-edge-quantizer's float casting), DEQUANTIZE to float32 at load.
- ``static_int8``: int8 weights and activations from calibration inputs (full integer; each
  activation's range is its min/max over all the samples, see ``_calibrate``); inputs and
  outputs int8 (``io_dtype="int8"``, what TFLite Micro and NPUs take) or float32 with QUANTIZE /
  DEQUANTIZE at the boundary (``io_dtype="float32"``).

Before the recipe runs, edge/quantize_prep.py makes tensor names unique model-wide and turns a GATHER of
a constant float table (an embedding) into EMBEDDING_LOOKUP, which the dynamic, weight-only and fp16
recipes quantize (they skip GATHER); static int8 keeps the GATHER (it runs int8 as it is).

Calibration inputs are validated against the Program's signatures (count, shapes up to dynamic
dims, dtypes) by ``calibration_feeds`` before anything is lowered or written.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import numpy as np

__all__ = ["SCHEMES", "QuantConfig", "QuantizationError", "as_quant_config", "recipe_for", "quantize_tflite",
           "calibration_feeds", "unique_tensor_names", "prepare_tflite", "is_pt2e_config", "check_pt2e"]

SCHEMES = ("dynamic_int8", "weight_only_int8", "weight_only_int4", "dynamic_int4_block32", "fp16", "static_int8")
_ALIASES = {"float16": "fp16", "int8": "static_int8", "full_int8": "static_int8", "dynamic": "dynamic_int8"}
_IO_DTYPES = ("float32", "int8")


class QuantizationError(ValueError):
    """A quantization request that cannot be honoured (unknown scheme, bad calibration data, or
    ai-edge-quantizer refusing the model); raised before anything is written."""


@dataclasses.dataclass(frozen=True)
class QuantConfig:
    """A scheme name (see the module docstring), the I/O dtype of a static int8 model, or a raw
    ai-edge-quantizer recipe (``recipe``: a ModelQuantizationRecipe list) applied as given."""

    scheme: str = "dynamic_int8"
    io_dtype: str = "float32"  # static_int8 only: "int8" = int8 inputs/outputs, "float32" = float boundary
    recipe: Any = None

    def __post_init__(self):
        scheme = _ALIASES.get(self.scheme, self.scheme)
        if self.recipe is not None:
            scheme = self.scheme if self.scheme != "dynamic_int8" else "recipe"
        elif scheme not in SCHEMES:
            raise QuantizationError(f"unknown quantization scheme {self.scheme!r}; schemes: {', '.join(SCHEMES)} "
                                    "(or pass QuantConfig(recipe=<ai-edge-quantizer recipe>))")
        object.__setattr__(self, "scheme", scheme)
        if self.io_dtype not in _IO_DTYPES:
            raise QuantizationError(f"io_dtype must be one of {_IO_DTYPES}, got {self.io_dtype!r}")
        if self.io_dtype != "float32" and scheme != "static_int8":
            raise QuantizationError(f"io_dtype={self.io_dtype!r} needs scheme 'static_int8' (activations quantized); "
                                    f"{scheme!r} keeps float inputs and outputs")

    @property
    def needs_calibration(self) -> bool:
        if self.recipe is not None:
            return any(_is_static(entry) for entry in self.recipe)
        return self.scheme == "static_int8"


def _is_static(entry) -> bool:
    act = (entry.get("op_config") or {}).get("activation_tensor_config")
    return bool(act) and entry.get("algorithm_key") != "no_quantize"


def is_pt2e_config(value) -> bool:
    """Whether ``value`` is litert_torch.quantize's QuantConfig(pt2e_quantizer=...): the quantization is already in
    the module's graph (PT2E quantize/dequantize pairs), folded into int8 kernels by the conversion itself."""
    return getattr(value, "pt2e_quantizer", None) is not None


def as_quant_config(value) -> QuantConfig | None:
    """None, a scheme name, a QuantConfig, or an ai-edge-quantizer recipe (list of dicts) -> QuantConfig.
    A PT2E QuantConfig (``is_pt2e_config``) gives None: nothing is left to quantize after lowering."""
    if value is None or isinstance(value, QuantConfig):
        return value
    if is_pt2e_config(value):
        return None
    if isinstance(value, str):
        return QuantConfig(value)
    if isinstance(value, list) and all(isinstance(e, dict) for e in value):
        return QuantConfig("recipe", recipe=value)
    raise QuantizationError(f"quant_config must be a scheme name ({', '.join(SCHEMES)}), a QuantConfig or an "
                            f"ai-edge-quantizer recipe list; got {type(value).__name__}")


def check_pt2e(quant_config, prog) -> None:
    """Refuse a PT2E QuantConfig for a module with no PT2E quantization in its graph (``prepare_pt2e`` /
    ``convert_pt2e`` not run: converting it would silently give a float model), and a second quantization
    (a scheme or recipe) of a module PT2E already quantized."""
    quantized = [n for n, sig in prog.signatures.items() if sig.graph_module.meta.get("pt2e")]
    if is_pt2e_config(quant_config) and not quantized:
        raise QuantizationError("quant_config=QuantConfig(pt2e_quantizer=...) but the module holds no PT2E "
                                "quantize/dequantize ops: run prepare_pt2e(exported.module(), quantizer), calibrate, "
                                "then convert_pt2e(...) and convert the module convert_pt2e returns")
    if quantized and quant_config is not None and not is_pt2e_config(quant_config):
        raise QuantizationError(f"the module is PT2E-quantized already (signatures {quantized}); quant_config "
                                f"{quant_config!r} would quantize it twice: pass "
                                "QuantConfig(pt2e_quantizer=quantizer) from litert_torch.quantize.quant_config, "
                                "or None")


def recipe_for(config: QuantConfig) -> list:
    """The ai-edge-quantizer recipe (a list of per-regex op configs) for ``config``."""
    from ai_edge_quantizer import qtyping, recipe, recipe_manager
    from ai_edge_quantizer.algorithm_manager import AlgorithmName

    if config.recipe is not None:
        return list(config.recipe)
    every = qtyping.TFLOperationName.ALL_SUPPORTED
    rm = recipe_manager.RecipeManager()
    if config.scheme == "dynamic_int8":
        return recipe.dynamic_wi8_afp32()
    if config.scheme == "weight_only_int8":
        return recipe.weight_only_wi8_afp32()
    if config.scheme == "weight_only_int4":
        # OCTAV picks each channel's clipping range to minimise error: on the zoo CNNs it keeps
        # top-1 agreement at 0.90 / 0.78 (ResNet-18 / MobileNetV2) where plain min-max gives 0.88 / 0.63
        return recipe.weight_only_wi4_afp32(AlgorithmName.OCTAV)
    if config.scheme == "dynamic_int4_block32":
        # int4 in blocks of 32 input channels, one scale each: LiteRT runs blockwise weights only in dynamic-range
        # FULLY_CONNECTED (and EMBEDDING_LOOKUP), the layout LiteRT-LM's int4 LLMs use
        return recipe.dynamic_wi4b32_afp32()
    if config.scheme == "fp16":
        rm.add_weight_only_config(".*", every, 16, algorithm_key=AlgorithmName.FLOAT_CASTING)
        return rm.get_quantization_recipe()
    rm.add_static_config(".*", every, activation_num_bits=8, weight_num_bits=8)
    if config.io_dtype == "float32":
        # the graph's inputs/outputs stay float: the quantizer puts QUANTIZE/DEQUANTIZE at the boundary
        for boundary in (qtyping.TFLOperationName.INPUT, qtyping.TFLOperationName.OUTPUT):
            rm.add_quantization_config(".*", boundary, algorithm_key=AlgorithmName.NO_QUANTIZE)
    return rm.get_quantization_recipe()


def unique_tensor_names(tflite: bytes) -> bytes:
    """The same model with every repeated tensor name suffixed ``_1``, ``_2``... (model-wide: the quantizer
    refuses a name repeated across subgraphs too, as a multi-signature LLM's inputs and shared weights are).
    Signature names live in the SignatureDefs, so no caller sees a change. Unchanged bytes when unique."""
    from .quantize_prep import prepare_for_quantizer

    out = prepare_for_quantizer(tflite)
    return bytes(out) if isinstance(out, bytearray) else out


def _quantizes_embeddings(config: QuantConfig, recipe: list) -> bool:
    """Whether the recipe reaches EMBEDDING_LOOKUP (so a GATHER table is worth rewriting into one): every named
    scheme but static int8 (whose GATHER runs int8 as it is), and a raw recipe that names the op or all ops."""
    if config.recipe is None:
        return config.scheme != "static_int8"
    return any(e.get("operation") in ("*", "EMBEDDING_LOOKUP") for e in recipe)


def prepare_tflite(tflite: bytes, config) -> bytes | bytearray:
    """The float ``tflite`` as ``quantize_tflite`` hands it to the quantizer for ``config``: tensor names unique and,
    when the recipe quantizes them, GATHER tables as EMBEDDING_LOOKUP (edge/quantize_prep.py); ``tflite`` itself
    when nothing needs rewriting. A caller that drops its float bytes once this returns and passes the result to
    ``quantize_tflite`` (which then finds nothing left to rewrite) holds one copy of the model while quantizing,
    not two."""
    from .quantize_prep import prepare_for_quantizer

    config = as_quant_config(config)
    data = tflite if isinstance(tflite, (bytes, bytearray)) else bytes(tflite)  # no copy of a prepared bytearray
    return prepare_for_quantizer(data, embedding_lookup=_quantizes_embeddings(config, recipe_for(config)))


def quantize_tflite(tflite: bytes, config, calibration: dict | None = None) -> bytes:
    """Apply ``config``'s recipe to the float ``tflite`` (as it is or as ``prepare_tflite`` gave it).

    ``calibration``: {signature name: [{input name: array in the .tflite's layout and dtype}, ...]}
    (see ``calibration_feeds``), required when the config quantizes activations.
    """
    from ai_edge_quantizer import quantizer

    from .quantize_post import nonzero_block_scales

    config = as_quant_config(config)
    recipe = recipe_for(config)
    model = prepare_tflite(tflite, config)
    q = quantizer.Quantizer(model if isinstance(model, bytearray) else bytearray(model), recipe)
    if q.need_calibration and not calibration:
        raise QuantizationError(f"{config.scheme} quantizes activations and needs calibration data: "
                                "an iterable of sample-argument tuples that look like real inputs")
    step = "calibration"
    try:
        # the quantizer's own interpreters keep every tensor (for min/max) and warn that this is for debugging
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*preserve_all_tensors", category=UserWarning)
            if not q.need_calibration:
                result = None
            elif config.recipe is None:
                result = _calibrate(model, recipe, calibration)
            else:  # a raw recipe keeps the quantizer's own statistics (GPTQ / OSCAR merge more than min/max)
                result = q.calibrate(calibration, num_threads=2)
            step = "quantization"
            out = q.quantize(result, enable_progress_bar=False, enable_progress_report=False)
    except Exception as e:  # noqa: BLE001 - the quantizer raises plain errors; name the step
        raise QuantizationError(f"ai-edge-quantizer {step} ({config.scheme}) failed: {type(e).__name__}: {e}") from e
    # an all-zero block's float16 scale 0, which XNNPACK refuses (edge/quantize_post.py)
    return bytes(nonzero_block_scales(out.quantized_model))


def _calibrate(model: bytes, recipe: list, calibration: dict) -> dict:
    """{tensor name: {"min", "max"}}: each tensor's extremes over all the calibration samples.

    Quantizer.calibrate merges a sample's min/max into the running one by an exponential moving
    average (0.95 old + 0.05 new: what the min-max algorithm registers), so with a few dozen
    batch-1 samples a range is a weighted mean of per-sample ranges (the first sample alone weighs
    0.2 of 32): narrower than the data, and the tails clip. On ResNet-18 the logits' range came out
    [-1.7, 2.0] where the 32 samples reach [-3.4, 3.8]; max rel err 0.40, with the true min/max 0.09
    (litert-torch's PT2E flow, histogram observers: 0.09 too). Same calibrator, other update.
    """
    from ai_edge_quantizer import calibrator, recipe_manager
    from ai_edge_quantizer.utils import qsv_utils

    rm = recipe_manager.RecipeManager()
    rm.load_quantization_recipe(recipe)
    calib = calibrator.Calibrator(model, num_threads=2, qsv_update_func=qsv_utils.min_max_update)
    calib.calibrate(calibration, rm)
    return calib.get_model_qsvs()


def calibration_feeds(prog, calibration_data, *, channel_last_inputs=None) -> dict:
    """Validate calibration samples against ``prog``'s signatures; {signature: [{input name: array}]}.

    ``calibration_data``: an iterable of samples for a one-signature program, or {signature name:
    iterable}. A sample is a tuple of the module's positional args (a lone tensor is accepted), an
    (args, kwargs) pair given as a dict {"args": ..., "kwargs": ...}, or {input name: array}.
    Every sample must match the signature: input count, shape (dynamic dims free within their
    range), dtype kind (float/int/bool; int64 -> int32 and float64 -> float32 as the program does).
    ``channel_last_inputs``: {signature: input indices} (or one tuple for all) laid out NHWC in
    the .tflite; those samples are given in torch's layout and transposed here.
    """
    if calibration_data is None:
        raise QuantizationError("calibration_data is required for static int8: an iterable of sample-argument "
                                "tuples that look like real inputs (a few dozen is typical)")
    sigs = prog.signatures
    if isinstance(calibration_data, dict) and calibration_data and set(calibration_data) <= set(sigs):
        by_sig = calibration_data
    elif len(sigs) == 1:
        by_sig = {next(iter(sigs)): calibration_data}
    else:
        raise QuantizationError(f"this program has signatures {sorted(sigs)}: pass calibration_data as "
                                "{signature name: [samples]}")
    out = {}
    for name, samples in by_sig.items():
        sig = sigs[name]
        cl = channel_last_inputs.get(name, ()) if isinstance(channel_last_inputs, dict) else (channel_last_inputs or ())
        feeds = [_feed(sig, s, i, set(cl)) for i, s in enumerate(samples)]
        if not feeds:
            raise QuantizationError(f"calibration_data for signature {name!r} is empty; static int8 needs "
                                    "representative samples (a few dozen is typical)")
        out[name] = feeds
    return out


def _flat_sample(sig, sample) -> list:
    import torch

    if isinstance(sample, dict) and set(sample) <= {"args", "kwargs"} and sample:
        return sig.flatten_inputs(sample.get("args", ()), sample.get("kwargs"))
    if isinstance(sample, dict):
        names = [s.name for s in sig.inputs]
        missing = [n for n in names if n not in sample]
        extra = [n for n in sample if n not in names]
        if missing or extra:
            raise ValueError(f"inputs {names} expected; missing {missing}, unknown {extra}")
        return [sample[n] for n in names]
    if isinstance(sample, (torch.Tensor, np.ndarray)):
        sample = (sample,)
    return sig.flatten_inputs(tuple(sample), None)


def _feed(sig, sample, index, channel_last) -> dict:
    where = f"calibration sample {index} of signature {sig.name!r}"
    try:
        flat = _flat_sample(sig, sample)
    except (TypeError, ValueError) as e:
        raise QuantizationError(f"{where}: {e}") from None
    if len(flat) != len(sig.inputs):
        raise QuantizationError(f"{where} has {len(flat)} tensors; the signature takes {len(sig.inputs)} "
                                f"({', '.join(s.name for s in sig.inputs)})")
    feed = {}
    for k, (spec, value) in enumerate(zip(sig.inputs, flat)):
        a = value.detach().cpu().numpy() if hasattr(value, "detach") else np.asarray(value)
        want = _np_dtype(spec.dtype)
        if _kind(a.dtype) != _kind(want):
            raise QuantizationError(f"{where}, input {spec.name!r}: dtype {a.dtype} but the signature takes {want}")
        _check_shape(where, spec, a.shape, sig.dim_ranges)
        a = a.astype(want, copy=False)
        if k in channel_last and a.ndim >= 3:
            a = np.moveaxis(a, 1, -1)
        feed[spec.name] = np.ascontiguousarray(a)
    return feed


def _check_shape(where, spec, shape, ranges) -> None:
    want = tuple(spec.shape)
    ok = len(shape) == len(want)
    for got, d in zip(shape, want):
        if isinstance(d, str):
            lo, hi = (ranges or {}).get(d, (0, None))
            ok &= got >= (lo or 0) and (hi is None or got <= hi)
        else:
            ok &= got == d
    if not ok:
        raise QuantizationError(f"{where}, input {spec.name!r}: shape {tuple(shape)} but the signature takes "
                                f"{want} (named dims are dynamic)")


def _np_dtype(torch_dtype) -> np.dtype:
    import torch

    return np.dtype(torch.empty((), dtype=torch_dtype).numpy().dtype)


def _kind(dtype) -> str:
    """float / int / bool: a sample may differ from the signature in width (int64 ids, float64), not kind."""
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return "bool"
    return {"f": "float", "i": "int", "u": "int"}.get(dtype.kind, dtype.kind)
