"""Pallas kernels of the TPU artifact: interpret-mode parity, TPU AOT compiles, export, patterns.

Tolerances (max abs error, all against the XLA path and torch eager):
- fp32: attention 2e-5, norms 1e-5 (+1e-5 relative), int8 linear 1e-3 on outputs of size ~60.
- bf16: 2e-2 absolute + 2e-2 relative (a bf16 ulp is 2^-8 relative; kernels and XLA round
  their fp32 accumulators once, at different points).
"""

from __future__ import annotations

import logging
import os

# libtpu takes a host-wide lockfile when it loads; two pytest-xdist workers (or any two jax
# processes) each describing a TPU topology need this, else "libtpu multi-process lockfile".
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from tpu_export import converter  # noqa: E402
from tpu_export.tpu_backend.pallas import (  # noqa: E402
    PallasConfig,
    attention,
    block_sizes,
    find_norm_patterns,
    int8_linear,
    layer_norm,
    match_layer_norm,
    match_rms_norm,
    quantize_int8_per_channel,
    rms_norm,
    xla_attention,
    xla_int8_linear,
    xla_layer_norm,
    xla_rms_norm,
)

TOPOLOGIES = {"v5e": "v5e:2x2", "v6e": "v6e:2x2", "tpu7x": "tpu7x:2x2x1"}
TOL = {jnp.float32: dict(rtol=1e-5, atol=2e-5), jnp.bfloat16: dict(rtol=2e-2, atol=2e-2)}
INTERPRET = PallasConfig(mode=True, generation="v6e", interpret=True)


def _rand(rng, shape, dtype, scale=1.0):
    return jnp.asarray(rng.standard_normal(shape) * scale, dtype)


def _np32(a):
    return np.asarray(jnp.asarray(a).astype(jnp.float32))


def _torch32(a):
    return torch.from_numpy(_np32(a).copy())


def _close(actual, expected, dtype, **override):
    np.testing.assert_allclose(_np32(actual), np.asarray(expected, np.float32), **{**TOL[dtype], **override})


@pytest.fixture(scope="module")
def tpu_device():
    from jax.experimental import topologies

    cache = {}

    def get(gen):
        if gen not in cache:
            cache[gen] = topologies.get_topology_desc(TOPOLOGIES[gen], "tpu").devices[0]
        return cache[gen]

    return get


# ----------------------------------------------------------------------------- attention

ATTENTION_CASES = [
    # (B, Hq, Hkv, Sq, Sk, D, is_causal, mask kind)
    pytest.param(2, 4, 2, 200, 200, 64, True, None, id="gqa-causal-seq200-d64-b2"),
    pytest.param(1, 2, 2, 128, 300, 128, False, None, id="mha-kv300-d128"),
    pytest.param(2, 4, 1, 130, 130, 256, True, None, id="mqa-causal-seq130-d256-b2"),
    pytest.param(2, 2, 1, 100, 260, 64, False, "float", id="gqa-additive-mask-b2"),
    pytest.param(1, 2, 2, 256, 256, 128, False, "bool", id="bool-mask-with-empty-row"),
]


def _attention_inputs(rng, b, hq, hkv, sq, sk, d, mask_kind, dtype):
    q, k, v = (_rand(rng, (b, h, s, d), dtype) for h, s in ((hq, sq), (hkv, sk), (hkv, sk)))
    mask = None
    if mask_kind == "float":
        mask = _rand(rng, (1, 1, sq, sk), dtype)
    elif mask_kind == "bool":
        keep = rng.random((b, 1, sq, sk)) > 0.5
        keep[0, 0, 3, :] = False  # a query row with no key: torch gives zeros
        mask = jnp.asarray(keep)
    return q, k, v, mask


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("b,hq,hkv,sq,sk,d,is_causal,mask_kind", ATTENTION_CASES)
def test_attention_kernel_matches_xla_and_torch(b, hq, hkv, sq, sk, d, is_causal, mask_kind, dtype):
    rng = np.random.default_rng(0)
    q, k, v, mask = _attention_inputs(rng, b, hq, hkv, sq, sk, d, mask_kind, dtype)
    kernel = attention(q, k, v, mask=mask, is_causal=is_causal, config=INTERPRET)
    xla = xla_attention(q, k, v, mask=mask, is_causal=is_causal)
    tmask = None if mask is None else (torch.from_numpy(np.array(mask)) if mask_kind == "bool" else _torch32(mask))
    ref = F.scaled_dot_product_attention(
        _torch32(q), _torch32(k), _torch32(v), attn_mask=tmask, is_causal=is_causal, enable_gqa=True
    ).numpy()
    assert kernel.shape == q.shape and kernel.dtype == q.dtype
    _close(kernel, _np32(xla), dtype)
    _close(xla, ref, dtype)
    _close(kernel, ref, dtype)
    if mask_kind == "bool":
        assert np.all(_np32(kernel)[0, :, 3] == 0.0)


