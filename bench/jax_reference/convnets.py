"""ResNet-18/50, MobileNetV2, EfficientNet-B0 and RegNetY-400MF in JAX, NHWC, BatchNorm folded into the convs.

Each builder reads a torch module of tests/zoo.py's (or bench/real_models.py's) architecture and returns
(params, fn): params a pytree of float64 numpy arrays (the caller casts them), fn(params, x) the forward.
The static layout (strides, paddings, groups, activations, residual flags) is read from the torch module
once and closed over; every array the forward uses comes from params.
"""

from __future__ import annotations

import jax
from torch import nn

from . import _layers as L
from . import _weights as W

__all__ = ["resnet", "mobilenet_v2", "efficientnet", "regnet_y"]

_ACT_NAMES = {nn.ReLU: "relu", nn.ReLU6: "relu6", nn.SiLU: "silu"}


def _conv_spec(conv: nn.Conv2d, act) -> tuple:
    assert conv.dilation == (1, 1) and conv.stride[0] == conv.stride[1] and conv.padding[0] == conv.padding[1]
    return conv.stride[0], conv.padding[0], conv.groups, act


def _act_name(module) -> str | None:
    return None if module is None else _ACT_NAMES[type(module)]


def _conv_bn(conv, bn, act=None):
    """(params, spec) of conv -> BN -> act."""
    return W.conv_bn(conv, bn), _conv_spec(conv, act)


def _cba(seq: nn.Sequential):
    """(params, spec) of a ConvBNAct (conv, BN, optional activation)."""
    return _conv_bn(seq[0], seq[1], _act_name(seq[2] if len(seq) > 2 else None))


def _run(x, p, spec, precision):
    stride, padding, groups, act = spec
    return L.ACTS[act](L.conv(x, p, stride, padding, groups, precision))


def _se(x, p, act, precision):
    """Squeeze-excite: the 1x1 convs act on the pooled (N, C) vector, so they are dense layers."""
    s = L.ACTS[act](L.dense(L.mean_hw(x), p["fc1"], precision))
    s = L.dense(s, p["fc2"], precision)
    return x * jax.nn.sigmoid(s)[:, None, None, :]


def _se_params(se) -> dict:
    as_dense = lambda c: {"w": W.hwio(c.weight)[0, 0], "b": W.vector(c.bias)}
    return {"fc1": as_dense(se.fc1), "fc2": as_dense(se.fc2)}


# ---------------------------------------------------------------------------------------------------- ResNet

def resnet(m, precision=None):
    """torchvision's ResNet: BasicBlock (two 3x3) or Bottleneck (1x1, 3x3 strided, 1x1 x4) stages."""
    stem_p, stem_s = _conv_bn(m.conv1, m.bn1, "relu")
    blocks_p, blocks_s = [], []
    for layer in (m.layer1, m.layer2, m.layer3, m.layer4):
        for blk in layer:
            names = ("conv1", "conv2", "conv3") if hasattr(blk, "conv3") else ("conv1", "conv2")
            convs = [_conv_bn(getattr(blk, c), getattr(blk, "bn" + c[-1]), "relu") for c in names]
            p = {"convs": [c[0] for c in convs]}
            s = {"convs": [c[1] for c in convs], "down": None}
            if blk.downsample is not None:
                p["down"], s["down"] = _conv_bn(blk.downsample[0], blk.downsample[1])
            blocks_p.append(p)
            blocks_s.append(s)
    params = {"stem": stem_p, "blocks": blocks_p, "fc": W.dense(m.fc)}

    def fn(params, x):
        x = L.max_pool(_run(x, params["stem"], stem_s, precision), 3, 2, 1)
        for p, s in zip(params["blocks"], blocks_s):
            identity = x if s["down"] is None else _run(x, p["down"], s["down"], precision)
            y = x
            last = len(s["convs"]) - 1
            for i, (cp, cs) in enumerate(zip(p["convs"], s["convs"])):
                y = _run(y, cp, cs if i < last else cs[:3] + (None,), precision)  # ReLU after the sum
            x = L.ACTS["relu"](y + identity)
        return L.dense(L.mean_hw(x), params["fc"], precision)

    return params, fn


# ------------------------------------------------------------------------------------------------ MobileNetV2

