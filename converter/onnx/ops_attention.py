"""The com.microsoft contrib ops onnxruntime's transformer optimizer writes: Attention,
SkipLayerNormalization, BiasGelu, FastGelu, Gelu (opset 1 of that domain)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .registry import CONTRIB_DOMAIN
from .registry import TABLE as T

__all__: list[str] = []


# com.microsoft::Attention(input, weights, bias?, mask_index?, past?, attention_bias?, past_sequence_length?)
#   -> output, present?  attrs: num_heads, unidirectional, qkv_hidden_sizes, mask_filter_value, scale,
#   do_rotary, past_present_share_buffer, rotary_embedding_dim
@T.op("Attention", domain=CONTRIB_DOMAIN, attrs={
    "num_heads": 0, "unidirectional": 0, "qkv_hidden_sizes": None, "mask_filter_value": -10000.0, "scale": 0.0,
    "do_rotary": 0, "past_present_share_buffer": 0, "rotary_embedding_dim": 0})
def attention(ctx, x, w, bias=None, mask=None, past=None, attn_bias=None, past_len=None, *, num_heads,
              unidirectional, qkv_hidden_sizes, mask_filter_value, scale, do_rotary, past_present_share_buffer,
              rotary_embedding_dim):
    if past is not None or ctx.n_out > 1 or do_rotary:
        ctx.fail("past/present state and rotary embedding are not supported")
    if num_heads <= 0:
        ctx.fail("num_heads must be positive")
    b, s, _ = x.shape
    sizes = list(qkv_hidden_sizes or [w.shape[1] // 3] * 3)
    qkv = torch.matmul(x, w)
    if bias is not None:
        qkv = qkv + bias
    q, k, v = torch.split(qkv, sizes, dim=-1)

    def heads(t):
        return t.reshape(b, s, num_heads, t.shape[-1] // num_heads).transpose(1, 2)

    q, k, v = heads(q), heads(k), heads(v)
    scores = torch.matmul(q, k.transpose(-1, -2)) * (scale or 1.0 / math.sqrt(sizes[0] // num_heads))
    if mask is not None:
        if mask.dim() == 2:  # (batch, total_sequence): 1 keeps a key, 0 masks it
            scores = scores + (1 - mask.to(scores.dtype))[:, None, None, :] * mask_filter_value
        elif mask.dim() == 3:  # (batch, sequence, total_sequence)
            scores = scores + (1 - mask.to(scores.dtype))[:, None, :, :] * mask_filter_value
        else:
            ctx.fail(f"mask_index of rank {mask.dim()} is not supported (2-D and 3-D 0/1 masks are)")
    if attn_bias is not None:
        scores = scores + attn_bias
    if unidirectional:
        causal = torch.ones(s, s, dtype=torch.bool).tril()
        scores = scores.masked_fill(~causal, torch.finfo(scores.dtype).min)
    out = torch.matmul(torch.softmax(scores, -1), v)
    return out.transpose(1, 2).reshape(b, s, sizes[2])


# com.microsoft::SkipLayerNormalization(input, skip, gamma, beta?, bias?) -> output, mean?, inv_std_var?,
#   input_skip_bias_sum?  attrs: epsilon
@T.op("SkipLayerNormalization", domain=CONTRIB_DOMAIN, attrs={"epsilon": 1e-12})
def skip_layer_norm(ctx, x, skip, gamma, beta=None, bias=None, *, epsilon):
    h = x + skip
    if bias is not None:
        h = h + bias
    y = F.layer_norm(h, [h.shape[-1]], gamma, beta, epsilon)
    if ctx.n_out == 1:
        return y
    mean = h.mean(-1, keepdim=True)
    inv = torch.rsqrt(((h - mean) ** 2).mean(-1, keepdim=True) + epsilon)
    return [y, mean, inv, h][:ctx.n_out]


# com.microsoft::BiasGelu(A, B) -> C = gelu(A + B)  (erf form)
@T.op("BiasGelu", domain=CONTRIB_DOMAIN)
def bias_gelu(ctx, a, b):
    return F.gelu(a + b)


# com.microsoft::FastGelu(X, bias?) -> Y  (tanh approximation)
@T.op("FastGelu", domain=CONTRIB_DOMAIN)
def fast_gelu(ctx, x, bias=None):
    return F.gelu(x if bias is None else x + bias, approximate="tanh")


# com.microsoft::Gelu(X) -> Y  (erf form)
@T.op("Gelu", domain=CONTRIB_DOMAIN)
def ms_gelu(ctx, x):
    return F.gelu(x)