def test_attention_explicit_scale():
    rng = np.random.default_rng(1)
    q, k, v, _ = _attention_inputs(rng, 1, 2, 2, 128, 128, 64, None, jnp.float32)
    out = attention(q, k, v, is_causal=True, scale=0.3, config=INTERPRET)
    ref = F.scaled_dot_product_attention(_torch32(q), _torch32(k), _torch32(v), is_causal=True, scale=0.3)
    _close(out, ref.numpy(), jnp.float32)


# ----------------------------------------------------------------------------- norms

NORM_SHAPES = [
    pytest.param((3, 37, 256), id="rows111-h256"),
    pytest.param((1030, 512), id="rows1030-over-one-block"),
    pytest.param((5, 100), id="h100-not-lane-aligned"),
]


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("shape", NORM_SHAPES)
def test_norm_kernels_match_xla_and_torch(shape, dtype):
    rng = np.random.default_rng(2)
    x = _rand(rng, shape, dtype, 3.0)
    w, b = _rand(rng, shape[-1:], dtype), _rand(rng, shape[-1:], dtype)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == jnp.float32 else {}

    rms = rms_norm(x, w, 1e-6, config=INTERPRET)
    _close(rms, _np32(xla_rms_norm(x, w, 1e-6)), dtype, **tol)
    tdt = torch.float32 if dtype == jnp.float32 else torch.bfloat16
    ref = torch.rms_norm(_torch32(x).to(tdt), shape[-1:], _torch32(w).to(tdt), 1e-6).float().numpy()
    _close(rms, ref, dtype, **tol)

    ln = layer_norm(x, w, b, 1e-5, config=INTERPRET)
    _close(ln, _np32(xla_layer_norm(x, w, b, 1e-5)), dtype, **tol)
    ref = F.layer_norm(_torch32(x).to(tdt), shape[-1:], _torch32(w).to(tdt), _torch32(b).to(tdt), 1e-5)
    _close(ln, ref.float().numpy(), dtype, **tol)


def test_norms_without_affine_and_default_eps():
    rng = np.random.default_rng(3)
    x = _rand(rng, (4, 9, 128), jnp.float32)
    ref = torch.rms_norm(_torch32(x), [128], None, None).numpy()
    _close(rms_norm(x, None, None, config=INTERPRET), ref, jnp.float32, atol=1e-5)
    ref = F.layer_norm(_torch32(x), [128], None, None, 1e-5).numpy()
    _close(layer_norm(x, None, None, 1e-5, config=INTERPRET), ref, jnp.float32, atol=1e-5)
    # normalized_shape of two dims (aten's normalized_shape=[9, 128])
    ref = torch.rms_norm(_torch32(x), [9, 128], None, 1e-6).numpy()
    _close(rms_norm(x, None, 1e-6, config=INTERPRET, normalized_ndim=2), ref, jnp.float32, atol=1e-5)
    w = _rand(rng, (9, 128), jnp.float32)
    ref = F.layer_norm(_torch32(x), [9, 128], _torch32(w), _torch32(w), 1e-5).numpy()
    _close(layer_norm(x, w, w, 1e-5, config=INTERPRET), ref, jnp.float32, atol=1e-5)


# ----------------------------------------------------------------------------- int8 linear

