"""transformers' BertModel (absolute positions, post-LayerNorm encoder, tanh pooler) in JAX.

Inputs are (input_ids, attention_mask); token types are all type 0, as BertModel's default buffer gives.
Masked keys get the most negative finite score added, as transformers' extended attention mask does.
Returns (last_hidden_state, pooler_output).
"""

from __future__ import annotations

import jax.numpy as jnp

from . import _layers as L
from . import _weights as W

__all__ = ["bert"]


def bert(m, precision=None):
    cfg = m.config
    assert getattr(cfg, "position_embedding_type", "absolute") == "absolute"
    act = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu"}[cfg.hidden_act]
    eps, heads = cfg.layer_norm_eps, cfg.num_attention_heads
    e = m.embeddings
    layers = []
    for lay in m.encoder.layer:
        a = lay.attention
        layers.append({"q": W.dense(a.self.query), "k": W.dense(a.self.key), "v": W.dense(a.self.value),
                       "o": W.dense(a.output.dense), "ln1": W.layer_norm(a.output.LayerNorm),
                       "up": W.dense(lay.intermediate.dense), "down": W.dense(lay.output.dense),
                       "ln2": W.layer_norm(lay.output.LayerNorm)})
    params = {"word": W.vector(e.word_embeddings.weight), "pos": W.vector(e.position_embeddings.weight),
              "type": W.vector(e.token_type_embeddings.weight), "emb_ln": W.layer_norm(e.LayerNorm),
              "layers": layers, "pooler": W.dense(m.pooler.dense)}

    def fn(params, ids, mask):
        n = ids.shape[1]
        x = params["word"][ids] + params["pos"][:n] + params["type"][0]
        x = L.layer_norm(x, params["emb_ln"], eps)
        bias = jnp.where(mask[:, None, None, :] > 0, 0.0, jnp.finfo(x.dtype).min).astype(x.dtype)
        for p in params["layers"]:
            ctx = L.attention(L.dense(x, p["q"], precision), L.dense(x, p["k"], precision),
                              L.dense(x, p["v"], precision), heads, bias, precision)
            x = L.layer_norm(L.dense(ctx, p["o"], precision) + x, p["ln1"], eps)
            y = L.ACTS[act](L.dense(x, p["up"], precision))
            x = L.layer_norm(L.dense(y, p["down"], precision) + x, p["ln2"], eps)
        pooled = jnp.tanh(L.dense(x[:, 0], params["pooler"], precision))
        return x, pooled

    return params, fn
