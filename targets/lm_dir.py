"""A Hugging Face model directory read as untrusted input, for targets/lm_source.py: every file it holds is read by
converter/untrusted.py's rule, and the model it describes is checked against what is really there before anything
is built or allocated.

- ``read_model_dir``: config.json, generation_config.json, tokenizer_config.json, special_tokens_map.json,
  tokenizer.json and chat_template.jinja read (regular files inside the directory, size-capped), the shard index
  and every shard header checked (converter/safetensors_weights.py), the config parsed by transformers from
  our copy of config.json, then ``check_config`` and ``check_tensors``;
- ``check_config``: layer count, widths, heads, vocabulary and positions are integers within what the weights
  present can hold (a config asking for a million layers over a 2-layer checkpoint is refused in milliseconds);
- ``check_tensors``: the model the config describes is built on the meta device (no memory) and every tensor
  compared with the shards' headers: missing, unexpected, wrong shape or wrong dtype is refused by name (tied
  embeddings and the buffers a constructor computes, e.g. rotary inv_freq, are not expected in the checkpoint);
- ``check_finite`` streams every weight through isfinite (a piece at a time: no second copy of the model);
- ``check_vocab``, ``token_ids``, ``check_lengths``: the tokenizer's ids, the stop and BOS ids, the cache and
  prefill lengths against the model and the machine's memory.

Every refusal is an ``LmSourceError``: one line naming the file (or tensor, or argument), what is wrong, the fix.
"""

from __future__ import annotations

import dataclasses

from tpu_export.converter.machine import memory_budget
from tpu_export.converter.untrusted import Folder, UntrustedFileError, limit

from .lm_source import LmSourceError

__all__ = ["ModelDir", "check_config", "check_finite", "check_lengths", "check_tensors", "check_vocab", "hf_config",
           "layer_dims", "read_model_dir", "token_ids"]

_META = ("generation_config.json", "tokenizer_config.json", "special_tokens_map.json")
# config fields that size what transformers allocates, and the hard ceilings nothing real comes near
_SIZES = ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
          "vocab_size", "max_position_embeddings", "head_dim")
_MAX_POSITIONS = 1 << 24
_MAX_LAYERS = 10_000
_FIX_CONFIG = "fix config.json (it must describe the weights in the directory), or re-save the model"


@dataclasses.dataclass
class ModelDir:
    path: str
    config: object  # the transformers config
    generation: dict
    tokenizer_config: dict
    tokenizer_json: str
    chat_template: str | None
    checkpoint: object  # converter.safetensors_weights.Checkpoint (its folder open)
    names_match: bool  # the checkpoint's names are the model's (else transformers renames them as it loads)


def _optional_json(d: Folder, name: str) -> dict:
    st = d.lstat(name)
    if st is None:
        return {}
    data = d.read_json(name)
    if not isinstance(data, dict):
        raise LmSourceError(f"{d.shown(name)}: holds a JSON {type(data).__name__}, not an object. Fix: fix or remove "
                            "the file")
    return data


def read_model_dir(path: str) -> ModelDir:
    """The directory read and checked (see the module doc); raises LmSourceError."""
    from tpu_export.converter.safetensors_weights import read_checkpoint

    try:
        d = Folder(path, what="the model directory")
    except UntrustedFileError as e:
        raise LmSourceError(str(e)) from None
    try:
        try:
            if d.exists("adapter_config.json"):
                raise LmSourceError(f"{d.shown('adapter_config.json')}: a PEFT adapter directory (transformers would "
                                    "fetch its base model). Fix: merge the adapter (model.merge_and_unload()) and "
                                    "save_pretrained the merged model")
            cfg = d.read_json("config.json")
            if not isinstance(cfg, dict):
                raise LmSourceError(f"{d.shown('config.json')}: not a JSON object. Fix: {_FIX_CONFIG}")
            gen, tok_cfg, _ = (_optional_json(d, n) for n in _META)
            tok_json = d.read_text("tokenizer.json", max_bytes=limit("tokenizer"), cap_name="tokenizer")
            template = None
            if d.exists("chat_template.jinja"):
                template = d.read_text("chat_template.jinja", max_bytes=limit("template"), cap_name="template")
            ckpt = read_checkpoint(d)
        except UntrustedFileError as e:
            raise LmSourceError(str(e)) from None
        check_config(cfg, ckpt, d.shown("config.json"))  # milliseconds: before transformers is imported
        config = hf_config(cfg, d.shown("config.json"))
        check_config(config, ckpt, d.shown("config.json"))  # the same sizes under the names the class maps
        names_match = check_tensors(config, ckpt, path)
        return ModelDir(path, config, gen, tok_cfg, tok_json, template, ckpt, names_match)
    except BaseException:
        d.close()
        raise


