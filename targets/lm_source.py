"""What an LLM conversion starts from: a local Hugging Face model directory, a ``transformers`` model object (with
its tokenizer), or a user module that follows converter.llm's cache protocol.

    src = load_lm_source("path/to/hf_dir")                    # config.json, *.safetensors, tokenizer.json
    src = load_lm_source(hf_model, tokenizer=hf_tokenizer)     # objects already in memory
    src = load_lm_source(my_module, tokenizer="tokenizer.json")

A model directory is read with ``transformers`` from local files only, safetensors only: a directory that holds
only ``pytorch_model.bin`` (a pickle, which can run code when loaded) is refused with the one-time fix. Nothing is
downloaded and no remote code runs (``trust_remote_code`` stays off).

A user module follows the cache protocol when it is a ``torch.nn.Module`` with ``spec``, a converter.llm.CacheSpec,
and ``forward(tokens, input_pos, **caches) -> {"logits": ..., **updated caches}`` with the input and output names
of converter/llm.py's docstring (converter.llm.KVCacheLM is one).
"""

from __future__ import annotations

import dataclasses
import glob
import os

__all__ = ["LmSource", "LmSourceError", "load_lm_source"]


class LmSourceError(ValueError):
    """A model directory, object or tokenizer that cannot be converted; the message names it and the fix."""


@dataclasses.dataclass
class LmSource:
    """The model to capture and what a runtime needs beside the graph to generate text."""

    model: object  # a transformers causal LM, or a module that follows the cache protocol (protocol=True)
    name: str  # for messages and summary.json
    protocol: bool = False
    tokenizer_json: str | None = None  # the fast tokenizer's tokenizer.json text
    stop_token_ids: tuple = ()
    bos_token_id: int | None = None
    chat_template: str | None = None  # jinja, as in tokenizer_config.json

    def require_tokenizer(self, why: str) -> str:
        if self.tokenizer_json is None:
            raise LmSourceError(f"{self.name}: no tokenizer; {why} needs one: pass tokenizer= (a transformers fast "
                                "tokenizer, a tokenizers.Tokenizer or a tokenizer.json path), or save it into the "
                                "model directory with tokenizer.save_pretrained(DIR)")
        return self.tokenizer_json


def load_lm_source(source, tokenizer=None, *, allow_nonfinite_weights: bool = False) -> LmSource:
    """``source``: a model directory path, a transformers causal LM, or a cache-protocol module.
    ``allow_nonfinite_weights``: convert a model with NaN or infinite weights (warned) instead of refusing it."""
    if isinstance(source, (str, os.PathLike)):
        if tokenizer is not None:
            raise LmSourceError(f"{os.fspath(source)}: a model directory brings its own tokenizer; drop tokenizer=")
        return _from_dir(os.fspath(source), allow_nonfinite_weights)
    import torch

    from tpu_export.converter.llm import CacheSpec

    from .lm_dir import check_finite, check_vocab

    if not isinstance(source, torch.nn.Module):
        raise LmSourceError(f"cannot convert a {type(source).__name__} as an LLM: give a Hugging Face model "
                            "directory, a transformers causal LM or a module with the cache protocol "
                            "(targets/lm_source.py)")
    name = type(source).__name__
    if isinstance(getattr(source, "spec", None), CacheSpec):
        src = LmSource(source, name, protocol=True)
    elif hasattr(source, "config") and hasattr(source, "get_input_embeddings"):
        gen = getattr(source, "generation_config", None)
        src = LmSource(source, name, stop_token_ids=_stops(gen, source.config),
                       bos_token_id=_first(getattr(gen, "bos_token_id", None), source.config.bos_token_id))
    else:
        raise LmSourceError(f"{name} is neither a transformers causal LM (config, get_input_embeddings) nor a module "
                            "with the cache protocol (a converter.llm.CacheSpec as .spec): see targets/lm_source.py")
    check_finite(source, name, allow=allow_nonfinite_weights)
    if tokenizer is not None:
        src.tokenizer_json, template, stops, bos = _tokenizer_parts(tokenizer)
        src.chat_template = template
        src.stop_token_ids = src.stop_token_ids or stops
        src.bos_token_id = src.bos_token_id if src.bos_token_id is not None else bos
        if not src.protocol:
            check_vocab(src.tokenizer_json, source.get_input_embeddings().weight.shape[0], f"{name}'s tokenizer")
    return src


def _has_safetensors(path: str) -> bool:
    return bool(glob.glob(os.path.join(glob.escape(path), "*.safetensors")))