INT8_CASES = [
    pytest.param((3, 5), 256, 384, True, id="m15-k256-n384-bias"),
    pytest.param((600,), 512, 256, False, id="m600-over-one-block"),
    pytest.param((2,), 100, 72, True, id="k100-n72-unaligned"),
    pytest.param((1,), 4096, 512, True, id="k4096-two-k-steps"),
]


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("lead,k,n,with_bias", INT8_CASES)
def test_int8_linear_kernel_matches_xla_and_torch(lead, k, n, with_bias, dtype):
    rng = np.random.default_rng(4)
    x = _rand(rng, lead + (k,), dtype)
    w = torch.from_numpy(rng.standard_normal((n, k)).astype(np.float32))
    w_int8, scale = quantize_int8_per_channel(w)
    assert w_int8.dtype == np.int8 and np.abs(w_int8.astype(np.float32) * scale[:, None] - w.numpy()).max() < (
        scale.max() / 2 + 1e-6
    )
    bias = _rand(rng, (n,), dtype) if with_bias else None
    out = int8_linear(x, jnp.asarray(w_int8), jnp.asarray(scale), bias, config=INTERPRET)
    xla = xla_int8_linear(x, jnp.asarray(w_int8), jnp.asarray(scale), bias)
    deq = torch.from_numpy(w_int8.astype(np.float32) * scale[:, None])
    ref = F.linear(_torch32(x), deq, None if bias is None else _torch32(bias)).numpy()
    assert out.shape == lead + (n,) and out.dtype == x.dtype
    if dtype == jnp.float32:
        _close(out, _np32(xla), dtype, atol=1e-3)
        _close(out, ref, dtype, atol=1e-3)
    else:  # bf16 output of sums up to ~|100|: one rounding of the fp32 accumulator
        scale_ref = float(np.abs(ref).max())
        _close(out, _np32(xla), dtype, atol=1e-2 * scale_ref)
        _close(out, ref, dtype, atol=1e-2 * scale_ref)


def test_quantize_accepts_jax_arrays():
    w = jnp.asarray(np.random.default_rng(5).standard_normal((8, 16)), jnp.float32).at[3].set(0.0)
    q, s = quantize_int8_per_channel(w)
    assert q.dtype == jnp.int8 and s.dtype == jnp.float32 and float(s[3]) == 1.0
    np.testing.assert_allclose(np.asarray(q, np.float32) * np.asarray(s)[:, None], np.asarray(w), atol=float(s.max()))


# ----------------------------------------------------------------------------- TPU: AOT and export


def _kernel_programs(cfg, dev):
    sh = jax.sharding.SingleDeviceSharding(dev)
    s = lambda *shape, dt=jnp.bfloat16: jax.ShapeDtypeStruct(shape, dt, sharding=sh)
    return {
        "splash-gqa-causal-d64": (lambda q, k, v: attention(q, k, v, is_causal=True, config=cfg),
                                  (s(2, 4, 200, 64), s(2, 2, 200, 64), s(2, 2, 200, 64))),
        "splash-d256": (lambda q, k, v: attention(q, k, v, config=cfg), (s(1, 2, 256, 256),) * 3),
        "flash-additive-mask": (lambda q, k, v, m: attention(q, k, v, mask=m, config=cfg),
                                (s(2, 4, 100, 128), s(2, 2, 260, 128), s(2, 2, 260, 128), s(1, 1, 100, 260))),
        "rms-norm": (lambda x, w: rms_norm(x, w, 1e-6, config=cfg), (s(3, 37, 256), s(256))),
        "layer-norm-f32": (lambda x, w, b: layer_norm(x, w, b, 1e-5, config=cfg),
                           (s(1030, 512, dt=jnp.float32), s(512, dt=jnp.float32), s(512, dt=jnp.float32))),
        "int8-linear": (lambda x, w, sc, b: int8_linear(x, w, sc, b, config=cfg),
                        (s(600, 4096), s(512, 4096, dt=jnp.int8), s(512, dt=jnp.float32), s(512))),
        "int8-linear-f32": (lambda x, w, sc: int8_linear(x, w, sc, config=cfg),
                            (s(64, 512, dt=jnp.float32), s(256, 512, dt=jnp.int8), s(256, dt=jnp.float32))),
    }


