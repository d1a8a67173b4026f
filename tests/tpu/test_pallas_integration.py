"""Pallas kernels inside whole TPU artifacts: hooks, the spelled-out norm pre-pass, fallbacks.

Each artifact is exported for ("tpu", "cpu") from one Program: its TPU lowering must hold the
Mosaic kernels (``tpu_custom_call``), and the same artifact runs here on CPU through the XLA
path of the dispatch, compared with torch eager:
- float32, kernels on: max |err| / max |ref| <= 1e-4 (the CPU path is the plain XLA math; seen ~4e-7);
- fallbacks: <= 1e-5 (the table's lowering runs).
"""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from tests import zoo
from tests.tpu.artifact_helpers import KERNEL, first_output_rel_err
from tpu_export import converter, tpu_backend

pytestmark = [pytest.mark.slow]


def _tpu_kernels(bundle) -> set:
    """Mosaic kernel names in the TPU lowering of every signature of ``bundle``."""
    names = set()
    for sig in bundle.signatures.values():
        text = sig.exported.mlir_module()
        if "tpu_custom_call" in text:
            names |= set(KERNEL.findall(text)) or {"<unnamed>"}
    return names


@pytest.fixture(scope="module")
def llama():
    model, args = zoo.build("llama")
    return model, args, converter.prepare(model, args)


@pytest.fixture(scope="module")
def llama_bundle(llama):
    _, _, prog = llama
    return tpu_backend.export_program(prog, platforms=("tpu", "cpu"), use_pallas=True, generation="v6e")


def test_llama_with_kernels_saves_loads_and_matches_torch(llama, llama_bundle, tmp_path):
    model, args, _ = llama
    kernels = _tpu_kernels(llama_bundle)
    # Causal SDPA -> splash; the 5 spelled-out RMSNorms -> the fused norm kernel.
    assert any("splash" in k for k in kernels), kernels
    assert "_norm_kernel" in kernels, kernels
    path = llama_bundle.save(tmp_path / "llama.tpuexp")
    loaded = tpu_backend.load(path)
    with torch.no_grad():
        want = model(*args)
    err = first_output_rel_err(loaded(*args), want)
    assert err <= 1e-4, f"llama with Pallas kernels on CPU: rel err {err:.3g}"


@pytest.mark.libtpu
def test_llama_kernels_compile_for_v6e(llama_bundle):
    compiled = llama_bundle.compile_for("tpu-v6e")
    report = compiled.report["signatures"]["serving_default"]
    assert report["executable_bytes"] > 0 and report["cost"]["flops"]["per_device"] > 0


def test_norm_pattern_is_one_fused_node(llama):
    _, _, prog = llama
    from tpu_export.tpu_backend.lowering.context import LoweringOptions
    from tpu_export.tpu_backend.pallas.hooks import norm_pattern_rewrite

    sig = prog.signature(None)
    rw = norm_pattern_rewrite(sig, LoweringOptions(use_pallas=True))
    assert len(rw.lowerings) == 5  # 2 layers x 2 norms + the final norm
    # Each match replaces pow, mean, add, rsqrt and the two muls: 5 skipped nodes per norm.
    assert len(rw.skip) == 25
    assert all(n.target is torch.ops.aten.mul.Tensor for n in rw.lowerings)


def test_cpu_only_and_pallas_off_exports_have_no_kernel(llama):
    model, args, prog = llama
    cpu_only = tpu_backend.export_program(prog, platforms=("cpu",), use_pallas=True)
    off = tpu_backend.export_program(prog, platforms=("tpu", "cpu"), use_pallas=False)
    assert "tpu_custom_call" not in cpu_only.signatures["serving_default"].exported.mlir_module()
    assert "tpu_custom_call" not in off.signatures["serving_default"].exported.mlir_module()
    with torch.no_grad():
        want = model(*args)
    assert first_output_rel_err(cpu_only(*args), want) <= 1e-4


def test_auto_mode_keeps_small_f32_llama_on_xla(llama, caplog):
    # "auto": a 16-token f32 attention and 64-wide norms are below the kernels' payoff rules.
    _, _, prog = llama
    with caplog.at_level(logging.INFO, logger="tpu_export.pallas"):
        bundle = tpu_backend.export_program(prog, platforms=("tpu", "cpu"), use_pallas="auto")
    assert _tpu_kernels(bundle) == set()
    assert "auto mode: kv length 16 < 512" in caplog.text
    assert "auto mode: norms stay on XLA" in caplog.text


class _BertStyleBlock(nn.Module):
    """Post-LN encoder block: SDPA with an additive padding mask, nn.LayerNorm (aten.layer_norm)."""

    def __init__(self, dim=128, heads=2):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.ff = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, x, keep):
        b, s, d = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        mask = (1.0 - keep[:, None, None, :].to(x.dtype)) * torch.finfo(x.dtype).min
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = self.ln1(x + self.out(a.transpose(1, 2).reshape(b, s, d)))
        return self.ln2(x + self.ff(x))