def mobilenet_v2(m, precision=None):
    """Inverted residuals: [1x1 expand ReLU6], 3x3 depthwise ReLU6, 1x1 linear projection; residual where
    stride 1 and widths match."""
    feats_p, feats_s = [], []
    for f in m.features:
        if isinstance(f, nn.Sequential):  # the stem and the last 1x1 (ConvBNAct)
            p, s = _cba(f)
            feats_p.append([p])
            feats_s.append(([s], False))
            continue
        seq = list(f.conv)
        ps, ss = [], []
        for sub in seq[:-2]:
            p, s = _cba(sub)
            ps.append(p)
            ss.append(s)
        p, s = _conv_bn(seq[-2], seq[-1])
        feats_p.append(ps + [p])
        feats_s.append((ss + [s], f.use_res_connect))
    params = {"features": feats_p, "fc": W.dense(m.classifier[1])}

    def fn(params, x):
        for ps, (ss, residual) in zip(params["features"], feats_s):
            y = x
            for p, s in zip(ps, ss):
                y = _run(y, p, s, precision)
            x = x + y if residual else y
        return L.dense(L.mean_hw(x), params["fc"], precision)

    return params, fn


# ---------------------------------------------------------------------------------------------- EfficientNet

def efficientnet(m, precision=None):
    """MBConv blocks: [1x1 expand SiLU], kxk depthwise SiLU, squeeze-excite (SiLU, sigmoid gate), 1x1 linear
    projection; residual where stride 1 and widths match (stochastic depth is the identity in eval)."""
    feats_p, feats_s = [], []
    for f in m.features:
        if isinstance(f, nn.Sequential):
            p, s = _cba(f)
            feats_p.append([p])
            feats_s.append(([s], False))
            continue
        ps, ss = [], []
        for sub in f.block:
            if isinstance(sub, nn.Sequential):
                p, s = _cba(sub)
            else:  # SqueezeExcitation
                p, s = _se_params(sub), ("se", _act_name(sub.activation))
            ps.append(p)
            ss.append(s)
        feats_p.append(ps)
        feats_s.append((ss, f.use_res_connect))
    params = {"features": feats_p, "fc": W.dense(m.classifier[1])}

    def fn(params, x):
        for ps, (ss, residual) in zip(params["features"], feats_s):
            y = x
            for p, s in zip(ps, ss):
                y = _se(y, p, s[1], precision) if s[0] == "se" else _run(y, p, s, precision)
            x = x + y if residual else y
        return L.dense(L.mean_hw(x), params["fc"], precision)

    return params, fn


# --------------------------------------------------------------------------------------------------- RegNetY

def regnet_y(m, precision=None):
    """Y blocks: 1x1 ReLU, 3x3 grouped (strided) ReLU, squeeze-excite (ReLU), 1x1 linear; ReLU(proj(x) + f(x))
    with proj a strided 1x1 conv + BN where the shape changes."""
    stem_p, stem_s = _cba(m.stem)
    blocks_p, blocks_s = [], []
    for stage in m.trunk_output:
        for blk in stage:
            f = list(blk.f)
            p = {"a": _cba(f[0])[0], "b": _cba(f[1])[0], "se": _se_params(f[2]), "c": _cba(f[3])[0]}
            s = {"a": _cba(f[0])[1], "b": _cba(f[1])[1], "se": _act_name(f[2].activation), "c": _cba(f[3])[1],
                 "proj": None}
            if blk.proj is not None:
                p["proj"], s["proj"] = _cba(blk.proj)
            blocks_p.append(p)
            blocks_s.append(s)
    params = {"stem": stem_p, "blocks": blocks_p, "fc": W.dense(m.fc)}

    def fn(params, x):
        x = _run(x, params["stem"], stem_s, precision)
        for p, s in zip(params["blocks"], blocks_s):
            y = _run(_run(x, p["a"], s["a"], precision), p["b"], s["b"], precision)
            y = _run(_se(y, p["se"], s["se"], precision), p["c"], s["c"], precision)
            shortcut = x if s["proj"] is None else _run(x, p["proj"], s["proj"], precision)
            x = L.ACTS["relu"](shortcut + y)
        return L.dense(L.mean_hw(x), params["fc"], precision)

    return params, fn