@pytest.mark.libtpu
@pytest.mark.parametrize("gen", list(TOPOLOGIES))
def test_each_kernel_aot_compiles_for_tpu(gen, tpu_device):
    cfg = PallasConfig(mode=True, generation=gen)
    for name, (fn, args) in _kernel_programs(cfg, tpu_device(gen)).items():
        lowered = jax.jit(fn).trace(*args).lower(lowering_platforms=("tpu",))
        assert "tpu_custom_call" in lowered.as_text(), name
        compiled = lowered.compile()
        assert compiled.memory_analysis() is not None, name


def _export(fn, args, platforms):
    return jax.export.export(jax.jit(fn), platforms=platforms)(*args)


@pytest.mark.libtpu
def test_one_export_serves_tpu_kernel_and_cpu_xla(tpu_device):
    cfg = PallasConfig(mode=True, generation="v6e")
    rng = np.random.default_rng(6)
    q, k, v, _ = _attention_inputs(rng, 2, 4, 2, 256, 256, 128, None, jnp.bfloat16)
    x, w = _rand(rng, (2, 64, 256), jnp.bfloat16), _rand(rng, (256,), jnp.bfloat16)

    def fn(q, k, v, x, w):
        return attention(q, k, v, is_causal=True, config=cfg), rms_norm(x, w, 1e-6, config=cfg)

    args = (q, k, v, x, w)
    both = _export(fn, args, ["tpu", "cpu"])
    cpu_only = _export(fn, args, ["cpu"])
    assert "tpu_custom_call" in both.mlir_module()
    assert "tpu_custom_call" not in cpu_only.mlir_module()
    # The multi-platform artifact, reloaded, runs here (CPU branch) and matches the XLA path.
    reloaded = jax.export.deserialize(both.serialize())
    attn_out, norm_out = reloaded.call(*args)
    _close(attn_out, _np32(xla_attention(q, k, v, is_causal=True)), jnp.bfloat16)
    _close(norm_out, _np32(xla_rms_norm(x, w, 1e-6)), jnp.bfloat16)
    # ... and the same artifact compiles for a TPU chip (the Mosaic branch).
    sh = jax.sharding.SingleDeviceSharding(tpu_device("v6e"))
    specs = [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sh) for a in args]
    jax.jit(reloaded.call).trace(*specs).lower(lowering_platforms=("tpu",)).compile()


def test_mode_false_exports_no_kernel():
    cfg = PallasConfig(mode=False, generation="v6e")
    q = jnp.zeros((1, 2, 512, 128), jnp.bfloat16)
    exp = _export(lambda q: attention(q, q, q, is_causal=True, config=cfg), (q,), ["tpu", "cpu"])
    assert "tpu_custom_call" not in exp.mlir_module()


def test_fallbacks_are_logged_and_use_xla(caplog):
    cfg = PallasConfig(mode=True, generation="v6e")
    auto = PallasConfig(mode="auto", generation="v6e")
    q192 = jnp.zeros((1, 2, 256, 192), jnp.float32)
    x = jax.ShapeDtypeStruct(jax.export.symbolic_shape("b, 64, 256"), jnp.float32)
    w = jax.ShapeDtypeStruct((256,), jnp.float32)
    q_short = jnp.zeros((1, 2, 128, 128), jnp.bfloat16)
    q_f32 = jnp.zeros((1, 2, 1024, 128), jnp.float32)
    with caplog.at_level(logging.INFO, logger="tpu_export.pallas"):
        head = _export(lambda q: attention(q, q, q, config=cfg), (q192,), ["tpu"])
        dyn = _export(lambda x, w: rms_norm(x, w, 1e-6, config=cfg), (x, w), ["tpu"])
        short = _export(lambda q: attention(q, q, q, config=auto), (q_short,), ["tpu"])
        f32 = _export(lambda q: attention(q, q, q, config=auto), (q_f32,), ["tpu"])
    for exp in (head, dyn, short, f32):
        assert "tpu_custom_call" not in exp.mlir_module()
    text = caplog.text
    assert "head dim 192" in text and "dynamic shape" in text and "auto mode: kv length 128" in text
    assert "float32 attention stays on XLA" in text
    # mode=True asked for the kernel: not taking it is a warning; "auto" only informs.
    levels = {r.getMessage().split(": ", 2)[-1][:20]: r.levelno for r in caplog.records}
    assert logging.WARNING in levels.values() and logging.INFO in levels.values()
    bf16_long = jnp.zeros((1, 2, 1024, 128), jnp.bfloat16)
    assert "tpu_custom_call" in _export(lambda q: attention(q, q, q, config=auto), (bf16_long,), ["tpu"]).mlir_module()


