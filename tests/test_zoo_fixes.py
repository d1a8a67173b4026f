"""Patterns from timm / transformers classification models that failed the zoo sweep (bench/zoo_sweep.py),
each as a tiny model built from code with seeded weights, converted to both outputs and run on the real runtimes
(the LiteRT interpreter, PJRT CPU) against torch eager:

- CrossViT resizes its second branch's image with a bicubic ``F.interpolate`` inside a helper function; torch
  decomposes the resize into 16 ``x[:, :, rows[:, None], cols]`` index ops (index tensors on two adjacent
  inner dims) that the edge backend refused;
- CSATv2's spatial attention pools a 32x32 map with ``AdaptiveAvgPool2d((7, 7))``: windows of uneven sizes;
- EfficientNet (transformers) ends with ``AvgPool2d(hidden_dim, ceil_mode=True)``: a 2560-wide window over a
  19x19 map, which the edge backend padded out to the window ([1, 2560, 2560, 2560]).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.numerics import rel_err

TOL = 1e-5  # float32 through XNNPACK / XLA:CPU, these models' few layers


def _convert_both(model, x, tmp_path):
    """(the .tflite's bytes, its output, the StableHLO artifact's output) for input x."""
    import tpu_export
    from tpu_export import tpu_backend

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        written = tpu_export.convert(model, (x,), targets=["cpu", "cpu-xla"], out_dir=str(tmp_path))
    from ai_edge_litert.interpreter import Interpreter

    data = open(written["cpu"], "rb").read()
    runner = Interpreter(model_content=data).get_signature_runner()
    (name,) = runner.get_input_details()
    outs = runner(**{name: x.numpy()})
    edge = np.asarray(outs[sorted(outs)[0]])
    tpu = tpu_backend.load(written["cpu-xla"])(x.numpy())
    tpu = np.asarray(tpu[0] if isinstance(tpu, (list, tuple)) else tpu)
    return data, edge, tpu


def _check(model, x, tmp_path):
    model = model.eval()
    with torch.no_grad():
        want = model(x).numpy()
    assert np.abs(want).max() > 1e-2, "the reference output vanishes: the comparison would prove nothing"
    data, edge, tpu = _convert_both(model, x, tmp_path)
    assert edge.shape == want.shape and tpu.shape == want.shape
    assert rel_err(edge, want) <= TOL, rel_err(edge, want)
    assert rel_err(tpu, want) <= TOL, rel_err(tpu, want)
    return data


def _largest_tensor(data: bytes) -> int:
    from ai_edge_litert.interpreter import Interpreter

    return max(int(np.prod(t["shape"])) for t in Interpreter(model_content=data).get_tensor_details())


def _scale(x, size):  # a helper outside forward, as timm's crossvit.scale_image
    return F.interpolate(x, size=size, mode="bicubic", align_corners=False)


class _TwoScales(nn.Module):
    """CrossViT's stem: the image and its bicubic-resized copy, each patch-embedded."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.big = nn.Conv2d(3, 8, 4, 4)
        self.small = nn.Conv2d(3, 8, 4, 4)

    def forward(self, x):
        a = self.big(x).flatten(2).mean(-1)
        b = self.small(_scale(x, (16, 16))).flatten(2).mean(-1)
        return torch.cat([a, b], 1)


def test_bicubic_resize_in_a_helper_is_one_gather_per_indexed_dim(tmp_path):
    from tpu_export.edge.inspect import op_histogram

    x = torch.randn(1, 3, 20, 20, generator=torch.Generator().manual_seed(1))
    hist = op_histogram(_check(_TwoScales(), x, tmp_path))
    # 16 taps, each x[:, :, rows[:, None], cols]: a GATHER over H, then one over W
    assert hist.get("GATHER") == 32 and "GATHER_ND" not in hist, hist


