"""The rest of the real-size families for bench/tpu_sweep.py: torchvision's own classification and
segmentation models (one per family, published width, random weights, BatchNorm statistics calibrated as
the test zoo does) and transformers' encoders at base size.

torchvision does not import in the project's venv (its ``_C`` links CUDA libraries; ARCHITECTURE.md), but
its model code is pure Python: the bench takes it from a side install that is not on the venv's path, made
by the bench on first use,

    .venv/bin/python -m pip install --no-deps --target .bench-venv-tv torchvision==0.28.0 pillow

and declares the two ops (``torchvision::nms``, ``qnms``) whose fake kernels torchvision registers at import
(no kernel: the classification and segmentation models never call them).
"""

from __future__ import annotations

import os
import sys

import torch
from torch import nn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tests import zoo  # noqa: E402

__all__ = ["TORCHVISION", "SEGMENTATION", "HF", "build_family", "TV_DIR"]

TV_DIR = os.path.join(ROOT, ".bench-venv-tv")
# one representative per torchvision family, at its published width; input side 224 unless given
TORCHVISION = {"alexnet": 224, "vgg11": 224, "resnext50_32x4d": 224, "wide_resnet50_2": 224, "squeezenet1_0": 224,
               "googlenet": 224, "inception_v3": 299, "shufflenet_v2_x1_0": 224, "mobilenet_v3_large": 224,
               "mnasnet1_0": 224, "efficientnet_v2_s": 224, "regnet_x_400mf": 224, "maxvit_t": 224,
               "tv_vit_b_16": 224, "swin_v2_t": 224}
SEGMENTATION = ["fcn_resnet50", "deeplabv3_mobilenet_v3_large", "lraspp_mobilenet_v3_large"]
HF = ["bert_base", "gpt2_base", "llama_768", "t5_base_encoder", "vit_base_hf", "whisper_base_encoder",
      "wav2vec2_base"]
_BIG = 10**11


def _torchvision():
    if "torchvision" in sys.modules:
        return sys.modules["torchvision"]
    if not os.path.isdir(os.path.join(TV_DIR, "torchvision")):  # the bench installs its side copy itself
        import subprocess

        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", TV_DIR,
                        "torchvision==0.28.0", "pillow"], check=True)
    lib = torch.library.Library("torchvision", "DEF")  # schemas only, for torchvision's register_fake calls
    for op in ("nms", "qnms"):
        lib.define(f"{op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _torchvision.lib = lib  # the definitions live as long as the Library object
    sys.path.insert(0, TV_DIR)
    import torchvision

    return torchvision


class OutTensor(nn.Module):
    """torchvision's segmentation models return {"out": ...}: the tensor alone."""

    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, x):
        return self.m(x)["out"]


class Hidden(nn.Module):
    """A transformers model's last hidden state (the encoder output), from positional inputs."""

    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, *args):
        return self.m(*args).last_hidden_state


def _tv(name: str):
    tv = _torchvision()
    size = TORCHVISION.get(name, 224)
    tv_name = name.removeprefix("tv_")
    kw = {"weights": None}
    if tv_name in ("googlenet", "inception_v3"):
        kw.update(init_weights=True, aux_logits=False)
    if name in SEGMENTATION:
        kw.update(weights_backbone=None)
        model = OutTensor(getattr(tv.models.segmentation, tv_name)(**kw))
    else:
        model = getattr(tv.models, tv_name)(**kw)
    with torch.no_grad():  # torchvision zero-initialises some heads (ViT's): an all-zero output checks nothing
        for p in model.parameters():
            if p.ndim >= 2 and not p.any():
                p.normal_(0.0, 0.02, generator=torch.Generator().manual_seed(p.numel()))
    args = (torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(1)),)
    return zoo._finalize(model, args, 0, _BIG), args


def _tokens(vocab: int, n: int = 128):
    return torch.randint(0, vocab, (1, n), generator=torch.Generator().manual_seed(2))


def _hf(name: str):
    import transformers as t

    torch.manual_seed(0)
    if name == "bert_base":
        from bench.real_models import build_real

        return build_real(name)
    if name == "gpt2_base":  # GPT2Config() is gpt2 (124M): 768 wide, 12 layers
        return Hidden(t.GPT2Model(t.GPT2Config()).eval()), (_tokens(50257),)
    if name == "llama_768":  # Llama's layer at BERT-base width (LlamaConfig() is 7B): 768, 12 layers, 4 KV heads
        cfg = t.LlamaConfig(hidden_size=768, intermediate_size=2048, num_hidden_layers=12, num_attention_heads=12,
                            num_key_value_heads=4, vocab_size=32000)
        return Hidden(t.LlamaModel(cfg).eval()), (_tokens(32000),)
    if name == "t5_base_encoder":  # t5-base: d_model 768, d_ff 3072, 12 layers, 12 heads
        cfg = t.T5Config(d_model=768, d_ff=3072, num_layers=12, num_heads=12, d_kv=64)
        return Hidden(t.T5EncoderModel(cfg).eval()), (_tokens(32128),)
    if name == "vit_base_hf":  # ViTConfig() is vit-base-patch16-224
        px = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(1))
        return Hidden(t.ViTModel(t.ViTConfig(), add_pooling_layer=False).eval()), (px,)
    if name == "whisper_base_encoder":  # whisper-base: d_model 512, 6 layers, 8 heads, 30 s of 80 mel bins
        cfg = t.WhisperConfig(d_model=512, encoder_layers=6, encoder_attention_heads=8, encoder_ffn_dim=2048,
                              decoder_layers=6, decoder_attention_heads=8, decoder_ffn_dim=2048, num_mel_bins=80)
        enc = t.WhisperModel(cfg).get_encoder().eval()
        return Hidden(enc), (torch.randn(1, 80, 3000, generator=torch.Generator().manual_seed(1)),)
    if name == "wav2vec2_base":  # Wav2Vec2Config() is wav2vec2-base: 768 wide, 12 layers; 1 s at 16 kHz
        m = t.Wav2Vec2Model(t.Wav2Vec2Config()).eval()
        return Hidden(m), (torch.randn(1, 16000, generator=torch.Generator().manual_seed(1)),)
    raise KeyError(name)


def build_family(name: str) -> tuple[nn.Module, tuple]:
    """(model in eval, sample args) for a name in TORCHVISION, SEGMENTATION or HF."""
    if name in HF:
        return _hf(name)
    if name in TORCHVISION or name in SEGMENTATION:
        return _tv(name)
    raise KeyError(f"unknown model {name!r}: one of {list(TORCHVISION) + SEGMENTATION + HF}")