def test_block_size_rule_per_generation():
    shape = (1, 8, 2, 8192, 8192, 128)
    v5e, v6e = block_sizes("attention", "v5e", shape, "bfloat16"), block_sizes("attention", "v6e", shape, "bfloat16")
    assert (v5e["block_q"], v6e["block_q"]) == (512, 1024)  # 4 x MXU width
    assert block_sizes("attention", "v6e", (1, 8, 2, 200, 300, 64), "bfloat16") == {
        "block_q": 256, "block_kv": 128, "block_kv_compute": 128}  # 200 -> 256, 300 -> 384 = 3 x 128
    assert block_sizes("norm", "v5e", (100, 1024), "bfloat16")["block_rows"] == 100  # all rows in one block
    rows = block_sizes("norm", "v5e", (100000, 4096), "bfloat16")["block_rows"]
    assert rows % 16 == 0 and rows * 4096 * (4 * 2 + 12) <= 8 << 20
    assert block_sizes("int8_linear", "v6e", (600, 4096, 512), "bfloat16") == {
        "block_m": 512, "block_n": 512, "block_k": 2048}
    with pytest.raises(ValueError, match="unknown TPU generation"):
        PallasConfig(generation="v4")


# ----------------------------------------------------------------------------- patterns


class _LlamaRMS(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(64))

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).type_as(x) * self.w


class _DivSqrtRMS(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(64))

    def forward(self, x):
        return self.w * (x / torch.sqrt((x * x).mean(dim=-1, keepdim=True) + 1e-5))


class _MeanSquareLN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w, self.b = torch.nn.Parameter(torch.randn(64)), torch.nn.Parameter(torch.randn(64))

    def forward(self, x):
        m = x.mean(-1, keepdim=True)
        v = ((x - m) ** 2).mean(-1, keepdim=True)
        return (x - m) / torch.sqrt(v + 1e-5) * self.w + self.b


class _VarLN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w, self.b = torch.nn.Parameter(torch.randn(64)), torch.nn.Parameter(torch.randn(64))

    def forward(self, x):
        m, v = x.mean(-1, keepdim=True), x.var(-1, keepdim=True, unbiased=False)
        return self.w * (x - m) * torch.rsqrt(v + 1e-5) + self.b


class _VarMeanLN(torch.nn.Module):
    def forward(self, x):
        v, m = torch.var_mean(x, -1, keepdim=True, correction=0)
        return (x - m) / torch.sqrt(v + 1e-6)


class _UnbiasedVar(torch.nn.Module):  # not a layer norm: unbiased variance
    def forward(self, x):
        return (x - x.mean(-1, keepdim=True)) * torch.rsqrt(x.var(-1, keepdim=True) + 1e-5)


class _WrongDim(torch.nn.Module):  # not a last-dim norm
    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(1, keepdim=True) + 1e-6)


class _Gated(torch.nn.Module):  # the extra factor is a full tensor, not a channel weight
    def forward(self, x, g):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * g


def _node_values(prog, args):
    """Every node's value from running the Program's graph in torch."""
    sig = prog.signature()
    values = {}

    class Recorder(torch.fx.Interpreter):
        def run_node(self, n):
            values[n] = super().run_node(n)
            return values[n]

    weights = [prog.weights[w] for w in sig.weight_names]
    with torch.no_grad():
        Recorder(sig.graph_module).run(*weights, *args)
    return values