def _from_dir(path: str, allow_nonfinite: bool = False) -> LmSource:
    from .lm_dir import check_finite, check_vocab, read_model_dir, token_ids

    if not os.path.isdir(path):
        raise LmSourceError(f"{path}: not a directory; give a Hugging Face model directory (config.json, "
                            "*.safetensors, tokenizer.json)")
    if not os.path.lexists(os.path.join(path, "config.json")):
        raise LmSourceError(f"{path}: no config.json, so not a Hugging Face model directory; write one with "
                            "model.save_pretrained(DIR)")
    if not _has_safetensors(path) and not os.path.lexists(os.path.join(path, "model.safetensors.index.json")):
        pickles = sorted(os.path.basename(p) for pat in ("*.bin", "*.pt", "*.pth", "*.ckpt")
                         for p in glob.glob(os.path.join(glob.escape(path), pat)))
        if pickles:
            raise LmSourceError(f"{path}: weights only in {', '.join(pickles)} (pickle, which can run code when "
                                "loaded; tpu-export never unpickles); convert once where you trust the file: "
                                "AutoModelForCausalLM.from_pretrained(DIR).save_pretrained(DIR) writes "
                                "model.safetensors")
        raise LmSourceError(f"{path}: no *.safetensors weights; save the model with model.save_pretrained(DIR)")
    if not os.path.lexists(os.path.join(path, "tokenizer.json")):
        raise LmSourceError(f"{path}: no tokenizer.json (the fast tokenizer the bundle and `generate` use); save it "
                            "with AutoTokenizer.from_pretrained(...).save_pretrained(DIR)")
    md = read_model_dir(path)  # every file checked, the config against the weights, before anything is built
    try:
        cfg = md.config
        vocab = getattr(cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg, "vocab_size", None)
        gen_at, cfg_at = os.path.join(path, "generation_config.json"), os.path.join(path, "config.json")
        stops = (token_ids(md.generation.get("eos_token_id"), gen_at, "eos_token_id", vocab)
                 or token_ids(getattr(cfg, "eos_token_id", None), cfg_at, "eos_token_id", vocab))
        bos = (token_ids(md.generation.get("bos_token_id"), gen_at, "bos_token_id", vocab)
               or token_ids(getattr(cfg, "bos_token_id", None), cfg_at, "bos_token_id", vocab))
        model = _load_model(path, md)
    finally:
        md.checkpoint.close()
    name = os.path.basename(os.path.normpath(path))
    check_finite(model, path, allow=allow_nonfinite)
    check_vocab(md.tokenizer_json, model.get_input_embeddings().weight.shape[0], os.path.join(path, "tokenizer.json"))
    template = md.chat_template if md.chat_template is not None else _template(md.tokenizer_config.get("chat_template"))
    return LmSource(model, name, tokenizer_json=md.tokenizer_json, stop_token_ids=stops,
                    bos_token_id=bos[0] if bos else None, chat_template=template)


def _load_model(path: str, md):
    from tpu_export.converter.gc_pause import gc_paused

    try:
        # the collector paused as for the capture: importing transformers and building the model made ~1 s of
        # collections in the 0.84 B Llama's convert-lm
        with gc_paused():
            import torch
            import transformers

            from .lm_stream import load_lazily

            # past 1 GiB of float32 weights: parameters mapped or in a spool, not memory
            lazy = load_lazily(path, config=md.config, checkpoint=md.checkpoint) if md.names_match else None
            if lazy is not None:
                return lazy
            # every file transformers opens here (generation_config.json, the index, the shards) was checked by
            # read_model_dir; config.json is not reopened (our parsed copy is passed)
            model, info = transformers.AutoModelForCausalLM.from_pretrained(
                path, config=md.config, local_files_only=True, use_safetensors=True, trust_remote_code=False,
                dtype=torch.float32, output_loading_info=True)
    except LmSourceError:
        raise
    except Exception as e:  # noqa: BLE001 - transformers raises many types; the user gets one line naming the dir
        from tpu_export.converter.errors import one_line

        raise LmSourceError(f"{path}: transformers cannot load it as a causal LM from local safetensors: "
                            f"{one_line(e)}") from None
    for key, what in (("missing_keys", "is not in the safetensors weights, but the config's model has it"),
                      ("unexpected_keys", "is in the safetensors weights, but the config's model has no such tensor"),
                      ("mismatched_keys", "has another shape in the safetensors weights than the config gives it")):
        names = sorted(str(k if isinstance(k, str) else k[0]) for k in (info.get(key) or ()))
        if names:
            raise LmSourceError(f"{path}: tensor {names[0]!r} ({len(names)} in all) {what}. Fix: save config.json "
                                "and the complete weights together (model.save_pretrained(DIR))")
    return model.eval()


def _template(t) -> str | None:
    if isinstance(t, list):  # [{"name": "default", "template": ...}, ...]: the default one
        named = {d.get("name"): d.get("template") for d in t if isinstance(d, dict)}
        t = named.get("default", next(iter(named.values()), None))
    return t if isinstance(t, str) else None


def _ids(v) -> tuple:
    from .lm_dir import token_ids

    return token_ids(v, "the model's generation config", "eos_token_id", None)


def _first(*vals):
    for v in vals:
        if v is not None:
            return int(v[0] if isinstance(v, (list, tuple)) else v)
    return None


def _stops(gen, cfg) -> tuple:
    return _ids(getattr(gen, "eos_token_id", None)) or _ids(getattr(cfg, "eos_token_id", None))


def _tokenizer_parts(tok):
    """(tokenizer.json text, chat template, eos ids, bos id) of a transformers fast tokenizer, a
    tokenizers.Tokenizer or a tokenizer.json path."""
    if isinstance(tok, (str, os.PathLike)):
        from tpu_export.converter.untrusted import UntrustedFileError, limit, read_text

        try:
            return read_text(tok, max_bytes=limit("tokenizer"), what="tokenizer.json", cap_name="tokenizer"), \
                None, (), None
        except UntrustedFileError as e:
            raise LmSourceError(str(e)) from None
    if hasattr(tok, "to_str"):  # tokenizers.Tokenizer
        return tok.to_str(), None, (), None
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is None:
        raise LmSourceError(f"tokenizer {type(tok).__name__} has no tokenizer.json form (a slow tokenizer); load "
                            "the fast one (AutoTokenizer.from_pretrained(..., use_fast=True))")
    return (backend.to_str(), _template(getattr(tok, "chat_template", None)), _ids(tok.eos_token_id),
            tok.bos_token_id)
