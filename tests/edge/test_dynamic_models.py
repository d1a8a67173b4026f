"""Models whose sequence length, audio length or image size varies at run time, on the edge.

Each model (tiny, seeded config) is converted once with its dims dynamic, then run by one
``litert_torch.Model`` at three or more sizes, the range's ends among them, and compared with torch
eager (rel err <= 1e-4). The .tflite marks every dynamic dim -1 in its shape_signature, and a size
outside the exported range is refused before the interpreter runs.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.numerics import rel_err
from tests.zoo import NamedX, WhisperFrames

pytestmark = [pytest.mark.slow]

Dim = torch.export.Dim
RTOL = 1e-4


def _convert(module, kwargs, dyn, **kw):
    from tpu_export import litert_torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return litert_torch.convert(module.eval(), (), kwargs, dynamic_shapes=dyn, **kw)


def _first(out):
    if isinstance(out, dict):
        return next(iter(out.values()))
    if isinstance(out, (tuple, list)):
        return out[0]
    return getattr(out, "last_hidden_state", None) if hasattr(out, "last_hidden_state") else out


def _check(module, make, sizes, dyn, *, ref=None, model=None):
    """Convert at sizes[0]'s inputs (``make(*size)`` -> kwargs) and compare at every size."""
    model = model or _convert(module, make(*sizes[0]), dyn)
    ref = ref or (lambda **kw: _first(module(**kw)))
    for size in sizes:
        kw = make(*size)
        with torch.no_grad():
            want = ref(**kw)
        got = _first(model(**kw))
        assert tuple(got.shape) == tuple(want.shape), (size, got.shape, want.shape)
        err = rel_err(np.asarray(got, np.float64), want.double().numpy())
        assert err <= RTOL, f"{type(module).__name__} at {size}: rel err {err:.3g}"
    return model