def _bert_style():
    torch.manual_seed(3)
    model = _BertStyleBlock().eval()
    with torch.no_grad():
        for ln in (model.ln1, model.ln2):
            ln.weight.normal_(1.0, 0.2)
            ln.bias.normal_(0.0, 0.1)
    x = torch.randn(2, 24, 128)
    keep = torch.ones(2, 24)
    keep[1, 17:] = 0  # padded tail
    return model, (x, keep)


def test_bert_style_mask_and_layer_norm_take_kernels():
    model, args = _bert_style()
    prog = converter.prepare(model, args)
    bundle = tpu_backend.export_program(prog, platforms=("tpu", "cpu"), use_pallas=True)
    kernels = _tpu_kernels(bundle)
    assert any("flash" in k for k in kernels), kernels  # a mask tensor takes the flash kernel
    assert "_norm_kernel" in kernels, kernels  # aten.layer_norm through its hook
    with torch.no_grad():
        want = model(*args)
    err = first_output_rel_err(bundle(*args), want)
    assert err <= 1e-4, f"bert-style block with kernels on CPU: rel err {err:.3g}"


def test_zoo_bert_layer_norm_hook():
    # zoo BERT spells attention out (matmul + softmax) and calls nn.LayerNorm: only norms change.
    model, args = zoo.build("bert")
    prog = converter.prepare(model, args)
    bundle = tpu_backend.export_program(prog, platforms=("tpu", "cpu"), use_pallas=True)
    assert _tpu_kernels(bundle) == {"_norm_kernel"}
    with torch.no_grad():
        want = model(*args)
    assert first_output_rel_err(bundle(*args), want) <= 1e-4


class _Fallbacks(nn.Module):
    """One op per hook, each at a shape its kernel refuses."""

    def forward(self, q, k, v, wide, x):
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # head dim 160: > 128, not a multiple
        b = F.layer_norm(wide, wide.shape[-1:])  # 40000 wide: a row block does not fit VMEM
        c = F.rms_norm(x, x.shape[-1:], eps=1e-6)  # dynamic batch: kernels are static-shape
        return a, b, c


def test_hooks_fall_back_with_logged_reasons(caplog):
    torch.manual_seed(0)
    args = (torch.randn(1, 2, 8, 160), torch.randn(1, 2, 8, 160), torch.randn(1, 2, 8, 160),
            torch.randn(2, 40000), torch.randn(3, 128))
    batch = torch.export.Dim("batch", min=1, max=16)
    prog = converter.prepare(_Fallbacks().eval(), args, dynamic_shapes=(None, None, None, None, {0: batch}))
    with caplog.at_level(logging.INFO, logger="tpu_export.pallas"):
        bundle = tpu_backend.export_program(prog, platforms=("tpu", "cpu"), use_pallas=True)
    assert _tpu_kernels(bundle) == set()
    text = caplog.text
    assert "falls back to the XLA lowering: head dim 160 is above 128" in text
    assert "falls back to the XLA lowering: hidden size 40000 too wide" in text
    assert "falls back to the XLA lowering: dynamic shape" in text
    assert all(r.levelno == logging.WARNING for r in caplog.records if "falls back" in r.message)  # mode=True
    with torch.no_grad():
        want = _Fallbacks()(*args)
    for got, ref in zip(bundle(*args), want):
        assert first_output_rel_err(got, ref) <= 1e-5


def test_hook_declines_return_not_implemented():
    # The hooks themselves, on a real lowering context: NotImplemented hands the node to the table.
    import jax.numpy as jnp

    from tpu_export.tpu_backend.lowering.context import LoweringContext, LoweringOptions
    from tpu_export.tpu_backend.pallas.hooks import layer_norm_hook, sdpa_hook

    class M(nn.Module):
        def forward(self, q, x):
            return F.scaled_dot_product_attention(q, q, q), F.layer_norm(x, (100,))

    q, x = torch.randn(1, 1, 4, 160), torch.randn(2, 100)
    prog = converter.prepare(M().eval(), (q, x))
    nodes = {n.target: n for n in prog.signature(None).graph.nodes if n.op == "call_function"}
    aten = torch.ops.aten
    opts = LoweringOptions(use_pallas="auto", generation="v5e")
    jq, jx = jnp.asarray(q.numpy()), jnp.asarray(x.numpy())
    ctx = LoweringContext(nodes[aten.scaled_dot_product_attention.default], [], opts)
    assert sdpa_hook(ctx, jq, jq, jq) is NotImplemented
    ctx = LoweringContext(nodes[aten.layer_norm.default], [], opts)
    assert layer_norm_hook(ctx, jx, [100], None, None, 1e-5) is NotImplemented  # auto: norms stay on XLA
    assert opts.pallas.generation == "v5e"
