"""Test-only builders of tiny causal LMs saved as real Hugging Face model directories (shared by the LLM tests).

    path = save_model_dir("llama", tmp_path / "llama")  # config.json, model.safetensors, generation_config.json,
    # tokenizer.json, tokenizer_config.json and chat_template.jinja (transformers 5 saves the template there)
    model = transformers.AutoModelForCausalLM.from_pretrained(path)

Every architecture is random-initialised from a fixed seed (the same weights every call) and tiny (vocab 256,
hidden 64, 2 layers, GQA 4 query / 2 KV heads), so a test converts and generates in seconds. The tokenizer is a
byte-level BPE trained here, in code, on a fixed text (nothing downloaded), with the special tokens the configs
name: ``<pad>`` 0, ``<bos>`` 1, ``<eos>`` 2, ``<unk>`` 3; like Qwen2's it adds no ``<bos>`` (the chat template
does not either). ``transformers.AutoTokenizer.from_pretrained(path)`` gives the same ids as tokenizer.json for
every architecture here.
"""

from __future__ import annotations

import pathlib

__all__ = ["ARCHS", "CHAT_TEMPLATE", "SPECIAL", "TEXT", "VOCAB", "greedy_reference", "model_class", "save_lm_dir",
           "save_model_dir", "tiny_config", "tiny_model", "tiny_tokenizer"]

VOCAB = 256
SPECIAL = {"pad": ("<pad>", 0), "bos": ("<bos>", 1), "eos": ("<eos>", 2), "unk": ("<unk>", 3)}

_TINY = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=256, pad_token_id=0, bos_token_id=1, eos_token_id=2,
             tie_word_embeddings=False)

# what each config adds over Llama; windows of 8 tokens so that a prompt of 11 + 32 new tokens runs far past them
ARCHS = {
    "llama": ("Llama", {}),  # GQA, RoPE
    "llama3_rope": ("Llama", {"rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                                  "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                  "original_max_position_embeddings": 16}}),  # RoPE scaling
    "qwen2": ("Qwen2", {}),  # QKV bias
    "qwen3": ("Qwen3", {"head_dim": 16}),  # QK norm
    "phi3": ("Phi3", {"sliding_window": 8}),  # fused qkv / gate_up, every layer slides
    "gemma3": ("Gemma3Text", {"head_dim": 16, "sliding_window": 8, "tie_word_embeddings": True,  # scaled tied
                              "layer_types": ["sliding_attention", "full_attention"]}),  # embeddings, mixed layers
    "mixtral": ("Mixtral", {"num_local_experts": 4, "num_experts_per_tok": 2}),  # top-2 of 4 experts
}

# a plain-text chat template (no special tokens)
CHAT_TEMPLATE = ("{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant:{% endif %}")

TEXT = ("the quick brown fox jumps over the lazy dog. a tiny model reads a tiny text and writes it back. "
        "hello world, hello tokens, hello cache. user: what is the weather? assistant: it is sunny today. "
        "the cache holds keys and values; the decoder reads them one token at a time. 0123456789 ") * 4


def _arch(arch: str):
    if arch not in ARCHS:
        raise ValueError(f"unknown test architecture {arch!r}: one of {sorted(ARCHS)}")
    return ARCHS[arch]


def tiny_config(arch: str):
    """The transformers config of the tiny ``arch`` (a key of ARCHS)."""
    import transformers

    prefix, extra = _arch(arch)
    return getattr(transformers, f"{prefix}Config")(**{**_TINY, **extra})


def model_class(arch: str):
    import transformers

    prefix, _ = _arch(arch)
    return getattr(transformers, "Gemma3ForCausalLM" if prefix == "Gemma3Text" else f"{prefix}ForCausalLM")


def tiny_model(arch: str, seed: int = 0):
    """The tiny ``arch`` model, random-initialised from ``seed`` (the same weights every call), in eval mode."""
    import torch

    with torch.random.fork_rng(devices=[]):  # leaves the caller's global RNG as it was
        torch.manual_seed(seed)
        return model_class(arch)(tiny_config(arch)).eval()


# Qwen2's pre-tokenizer split: transformers 5's AutoTokenizer rebuilds a Qwen2 directory's tokenizer with it
# (Qwen2Tokenizer, whatever tokenizer.json says), so the same split everywhere keeps every architecture's
# AutoTokenizer equal to tokenizer.json (what LiteRT-LM's engine reads)
_SPLIT = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
          r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")


def tiny_tokenizer():
    """A PreTrainedTokenizerFast: byte-level BPE (Qwen2's layout, no <bos> added) trained on TEXT to VOCAB
    entries over the printable ASCII alphabet, special tokens as SPECIAL, CHAT_TEMPLATE set."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = [tok for tok, _ in sorted(SPECIAL.values(), key=lambda s: s[1])]
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(_SPLIT), behavior="isolated"),
                                                 byte_level])
    tok.decoder = decoders.ByteLevel()
    ascii_chars = "\t\n" + "".join(chr(c) for c in range(32, 127))  # any ASCII prompt tokenizes
    alphabet = [byte_level.pre_tokenize_str(c)[0][0] for c in ascii_chars]
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=specials, initial_alphabet=alphabet,
                                  show_progress=False)
    tok.train_from_iterator([TEXT], trainer=trainer)
    assert tok.get_vocab_size() <= VOCAB and all(tok.token_to_id(t) == i for t, i in SPECIAL.values())
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, **{f"{k}_token": t for k, (t, _) in SPECIAL.items()})
    fast.chat_template = CHAT_TEMPLATE
    return fast


def save_model_dir(arch: str, path, seed: int = 0) -> pathlib.Path:
    """Write the tiny ``arch`` model as a Hugging Face model directory at ``path`` (created) and return it:
    config.json, model.safetensors, generation_config.json, tokenizer.json, tokenizer_config.json,
    chat_template.jinja."""
    return save_lm_dir(tiny_model(arch, seed), path)


def save_lm_dir(model, path) -> pathlib.Path:
    """Write any causal LM over VOCAB ids as save_model_dir does: its weights and config, a generation config
    with SPECIAL's ids and tiny_tokenizer()."""
    import transformers

    path = pathlib.Path(path)
    path.mkdir(parents=True, exist_ok=True)
    ids = {k: i for k, (_, i) in SPECIAL.items()}
    model.generation_config = transformers.GenerationConfig(bos_token_id=ids["bos"], eos_token_id=ids["eos"],
                                                            pad_token_id=ids["pad"])
    model.save_pretrained(path, safe_serialization=True)
    tiny_tokenizer().save_pretrained(path)
    return path


def greedy_reference(model_dir, prompt: str, new_tokens: int) -> dict:
    """transformers' own greedy continuation of ``prompt`` from a saved directory: {"tokens", "text"} (special
    tokens kept in the text, as the LiteRT-LM engine prints them). Asserts no early stop, so a comparison covers
    all ``new_tokens``."""
    import torch
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir).eval()
    ids = tok(prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        new = model.generate(ids, do_sample=False, max_new_tokens=new_tokens)[0, ids.shape[1]:].tolist()
    assert len(new) == new_tokens  # no early eos
    return {"tokens": new, "text": tok.decode(new, skip_special_tokens=False)}