def hf_config(cfg: dict, where: str):
    """The transformers config of a parsed config.json (transformers never opens the file itself)."""
    import transformers

    mt = cfg.get("model_type")
    mapping = transformers.CONFIG_MAPPING
    if not isinstance(mt, str) or mt not in mapping:
        raise LmSourceError(f"{where}: model_type {mt!r} is not an architecture this transformers "
                            f"({transformers.__version__}) ships. Fix: {_FIX_CONFIG}")
    try:
        return mapping[mt].from_dict(_special_floats(cfg))
    except Exception as e:  # noqa: BLE001 - a config class validates its fields with many error types
        from tpu_export.converter.errors import one_line

        raise LmSourceError(f"{where}: transformers rejects it: {one_line(e)}. Fix: {_FIX_CONFIG}") from None


# how transformers' save_pretrained writes a float JSON has no literal for (GraniteMoeHybrid's default
# time_step_limit (0.0, inf)), which its from_pretrained reads back and from_dict does not
_FLOAT_TAGS = {"Infinity": float("inf"), "-Infinity": float("-inf"), "NaN": float("nan")}


def _special_floats(x):
    if isinstance(x, dict):
        if set(x) == {"__float__"} and isinstance(x["__float__"], str) and x["__float__"] in _FLOAT_TAGS:
            return _FLOAT_TAGS[x["__float__"]]
        return {k: _special_floats(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_special_floats(v) for v in x]
    return x


def check_config(config, ckpt, where: str) -> None:
    """The sizes in ``config`` (a transformers config, or config.json's parsed dict: checked before transformers is
    even imported) are integers the checkpoint's tensors can hold (before anything is built)."""
    if isinstance(config, dict):
        text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
        get = text.get
    else:
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        get = (lambda k, t=text: getattr(t, k, None))
    vals = {}
    for k in _SIZES:
        v = get(k)
        if v is None:
            continue
        if type(v) is not int or v < 1:
            raise LmSourceError(f"{where}: {k} is {v!r}, not a positive integer. Fix: {_FIX_CONFIG}")
        vals[k] = v
    n_tensors, elems = len(ckpt.tensors), ckpt.elements
    layers = vals.get("num_hidden_layers", 1)
    if layers > min(n_tensors, _MAX_LAYERS):
        raise LmSourceError(f"{where}: num_hidden_layers is {layers}, but the weights hold {n_tensors} tensors (at "
                            f"least one per layer; at most {_MAX_LAYERS} layers). Fix: {_FIX_CONFIG}")
    hidden = vals.get("hidden_size", 1)
    for k in ("vocab_size", "intermediate_size"):
        if k in vals and vals[k] * hidden > elems:
            raise LmSourceError(f"{where}: {k} {vals[k]} x hidden_size {hidden} is more than the {elems} weights the "
                                f"directory holds. Fix: {_FIX_CONFIG}")
    if hidden > elems:
        raise LmSourceError(f"{where}: hidden_size {hidden} is more than the {elems} weights the directory holds. "
                            f"Fix: {_FIX_CONFIG}")
    heads = vals.get("num_attention_heads")
    if heads is not None and heads > hidden:
        raise LmSourceError(f"{where}: num_attention_heads {heads} is more than hidden_size {hidden}. "
                            f"Fix: {_FIX_CONFIG}")
    kv = vals.get("num_key_value_heads")
    if kv is not None and heads is not None and (kv > heads or heads % kv):
        raise LmSourceError(f"{where}: num_key_value_heads {kv} does not divide num_attention_heads {heads}. "
                            f"Fix: {_FIX_CONFIG}")
    if vals.get("head_dim", 1) > 1 << 16:
        raise LmSourceError(f"{where}: head_dim {vals['head_dim']} is beyond any model. Fix: {_FIX_CONFIG}")
    if vals.get("max_position_embeddings", 1) > _MAX_POSITIONS:
        raise LmSourceError(f"{where}: max_position_embeddings {vals['max_position_embeddings']} is more than "
                            f"{_MAX_POSITIONS}. Fix: {_FIX_CONFIG}")


def _meta_model(config):
    import torch
    import transformers

    from tpu_export.converter.gc_pause import gc_paused

    with gc_paused(), torch.device("meta"):
        return transformers.AutoModelForCausalLM.from_config(config, trust_remote_code=False)


def _renamed_on_load(model, unknown) -> bool:
    """Whether transformers renames or fuses checkpoint keys for this model as it loads (Mixtral's experts, a
    checkpoint saved from the base model): then its own loading report decides (lm_source checks it)."""
    from transformers.conversion_mapping import extract_weight_conversions_for_model

    if extract_weight_conversions_for_model(model) is not None:
        return True
    prefix = getattr(model, "base_model_prefix", "")
    return bool(prefix) and bool(unknown) and all(not k.startswith(prefix + ".") for k in unknown)


def check_tensors(config, ckpt, path: str) -> bool:
    """The checkpoint holds exactly the tensors the config's model has, with its shapes and dtype kinds. True when
    the names matched one for one; False when transformers renames them as it loads (checked after the load)."""
    import re

    model = _meta_model(config)
    groups: dict[int, list] = {}
    params = {}
    for n, p in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(p), []).append(n)
        params[n] = p
    buffers = {n: b for n, b in model.state_dict(keep_vars=True).items() if n not in params}
    have = ckpt.tensors
    ignore = [re.compile(p) for p in (getattr(model, "_keys_to_ignore_on_load_unexpected", None) or ())]
    unexpected = sorted(k for k in have if k not in params and k not in buffers
                        and not any(r.search(k) for r in ignore))
    missing = [names[0] for names in groups.values() if not any(n in have for n in names)]
    where = f"{path}: "
    if unexpected or missing:
        if _renamed_on_load(model, unexpected):
            return False
        if missing:
            raise LmSourceError(f"{where}tensor {missing[0]!r} ({len(missing)} missing in all) is not in the "
                                "safetensors weights, but the config's model has it; transformers would fill it "
                                "with random values. Fix: save the complete model (model.save_pretrained(DIR))")
        raise LmSourceError(f"{where}tensor {unexpected[0]!r} ({len(unexpected)} unexpected in all) is in the "
                            "safetensors weights, but the config's model has no such tensor: config.json and the "
                            "weights describe different models. Fix: save them together (model.save_pretrained(DIR))")
    for k, e in sorted(have.items()):
        t = params.get(k, buffers.get(k))
        if t is None:
            continue
        if e.shape != tuple(t.shape):
            raise LmSourceError(f"{where}tensor {k!r} has shape {list(e.shape)} in {e.shard}, but config.json makes "
                                f"it {list(t.shape)}. Fix: save config.json and the weights together "
                                "(model.save_pretrained(DIR))")
        if t.is_floating_point() != e.is_float:
            raise LmSourceError(f"{where}tensor {k!r} is stored as {e.dtype_name} in {e.shard}, but the model's "
                                f"{k} is {str(t.dtype).replace('torch.', '')}. Fix: save the model's own weights "
                                "(model.save_pretrained(DIR))")
    return True


