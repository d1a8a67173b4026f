"""ConvNeXt in JAX, NHWC: the channels-last LayerNorm and Linear layers of a CNBlock need no permutes here."""

from __future__ import annotations

from . import _layers as L
from . import _weights as W

__all__ = ["convnext"]


def _gelu_name(gelu) -> str:
    return "gelu_tanh" if gelu.approximate == "tanh" else "gelu"


def convnext(m, precision=None):
    """Stem (4x4/4 conv, LayerNorm), stages of CNBlocks (7x7 depthwise conv, LayerNorm, Linear x4, GELU,
    Linear, per-channel layer scale, residual), LayerNorm + 2x2/2 conv between stages, then mean-pool,
    LayerNorm and the classifier."""
    stages_p, stages_s = [], []
    for seq in m.features:
        first = seq[0]
        if hasattr(first, "layer_scale"):  # a stage of CNBlocks
            ps, ss = [], []
            for blk in seq:
                dw, ln, fc1, gelu, fc2 = blk.block[0], blk.block[2], blk.block[3], blk.block[4], blk.block[5]
                ps.append({"dw": W.conv_bias(dw), "ln": W.layer_norm(ln), "fc1": W.dense(fc1), "fc2": W.dense(fc2),
                           "scale": W.vector(blk.layer_scale).reshape(-1)})
                ss.append((dw.padding[0], dw.groups, ln.eps, _gelu_name(gelu)))
            stages_p.append(ps)
            stages_s.append(("blocks", ss))
        elif hasattr(first, "weight") and first.weight.dim() == 4:  # stem: conv then LayerNorm2d
            stages_p.append({"conv": W.conv_bias(first), "ln": W.layer_norm(seq[1])})
            stages_s.append(("stem", (first.stride[0], seq[1].eps)))
        else:  # downsample: LayerNorm2d then conv
            stages_p.append({"ln": W.layer_norm(first), "conv": W.conv_bias(seq[1])})
            stages_s.append(("down", (seq[1].stride[0], first.eps)))
    head_ln, head_fc = m.classifier[0], m.classifier[2]
    params = {"stages": stages_p, "head_ln": W.layer_norm(head_ln), "fc": W.dense(head_fc)}

    def fn(params, x):
        for p, (kind, s) in zip(params["stages"], stages_s):
            if kind == "stem":
                x = L.layer_norm(L.conv(x, p["conv"], s[0], precision=precision), p["ln"], s[1])
            elif kind == "down":
                x = L.conv(L.layer_norm(x, p["ln"], s[1]), p["conv"], s[0], precision=precision)
            else:
                for bp, (pad, groups, eps, act) in zip(p, s):
                    y = L.conv(x, bp["dw"], 1, pad, groups, precision)
                    y = L.ACTS[act](L.dense(L.layer_norm(y, bp["ln"], eps), bp["fc1"], precision))
                    x = x + bp["scale"] * L.dense(y, bp["fc2"], precision)  # stochastic depth: identity in eval
        x = L.layer_norm(L.mean_hw(x), params["head_ln"], head_ln.eps)
        return L.dense(x, params["fc"], precision)

    return params, fn