def _ids(vocab, pad_tail=True):
    def make(b, s):
        g = torch.Generator().manual_seed(b * 1000 + s)
        ids = torch.randint(0, vocab, (b, s), generator=g)
        mask = torch.ones(b, s, dtype=torch.long)
        if pad_tail and b > 1:
            mask[1:, s - s // 3:] = 0  # later rows padded at the end
        return {"input_ids": ids, "attention_mask": mask}
    return make


def _text_dims(min_s=2, max_s=64):
    b, s = Dim("batch", min=1, max=4), Dim("seq", min=min_s, max=max_s)
    return {"input_ids": {0: b, 1: s}, "attention_mask": {0: b, 1: s}}


SEQ_SIZES = [(2, 9), (1, 2), (4, 64), (3, 17)]  # the sample first, then the range's ends and a middle size


def _tiny(cls_cfg, **kw):
    torch.manual_seed(0)
    cfg_cls, model_cls = cls_cfg
    cfg = cfg_cls(**kw)
    cfg._attn_implementation = "sdpa"
    return model_cls(cfg).eval()


def test_bert_dynamic_batch_and_seq():
    from transformers import BertConfig, BertModel

    m = _tiny((BertConfig, BertModel), vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
              intermediate_size=64, max_position_embeddings=64)
    model = _check(m, _ids(100), SEQ_SIZES, _text_dims())
    import ai_edge_litert.interpreter as tfl

    it = tfl.Interpreter(model_content=model.tflite_model())
    assert [list(d["shape_signature"]) for d in it.get_input_details()] == [[-1, -1], [-1, -1]]
    # outside the exported range: one line naming the input and the range, before the interpreter runs
    with pytest.raises(ValueError, match="input_ids"):
        model(**_ids(100)(2, 65))


def test_distilbert_dynamic_batch_and_seq():
    from transformers import DistilBertConfig, DistilBertModel

    m = _tiny((DistilBertConfig, DistilBertModel), vocab_size=100, dim=32, n_layers=2, n_heads=4, hidden_dim=64,
              max_position_embeddings=64)
    _check(m, _ids(100), SEQ_SIZES, _text_dims())


def test_gpt2_dynamic_batch_and_seq():
    from transformers import GPT2Config, GPT2Model

    m = _tiny((GPT2Config, GPT2Model), vocab_size=100, n_embd=32, n_layer=2, n_head=4, n_positions=64, use_cache=False)
    _check(m, _ids(100, pad_tail=False), SEQ_SIZES, _text_dims())


def test_llama_dynamic_batch_and_seq():
    from transformers import LlamaConfig, LlamaModel

    m = _tiny((LlamaConfig, LlamaModel), vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, intermediate_size=64, max_position_embeddings=64, use_cache=False)
    _check(m, _ids(100, pad_tail=False), SEQ_SIZES, _text_dims())


def test_t5_encoder_dynamic_batch_and_seq():
    from transformers import T5Config, T5EncoderModel

    m = _tiny((T5Config, T5EncoderModel), vocab_size=100, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
              relative_attention_num_buckets=8, relative_attention_max_distance=16)
    _check(m, _ids(100), SEQ_SIZES, _text_dims())


def test_whisper_encoder_dynamic_frames():
    from transformers import WhisperConfig
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    enc = _tiny((WhisperConfig, WhisperEncoder), num_mel_bins=8, d_model=32, encoder_layers=2,
                encoder_attention_heads=4, encoder_ffn_dim=64, max_source_positions=64)
    m = WhisperFrames(enc).eval()

    def make(b, frames):
        g = torch.Generator().manual_seed(b * 1000 + frames)
        return {"input_features": torch.randn(b, 8, frames, generator=g)}

    # conv2 has stride 2: frames are a multiple of 2, at most 2 * max_source_positions
    half = Dim("half", min=2, max=64)
    dyn = {"input_features": {0: Dim("batch", min=1, max=4), 2: 2 * half}}
    with torch.no_grad():  # at the full length it is transformers' own encoder
        full = make(1, 128)
        assert torch.equal(m(**full), enc(**full).last_hidden_state)
    _check(m, make, [(2, 40), (1, 4), (4, 128), (3, 58)], dyn)


def test_wav2vec2_dynamic_samples():
    from transformers import Wav2Vec2Config, Wav2Vec2Model

    m = _tiny((Wav2Vec2Config, Wav2Vec2Model), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
              intermediate_size=64, conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3),
              num_conv_pos_embeddings=8, num_conv_pos_embedding_groups=4, do_stable_layer_norm=True,
              feat_extract_norm="layer", apply_spec_augment=False)

    def make(b, n):
        g = torch.Generator().manual_seed(b * 1000 + n)
        return {"input_values": torch.randn(b, n, generator=g)}

    dyn = {"input_values": {0: Dim("batch", min=1, max=4), 1: Dim("samples", min=400, max=4000)}}
    _check(m, make, [(2, 1600), (1, 400), (4, 4000), (3, 2345)], dyn)


# ------------------------------------------------------------------ images: height and width


class TinyUNet(nn.Module):
    """Two down, two up, skip connections: the output has the input's height and width (multiples of 4)."""

    def __init__(self):
        super().__init__()
        c = lambda i, o: nn.Sequential(nn.Conv2d(i, o, 3, padding=1), nn.BatchNorm2d(o), nn.ReLU())  # noqa: E731
        self.d1, self.d2, self.mid = c(3, 8), c(8, 16), c(16, 16)
        self.up2 = nn.ConvTranspose2d(16, 16, 2, stride=2)
        self.u2 = c(32, 8)
        self.u1 = c(16, 8)
        self.head = nn.Conv2d(8, 2, 1)

    def forward(self, x):
        a = self.d1(x)
        b = self.d2(F.max_pool2d(a, 2))
        m = self.mid(F.max_pool2d(b, 2))
        y = self.u2(torch.cat([F.interpolate(m, size=b.shape[-2:], mode="bilinear", align_corners=False), b], 1))
        y = self.u1(torch.cat([F.interpolate(y, scale_factor=2, mode="nearest"), a], 1))
        return self.head(y)


def _image_sizes(name):
    # (batch, height, width): the sample first, then the range's ends and one mixed size
    # (torch.export specializes a sample size of 1: the sample has batch 2)
    return [(2, 64, 64), (1, 32, 32), (2, 128, 96), (1, 48, 80)] if name != "unet" else \
        [(2, 32, 32), (1, 16, 16), (2, 128, 96), (1, 48, 80)]