_PIECE = 1 << 24  # elements checked at once: a 64 MB bool mask at most, never a copy of a weight


def check_finite(model, name: str, *, allow: bool = False) -> None:
    """Every floating-point parameter and buffer is finite, read a piece at a time. A non-finite one is refused
    naming it, or with ``allow`` warned about (once, naming the first)."""
    import warnings

    import torch

    from tpu_export.converter.lazy_weights import spool_holding

    seen = set()
    bad = []
    with torch.no_grad():
        for n, t in list(model.named_parameters()) + list(model.named_buffers()):
            if id(t) in seen or not t.is_floating_point() or t.is_meta or not t.numel():
                continue
            seen.add(id(t))
            flat = t.detach().reshape(-1)
            for at in range(0, flat.numel(), _PIECE):
                piece = flat[at:at + _PIECE]
                # one pass, no mask: a NaN or an infinity makes the sum non-finite (inf - inf is NaN), so a finite
                # sum proves the piece finite; a non-finite one (perhaps finite values overflowing) is checked exactly
                # (isfinite is 15x slower: 0.2 GB/s against 3 GB/s here)
                if not bool(torch.isfinite(piece.sum(dtype=torch.float32))) and not bool(torch.isfinite(piece).all()):
                    bad.append(n)
                    break
            # a weight mapped from its shard (or a spool) gives its pages back once checked: the check reads
            # the model once and keeps no more of it resident than the conversion would
            nbytes = t.numel() * t.element_size()
            sp = spool_holding(t.data_ptr(), nbytes) if t.is_contiguous() else None
            if sp is not None:
                sp.release(t.data_ptr(), nbytes)
    if not bad:
        return
    what = f"weight {bad[0]!r}" + (f" (and {len(bad) - 1} more)" if len(bad) > 1 else "")
    if not allow:
        raise LmSourceError(f"{name}: {what} holds NaN or infinite values; the model would generate garbage. Fix: "
                            "use an intact checkpoint, or pass --allow-nonfinite-weights (Python: "
                            "allow_nonfinite_weights=True) to convert it anyway")
    warnings.warn(f"{name}: {what} holds NaN or infinite values; converting anyway (allow_nonfinite_weights)",
                  stacklevel=2)