class _SpatialAttention(nn.Module):
    """CSATv2's SpatialAttention front: channel mean and max, pooled to 7x7 from a size 7 does not divide."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.pool = nn.AdaptiveAvgPool2d((7, 7))
        self.conv = nn.Conv2d(2, 1, 7, padding=3)

    def forward(self, x):
        x = torch.cat([x.mean(1, keepdim=True), x.amax(1, keepdim=True)], 1)
        return self.conv(self.pool(x))


def test_adaptive_pool_to_a_size_that_does_not_divide(tmp_path):
    x = torch.randn(1, 4, 32, 30, generator=torch.Generator().manual_seed(1))
    _check(_SpatialAttention(), x, tmp_path)


class _EfficientNetHead(nn.Module):
    """transformers' EfficientNet top: conv, BN, swish, AvgPool2d(hidden_dim, ceil_mode=True) (a window wider
    than the map), reshape to [N, C], linear."""

    def __init__(self, hidden=32, pool=nn.AvgPool2d):
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, hidden, 3, 2, 1, bias=False)
        self.bn = nn.BatchNorm2d(hidden)
        self.bn.running_mean.normal_()
        self.bn.running_var.uniform_(0.5, 2.0)
        self.pool = pool(hidden, ceil_mode=True)
        self.fc = nn.Linear(hidden, 5)

    def forward(self, x):
        y = self.pool(F.silu(self.bn(self.conv(x))))
        return self.fc(y.reshape(y.shape[:2]))


@pytest.mark.parametrize("pool", [nn.AvgPool2d, nn.MaxPool2d], ids=["mean", "max"])
def test_pool_window_wider_than_the_map_reads_only_the_map(tmp_path, pool):
    x = torch.randn(1, 3, 10, 14, generator=torch.Generator().manual_seed(1))
    data = _check(_EfficientNetHead(pool=pool), x, tmp_path)
    # the pooled map is [1, 32, 5, 7]; padding it out to the 32-wide window wrote a [1, 32, 32, 32] PAD
    assert _largest_tensor(data) <= 32 * 5 * 7, "the pool's input was padded out to its window"


@pytest.mark.slow
def test_transformers_efficientnet_tiny_config(tmp_path):
    transformers = pytest.importorskip("transformers")
    config = transformers.EfficientNetConfig(image_size=64, width_coefficient=0.25, depth_coefficient=0.25,
                                             hidden_dim=320, num_labels=7)
    torch.manual_seed(0)
    hf = transformers.EfficientNetForImageClassification(config).eval()
    # transformers' init (std 0.02 convolutions, zero BN shifts) shrinks the activations ~1e-9x per block, to
    # exact zeros at the logits: weights of unit gain instead, and BN statistics that are not the identity
    for m in hf.modules():
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            fan_in = m.weight[0].numel()
            nn.init.normal_(m.weight, std=fan_in ** -0.5)
        elif isinstance(m, nn.BatchNorm2d):
            m.running_mean.normal_(0, 0.1)
            m.running_var.uniform_(0.5, 1.5)
            nn.init.normal_(m.bias, std=0.1)

    class Logits(nn.Module):
        def __init__(self):
            super().__init__()
            self.m = hf

        def forward(self, x):
            return self.m(pixel_values=x).logits

    x = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    data = _check(Logits(), x, tmp_path)
    assert _largest_tensor(data) < 320 * 320, "the final pool's input was padded out to its 320-wide window"


def _positives(x):  # a helper outside forward, as timm's crossvit.scale_image
    return x[x > 0]


class _CallsHelper(nn.Module):
    def forward(self, x):
        return _positives(x * 2).sum()


def test_refusal_names_the_line_in_the_helper_that_calls_the_op(tmp_path):
    """Non-strict torch.export records only the frames of forward functions; the capture keeps the innermost
    user frame too, so an op the edge backend refuses (a boolean mask: a data-dependent shape) is reported at
    the helper's line, not at the forward line that calls the helper."""
    import tpu_export
    from tpu_export.converter.errors import UnsupportedOpsError

    with pytest.raises(UnsupportedOpsError) as e:
        tpu_export.convert(_CallsHelper().eval(), (torch.randn(3, 4),), targets=["cpu"], out_dir=str(tmp_path))
    msg = str(e.value)
    assert "aten.index.Tensor" in msg and "in _positives: return x[x > 0]" in msg, msg


def _with_activation_shapes(data: bytes, tensors, shape) -> bytes:
    import flatbuffers
    from ai_edge_litert import schema_py_generated as s

    m = s.ModelT.InitFromPackedBuf(data, 0)
    for t in tensors(m.subgraphs[0]):
        m.subgraphs[0].tensors[t].shape = list(shape)
    b = flatbuffers.Builder(len(data) + 1024)
    b.Finish(m.Pack(b), file_identifier=b"TFL3")
    return bytes(b.Output())


class _Chain(nn.Module):
    def forward(self, x):
        ys = [x]
        for k in range(8):
            ys.append(torch.tanh(ys[-1] * (k + 2)))
        return ys[-1] if self.last_only else tuple(ys[1:])

    def __init__(self, last_only):
        super().__init__()
        self.last_only = last_only


def test_the_activation_limit_counts_the_tensors_live_at_once():
    """deepseek_vit_412m (32 layers at 546 px) declares 20 GiB of activations in all, 0.3 GiB live at a time:
    the file check bounds what the interpreter's arena holds at once, not the sum. Each tensor here is declared
    3 GiB (the check reads shapes; nothing runs): a chain of them, at most 2 live at once, passes; eight
    outputs, all live at the end, are refused."""
    from tpu_export import litert_torch
    from tpu_export.edge.tflite_check import TfliteFormatError, check_tflite

    gib3 = (3 << 28,)  # 3 GiB of float32
    x = torch.randn(4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        chain = litert_torch.convert(_Chain(True).eval(), (x,)).tflite_model()
        fan = litert_torch.convert(_Chain(False).eval(), (x,)).tflite_model()

    def activations(sg):
        return {t for op in sg.operators for t in op.outputs} | set(sg.inputs)

    check_tflite(_with_activation_shapes(chain, activations, gib3), "chain.tflite")
    with pytest.raises(TfliteFormatError, match="GiB of activations at once"):
        check_tflite(_with_activation_shapes(fan, lambda sg: set(sg.outputs), gib3), "fan.tflite")