@pytest.mark.parametrize("name", ["deeplabv3", "lraspp", "unet"])
def test_fully_convolutional_dynamic_height_width(name):
    from tests.zoo import build

    if name == "unet":
        torch.manual_seed(0)
        m = TinyUNet().eval()
    else:
        m, _ = build(name)

    def make(b, h, w):
        return {"x": torch.randn(b, 3, h, w, generator=torch.Generator().manual_seed(h * w + b))}

    q = 4 if name == "unet" else 16  # the models' total stride: sizes are multiples of it
    hq, wq = Dim("hq", min=32 // q if name != "unet" else 4, max=128 // q), Dim("wq", min=32 // q if name != "unet"
                                                                              else 4, max=128 // q)
    dyn = {"x": {0: Dim("batch", min=1, max=2), 2: q * hq, 3: q * wq}}

    _check(NamedX(m).eval(), make, _image_sizes(name), dyn)


class _Upsample(nn.Module):
    """Bilinear upsampling by an integer factor k of a dynamic size: ``size=x.shape[-2:]`` from a stride-k
    feature map, or ``scale_factor=k``."""

    def __init__(self, k, by_size):
        super().__init__()
        self.k, self.by_size = k, by_size

    def forward(self, x):
        if self.by_size:
            return F.interpolate(F.avg_pool2d(x, self.k), size=x.shape[-2:], mode="bilinear", align_corners=False)
        return F.interpolate(x, scale_factor=self.k, mode="bilinear", align_corners=False)


@pytest.mark.parametrize("k,by_size,channels", [(8, True, 3), (2, True, 12), (3, False, 3), (2, True, 16)])
def test_dynamic_integer_upsampling_runs_in_xnnpack_ops(k, by_size, channels):
    """A resize of up to 12 channels to a dynamic size k times the input's is written as edge pad + channel
    copies + 3-tap depthwise filters + DEPTH_TO_SPACE (XNNPACK delegates RESIZE_BILINEAR only with a constant
    size); more channels keep RESIZE_BILINEAR. The file matches torch at every size with XNNPACK and with the
    builtin kernels alone."""
    import ai_edge_litert.interpreter as tfl

    from tpu_export.edge.inspect import op_histogram

    q = k if by_size else 1
    dyn = {"x": {0: Dim("batch", min=1, max=3), 2: q * Dim("hq", min=1, max=64 // q),
                 3: q * Dim("wq", min=1, max=64 // q)}}

    def make(b, h, w):
        return {"x": torch.randn(b, channels, h, w, generator=torch.Generator().manual_seed(b * h * w))}

    sizes = [(2, 2 * q, 3 * q), (1, q, q), (3, 64 // q * q, 64 // q * q), (1, 5 * q, 2 * q)]
    module = NamedX(_Upsample(k, by_size)).eval()
    model = _check(module, make, sizes, dyn)
    hist = op_histogram(model.tflite_model())
    if channels <= 12:
        assert "RESIZE_BILINEAR" not in hist and hist.get("DEPTH_TO_SPACE") == 1, hist
    else:
        assert hist.get("RESIZE_BILINEAR") == 1 and "DEPTH_TO_SPACE" not in hist, hist
    it = tfl.Interpreter(model_content=model.tflite_model(),
                         experimental_op_resolver_type=tfl.OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    for size in sizes:
        x = make(*size)["x"]
        it.resize_tensor_input(it.get_input_details()[0]["index"], list(x.shape), strict=True)
        it.allocate_tensors()
        it.set_tensor(it.get_input_details()[0]["index"], x.numpy())
        it.invoke()
        with torch.no_grad():
            want = module(x=x).double().numpy()
        err = rel_err(it.get_tensor(it.get_output_details()[0]["index"]).astype(np.float64), want)
        assert err <= RTOL, f"k={k} at {size} (builtin kernels): rel err {err:.3g}"


# measured here (max over the sizes): dynamic_int8 1.2e-2 (the depthwise taps quantized to int8), static_int8
# 0.107 (int8 activations through the copies; on the zoo's LR-ASPP 0.141 with these ops or RESIZE_BILINEAR)
UPSAMPLING_QUANT_RTOL = {"dynamic_int8": 2e-2, "static_int8": 0.2}


@pytest.mark.parametrize("scheme", sorted(UPSAMPLING_QUANT_RTOL))
def test_dynamic_integer_upsampling_quantized(scheme):
    """The upsampling's ops quantize and run at every size (a wrong graph reads rel err ~1)."""
    dyn = {"x": {0: Dim("batch", min=1, max=2), 2: 8 * Dim("hq", min=1, max=8), 3: 8 * Dim("wq", min=1, max=8)}}

    def make(b, h, w):
        return {"x": torch.randn(b, 5, h, w, generator=torch.Generator().manual_seed(b * h * w))}

    module = NamedX(_Upsample(8, True)).eval()
    cal = {"calibration_data": [make(1, 8, 8), make(2, 64, 48), make(2, 16, 24)]} if scheme == "static_int8" else {}
    model = _convert(module, make(2, 16, 24), dyn, quant_config=scheme, **cal)
    for size in [(2, 16, 24), (1, 8, 8), (2, 64, 40)]:
        kw = make(*size)
        with torch.no_grad():
            want = module(**kw)
        err = rel_err(np.asarray(_first(model(**kw)), np.float64), want.double().numpy())
        assert err <= UPSAMPLING_QUANT_RTOL[scheme], f"{scheme} at {size}: rel err {err:.3g}"


class _SameSizeView(nn.Module):
    def forward(self, x):
        y = torch.matmul(x, x.transpose(-1, -2))
        return y.view(x.shape[0], 3, x.shape[2], x.shape[2]) + 1


def test_view_to_the_same_dynamic_sizes_writes_no_reshape():
    """A view to the sizes its input already has (two dynamic dims) is the input itself: no RESHAPE with a
    run-time shape operand, which XNNPACK would leave to the builtin kernels."""
    from tpu_export.edge.inspect import op_histogram

    def make(b, s):
        return {"x": torch.randn(b, 3, s, 4, generator=torch.Generator().manual_seed(b * s))}

    model = _check(_SameSizeView(), make, [(2, 6), (1, 2), (4, 8), (3, 5)],
                   {"x": {0: Dim("batch", min=1, max=4), 2: Dim("seq", min=2, max=8)}})
    assert "RESHAPE" not in op_histogram(model.tflite_model())


def test_vit_dynamic_batch():
    from tests.zoo import build

    m, (x,) = build("vit")

    def make(b):
        return {"x": torch.randn(b, *x.shape[1:], generator=torch.Generator().manual_seed(b))}

    _check(NamedX(m).eval(), make, [(2,), (1,), (16,), (5,)], {"x": {0: Dim("batch", min=1, max=16)}})


# quantized: the dims stay dynamic (shape_signature -1) and the model runs at every size. Bounds against
# torch eager; measured on this tiny BERT (max over the sizes): dynamic_int8 4.6e-4, weight_only_int8 3.1e-4,
# fp16 1.1e-5
QUANT_RTOL = {"dynamic_int8": 2e-3, "weight_only_int8": 2e-3, "fp16": 1e-4}
QUANT_TYPE = {"dynamic_int8": np.int8, "weight_only_int8": np.int8, "fp16": np.float16}


@pytest.mark.parametrize("scheme", sorted(QUANT_RTOL))
def test_quantized_model_keeps_dynamic_dims(scheme):
    import ai_edge_litert.interpreter as tfl
    from transformers import BertConfig, BertModel

    m = _tiny((BertConfig, BertModel), vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
              intermediate_size=128, max_position_embeddings=64)
    make = _ids(100)
    model = _convert(m, make(2, 9), _text_dims(), quant_config=scheme)
    it = tfl.Interpreter(model_content=model.tflite_model())
    assert [list(d["shape_signature"]) for d in it.get_input_details()] == [[-1, -1], [-1, -1]]
    assert list(it.get_output_details()[0]["shape_signature"])[:2] == [-1, -1]
    assert any(t["dtype"] == QUANT_TYPE[scheme] for t in it.get_tensor_details()), scheme  # really quantized
    for size in [(1, 2), (4, 64), (3, 17)]:
        kw = make(*size)
        with torch.no_grad():
            want = m(**kw).last_hidden_state
        got = _first(model(**kw))
        err = rel_err(np.asarray(got, np.float64), want.double().numpy())
        assert tuple(got.shape) == tuple(want.shape) and err <= QUANT_RTOL[scheme], f"{scheme} at {size}: {err:.3g}"