def _tokenizer_max_id(tok_json: str, where: str) -> int:
    import json

    from tpu_export.edge.litertlm_check import max_token_id

    try:
        data = json.loads(tok_json)
    except (ValueError, RecursionError):
        raise LmSourceError(f"{where}: not valid JSON. Fix: save the tokenizer again "
                            "(tokenizer.save_pretrained(DIR))") from None
    top = max_token_id(data)
    return -1 if top is None else top


def check_vocab(tok_json: str, rows: int, where: str) -> None:
    """Every id the tokenizer can produce has a row in the embedding."""
    top = _tokenizer_max_id(tok_json, where)
    if top >= rows:
        raise LmSourceError(f"{where}: the tokenizer has ids up to {top}, but the model's embedding has {rows} rows "
                            f"(ids 0-{rows - 1}); the engine would read past it. Fix: use the tokenizer the model "
                            "was trained with (or resize the embedding: model.resize_token_embeddings(...))")


def token_ids(v, where: str, key: str, vocab: int | None) -> tuple:
    """A stop or BOS id field (an int or a list of ints) as a tuple of ids checked against the vocabulary."""
    if v is None:
        return ()
    vals = v if isinstance(v, (list, tuple)) else [v]
    for x in vals:
        if type(x) is not int or x < 0 or (vocab is not None and x >= vocab):
            rng = f" in 0-{vocab - 1}" if vocab else ""
            raise LmSourceError(f"{where}: {key} {v!r} is not a token id{rng} (an integer or a list of integers). "
                                "Fix: give the tokenizer's id for the token")
    return tuple(vals)


def check_lengths(num_layers: int, kv_heads: int, head_dim: int, prefill_lengths, cache_len: int, name: str,
                  v_head_dim: int | None = None) -> None:
    """The cache and prefill lengths are positive, prefill fits the cache, and the KV cache (V ``v_head_dim``
    wide, None: as K) fits in memory."""
    for what, v in [("cache_len", cache_len)] + [("prefill length", p) for p in prefill_lengths]:
        if type(v) is not int or v < 1:
            raise LmSourceError(f"{name}: {what} {v!r} is not a positive integer. Fix: give a number of tokens "
                                "(e.g. 1024)")
    if not prefill_lengths:
        raise LmSourceError(f"{name}: no prefill length given. Fix: give at least one (e.g. 32)")
    if max(prefill_lengths) > cache_len:
        raise LmSourceError(f"{name}: prefill length {max(prefill_lengths)} is more than cache_len {cache_len} (a "
                            "prefill writes its tokens into the cache). Fix: a longer cache or a shorter prefill")
    from tpu_export.converter.llm import CacheSpec

    spec = CacheSpec(num_layers, kv_heads, cache_len, head_dim, v_head_dim=v_head_dim)  # float32, as captured
    need = spec.nbytes
    have = memory_budget()
    if need > have // 2:
        most = max(1, (have // 2) // max(1, spec.bytes_per_token))
        raise LmSourceError(f"{name}: cache_len {cache_len} makes a {need / 2**30:.1f} GiB KV cache; this machine "
                            f"has {have / 2**30:.1f} GiB available (half of it for the cache: at most "
                            f"{most} slots). Fix: a smaller cache_len")


def layer_dims(config) -> tuple[int, int, int, int]:
    """(layers, KV heads, K width, V width) of the cache a transformers config makes, for check_lengths. Multi-head
    latent attention (a ``kv_lora_rank`` in the config: converter/llm_mla.py) caches one latent of that width and
    the rope key per layer."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    layers = int(getattr(text, "num_hidden_layers", 1) or 1)
    if getattr(text, "kv_lora_rank", None) and getattr(text, "qk_rope_head_dim", None):
        return layers, 1, int(text.kv_lora_rank), int(text.qk_rope_head_dim)
    heads = int(getattr(text, "num_attention_heads", 1) or 1)
    kv = int(getattr(text, "num_key_value_heads", None) or heads)
    hd = getattr(text, "head_dim", None) or int(getattr(text, "hidden_size", heads)) // heads
    return layers, kv, int(hd), int(hd)