@pytest.mark.parametrize(
    "module,dtype,kind,eps,has_weight,has_bias",
    [
        (_LlamaRMS, torch.bfloat16, "rms_norm", 1e-6, True, False),
        (_LlamaRMS, torch.float32, "rms_norm", 1e-6, True, False),
        (_DivSqrtRMS, torch.float32, "rms_norm", 1e-5, True, False),
        (_MeanSquareLN, torch.float32, "layer_norm", 1e-5, True, True),
        (_VarLN, torch.float32, "layer_norm", 1e-5, True, True),
        (_VarMeanLN, torch.float32, "layer_norm", 1e-6, False, False),
    ],
    ids=["llama-rms-bf16", "llama-rms-f32", "div-sqrt-rms", "mean-square-ln", "var-ln", "var-mean-ln"],
)
def test_spelled_out_norm_is_matched(module, dtype, kind, eps, has_weight, has_bias):
    torch.manual_seed(0)
    m = module().eval().to(dtype)
    x = torch.randn(2, 5, 64, dtype=dtype) * 2 + 0.5
    prog = converter.prepare(m, (x,))
    (match,) = find_norm_patterns(prog.signature().graph)
    assert match.kind == kind and match.eps == pytest.approx(eps)
    assert (match.weight is not None, match.bias is not None) == (has_weight, has_bias)
    assert (match_layer_norm if kind == "layer_norm" else match_rms_norm)(match.end) is not None
    assert match.end in match.nodes and match.x not in match.nodes
    # The kernel's inputs, read off the match, reproduce the replaced subgraph's value.
    values = _node_values(prog, (x,))
    val = lambda n: None if n is None else jnp.asarray(values[n].float().numpy())
    xv = jnp.asarray(values[match.x].float().numpy()).astype(jnp.bfloat16 if values[match.x].dtype == torch.bfloat16
                                                              else jnp.float32)
    if kind == "rms_norm":
        ours = xla_rms_norm(xv, val(match.weight), match.eps)
    else:
        ours = xla_layer_norm(xv, val(match.weight), val(match.bias), match.eps)
    np.testing.assert_allclose(_np32(ours), values[match.end].float().numpy(),
                               **(dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=5e-2)))


@pytest.mark.parametrize("module,args", [
    (_UnbiasedVar, (torch.randn(2, 5, 64),)),
    (_WrongDim, (torch.randn(2, 5, 64),)),
    (_Gated, (torch.randn(2, 5, 64), torch.randn(2, 5, 64))),
], ids=["unbiased-var", "wrong-dim", "gated"])
def test_lookalikes_are_not_matched_as_a_whole(module, args):
    prog = converter.prepare(module().eval(), args)
    graph = prog.signature().graph
    out = prog.signature().output_nodes()[0]
    assert match_rms_norm(out) is None and match_layer_norm(out) is None
    if module is _Gated:  # its inner x * rsqrt(...) is a real RMSNorm without weight
        (inner,) = find_norm_patterns(graph)
        assert inner.kind == "rms_norm" and inner.weight is None and inner.end is not out
    else:
        assert find_norm_patterns(graph) == []


# ----------------------------------------------------------------------------- a decoder


class _Decoder(torch.nn.Module):
    """A Llama-style block: spelled-out RMSNorm, GQA causal SDPA, SwiGLU MLP."""

    def __init__(self, dim=256, heads=4, kv_heads=2, ffn=512):
        super().__init__()
        self.heads, self.kv_heads, self.hd = heads, kv_heads, dim // heads
        self.n1 = torch.nn.Parameter(1 + 0.1 * torch.randn(dim))
        self.n2 = torch.nn.Parameter(1 + 0.1 * torch.randn(dim))
        self.wq = torch.nn.Linear(dim, dim, bias=False)
        self.wk = torch.nn.Linear(dim, kv_heads * self.hd, bias=False)
        self.wv = torch.nn.Linear(dim, kv_heads * self.hd, bias=False)
        self.wo = torch.nn.Linear(dim, dim, bias=False)
        self.gate, self.up = torch.nn.Linear(dim, ffn, bias=False), torch.nn.Linear(dim, ffn, bias=False)
        self.down = torch.nn.Linear(ffn, dim, bias=True)

    @staticmethod
    def rms(x, w):
        return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))

    def forward(self, x):
        b, s, _ = x.shape
        h = self.rms(x, self.n1)
        q = self.wq(h).view(b, s, self.heads, self.hd).transpose(1, 2)
        k = self.wk(h).view(b, s, self.kv_heads, self.hd).transpose(1, 2)
        v = self.wv(h).view(b, s, self.kv_heads, self.hd).transpose(1, 2)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.wo(a.transpose(1, 2).reshape(b, s, -1))
        h = self.rms(x, self.n2)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


def _jax_decoder(cfg, m: _Decoder):
    """The same block through the Pallas entry points; the MLP's down projection in int8."""
    t = lambda p: jnp.asarray(p.detach().numpy())
    w_int8, scale = quantize_int8_per_channel(m.down.weight)
    weights = {"n1": t(m.n1), "n2": t(m.n2), "wq": t(m.wq.weight), "wk": t(m.wk.weight), "wv": t(m.wv.weight),
               "wo": t(m.wo.weight), "gate": t(m.gate.weight), "up": t(m.up.weight),
               "down_q": jnp.asarray(w_int8), "down_s": jnp.asarray(scale), "down_b": t(m.down.bias)}
    hp = dict(precision="highest")

    def block(w, x):
        b, s, _ = x.shape
        split = lambda y, n: y.reshape(b, s, n, m.hd).transpose(0, 2, 1, 3)
        h = rms_norm(x, w["n1"], 1e-6, config=cfg)
        q, k, v = (split(jnp.dot(h, w[n].T, **hp), heads)
                   for n, heads in (("wq", m.heads), ("wk", m.kv_heads), ("wv", m.kv_heads)))
        a = attention(q, k, v, is_causal=True, config=cfg)
        x = x + jnp.dot(a.transpose(0, 2, 1, 3).reshape(b, s, -1), w["wo"].T, **hp)
        h = rms_norm(x, w["n2"], 1e-6, config=cfg)
        g = jax.nn.silu(jnp.dot(h, w["gate"].T, **hp)) * jnp.dot(h, w["up"].T, **hp)
        return x + int8_linear(g, w["down_q"], w["down_s"], w["down_b"], config=cfg)

    dequant = torch.from_numpy(w_int8.astype(np.float32) * scale[:, None])
    return block, weights, dequant


@pytest.mark.libtpu
def test_decoder_exported_with_pallas_runs_on_cpu_and_matches_torch(tpu_device):
    torch.manual_seed(0)
    m = _Decoder().eval()
    x = torch.randn(2, 200, 256)  # sequence 200: not a multiple of any block
    # The captured Program carries what the lowering hands to the kernels.
    prog = converter.prepare(m, (x,))
    assert [p.kind for p in find_norm_patterns(prog.signature().graph)] == ["rms_norm", "rms_norm"]
    assert prog.signature().op_histogram().get("aten.scaled_dot_product_attention.default") == 1

    cfg = PallasConfig(mode=True, generation="v6e")
    block, weights, dequant = _jax_decoder(cfg, m)
    exported = jax.export.export(jax.jit(block), platforms=["tpu", "cpu"])(weights, jnp.asarray(x.numpy()))
    assert exported.mlir_module().count("tpu_custom_call") >= 4  # 2 norms, attention, int8 matmul
    with torch.no_grad():
        m.down.weight.copy_(dequant)  # torch reference with the same (dequantized) int8 weight
        ref = m(x).numpy()
    out = jax.export.deserialize(exported.serialize()).call(weights, jnp.asarray(x.numpy()))
    np.testing.assert_allclose(np.asarray(out), ref, rtol=1e-4, atol=1e-4)
    # The same artifact AOT-compiles for a TPU chip with the kernels in.
    sh = jax.sharding.SingleDeviceSharding(tpu_device("v6e"))
    spec = lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sh)
    jax.jit(exported.call).trace(jax.tree.map(spec, weights), spec(jnp.asarray(x.numpy()))).lower(
        lowering_platforms=("tpu",)).compile()
