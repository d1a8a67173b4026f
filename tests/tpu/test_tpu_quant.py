"""TPU weight-only int8 (and bf16) artifacts: sizes, accuracy against torch, kernels, AOT.

Bounds (max |err| / max |ref| against the float32 torch model, run here on CPU):
- int8 weights, f32 activations: <= 2e-2 (per-channel symmetric int8 rounds each weight by at
  most 1/254 of its channel's max; seen 5.8e-3 on llama, 4.1e-3 on bert);
- int8 weights + bf16 activations: <= 3e-2 (seen ~1e-2).
Sizes: the int8 + scale bytes of the quantized weights are <= 0.35x their float32 bytes
(measured 0.266 on llama: K=64 gives (64 + 4) / (4 * 64)); dtype="bfloat16" stores 0.5x.
"""

from __future__ import annotations

import json
import os

import pytest
import torch
import torch.nn as nn

import tpu_export
from tests import zoo
from tests.tpu.artifact_helpers import KERNEL, first_output_rel_err
from tpu_export import converter, tpu_backend
from tpu_export.tpu_backend.quant import WeightOnlyInt8, parse_quant, plan_int8

pytestmark = [pytest.mark.slow]


def _weights_table(path) -> dict:
    with open(os.path.join(path, "manifest.json")) as f:
        return json.load(f)["weights"]["tensors"]


def _nbytes(entry) -> int:
    n = 1
    for d in entry["shape"]:
        n *= d
    return n * {"float32": 4, "bfloat16": 2, "int8": 1}[entry["dtype"]]


@pytest.fixture(scope="module")
def llama():
    model, args = zoo.build("llama")
    return model, args, converter.prepare(model, args)


@pytest.mark.libtpu
def test_llama_int8_artifact_size_accuracy_kernel_and_aot(llama, tmp_path):
    model, args, prog = llama
    f32_path = tpu_backend.export_program(prog, platforms=("tpu", "cpu")).save(tmp_path / "f32.tpuexp")
    bundle = tpu_backend.export_program(prog, platforms=("tpu", "cpu"), quant="weight_only_int8", use_pallas=True)
    # Every linear weight and the tied embedding / lm_head weight (quantized once for both uses).
    linears = [n for n, t in prog.weights.items() if t.dim() == 2 and ("proj" in n or "embed" in n)]
    assert sorted(bundle.quantized_weights) == sorted(linears) and len(linears) == 15
    text = bundle.signatures["serving_default"].exported.mlir_module()
    assert "_int8_matmul_kernel" in KERNEL.findall(text)
    compiled = bundle.compile_for("tpu-v6e")
    assert compiled.report["signatures"]["serving_default"]["executable_bytes"] > 0
    int8_path = bundle.save(tmp_path / "int8.tpuexp")

    assert tpu_backend.load(f32_path).quant is None
    record = tpu_backend.load(int8_path).quant  # the manifest names what each quantized weight became
    assert record["scheme"] == "weight_only_int8" and sorted(record["weights"]) == sorted(linears)
    assert record["weights"][linears[0]] == {"int8": f"{linears[0]}.int8", "scale": f"{linears[0]}.int8_scale"}
    f32_table, int8_table = _weights_table(f32_path), _weights_table(int8_path)
    float_bytes = sum(_nbytes(f32_table[n]) for n in linears)
    int8_bytes = sum(_nbytes(int8_table[f"{n}{sfx}"]) for n in linears for sfx in (".int8", ".int8_scale"))
    ratio = int8_bytes / float_bytes
    assert ratio <= 0.35, f"quantized weights are {ratio:.3f}x their float bytes"
    assert int8_table[f"{linears[0]}.int8"]["dtype"] == "int8" and linears[0] not in int8_table
    f32_file = os.path.getsize(os.path.join(f32_path, "weights.safetensors"))
    int8_file = os.path.getsize(os.path.join(int8_path, "weights.safetensors"))
    assert int8_file <= 0.35 * f32_file, (int8_file, f32_file)  # 94 KB vs 341 KB here (0.28x)

    with torch.no_grad():
        want = model(*args)
    err = first_output_rel_err(tpu_backend.load(int8_path)(*args), want)
    assert err <= 2e-2, f"int8 llama: rel err {err:.3g}"


def test_bert_int8_bf16_and_plain_bf16(tmp_path):
    model, args = zoo.build("bert")
    prog = converter.prepare(model, args)
    with torch.no_grad():
        want = model(*args)
    f32 = tpu_backend.export_program(prog, platforms=("tpu", "cpu")).save(tmp_path / "f32.tpuexp")
    bf16 = tpu_backend.export_program(prog, platforms=("tpu", "cpu"), dtype="bfloat16").save(tmp_path / "bf16.tpuexp")
    q = tpu_backend.export_program(prog, platforms=("tpu", "cpu"), dtype="bfloat16", quant="int8", use_pallas=True)
    kernels = set(KERNEL.findall(q.signatures["serving_default"].exported.mlir_module()))
    assert {"_int8_matmul_kernel", "_norm_kernel"} <= kernels
    size = lambda p: os.path.getsize(os.path.join(p, "weights.safetensors"))  # noqa: E731
    assert 0.45 <= size(bf16) / size(f32) <= 0.55
    table = _weights_table(q.save(tmp_path / "q.tpuexp"))
    assert table["layers.0.query.weight.int8_scale"]["dtype"] == "float32"  # scales stay f32 under bf16
    assert table["layers.0.query.bias"]["dtype"] == "bfloat16"  # 1-D weights stay float (bf16 here)
    err = first_output_rel_err(q(*args), want)
    assert err <= 3e-2, f"bert int8 + bf16: rel err {err:.3g}"


class _MatmulForms(nn.Module):
    """Linear weights in the other spellings: addmm with a [in, out] weight (GPT-2 Conv1D),
    x @ w.T, and a weight too small to quantize."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(5)
        self.conv1d_w = nn.Parameter(torch.randn(128, 256, generator=g) * 0.05)
        self.conv1d_b = nn.Parameter(torch.randn(256, generator=g) * 0.1)
        self.proj = nn.Parameter(torch.randn(64, 256, generator=g) * 0.05)
        self.small = nn.Parameter(torch.randn(8, 64, generator=g))

    def forward(self, x):
        h = torch.addmm(self.conv1d_b, x, self.conv1d_w).relu()
        return (h @ self.proj.T) @ self.small.T


def test_matmul_spellings_are_quantized_and_match():
    model = _MatmulForms().eval()
    x = torch.randn(8, 128, generator=torch.Generator().manual_seed(6))
    prog = converter.prepare(model, (x,))
    plan = plan_int8(prog, list(prog.signatures), WeightOnlyInt8(min_elements=1024))
    # Stored [out, in] whatever the spelling: conv1d_w [128, 256] is transposed to [256, 128].
    shapes = {n: tuple(q.shape) for n, (q, s) in plan.weights.items()}
    assert shapes.get("conv1d_w") == (256, 128) and len(shapes) == 2, shapes
    assert all(s.dtype == torch.float32 and s.shape[0] == q.shape[0] for q, s in plan.weights.values())
    bundle = tpu_backend.export_program(prog, platforms=("tpu", "cpu"), quant="int8", use_pallas="auto")
    # h @ proj.T / @ small.T are linears over the weights as stored (converter/passes/fold_matmul_transpose),
    # not transposed copies; the small one stays f32.
    floats = {n: t for n, t in bundle.weights.items() if t.dtype == torch.float32 and t.dim() == 2}
    assert [tuple(t.shape) for t in floats.values()] == [(8, 64)], floats.keys()
    # 128 / 256 wide: "auto" takes the int8 kernel for both.
    assert "_int8_matmul_kernel" in KERNEL.findall(bundle.signatures["serving_default"].exported.mlir_module())
    with torch.no_grad():
        want = model(x)
    assert first_output_rel_err(bundle(x), want) <= 2e-2


def test_quant_scheme_names():
    assert parse_quant("weight_only_int8") == parse_quant("int8") == WeightOnlyInt8()
    assert parse_quant(None) is None
    with pytest.raises(ValueError, match="weight_only_int8"):
        parse_quant("dynamic_int8")


class _Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = nn.Linear(128, 256), nn.Linear(256, 128)
        self.norm = nn.LayerNorm(128)

    def forward(self, x):
        return self.norm(x + self.down(torch.nn.functional.gelu(self.up(x))))


@pytest.mark.libtpu
def test_convert_tpu_v6e_int8_end_to_end(tmp_path):
    torch.manual_seed(7)
    model = _Mlp().eval()
    x = torch.randn(4, 16, 128)
    written = tpu_export.convert(model, (x,), targets=["tpu-v6e"], out_dir=tmp_path, use_pallas="auto",
                                quant_config="weight_only_int8")
    path = written["tpu-v6e"]
    table = _weights_table(path)
    assert table["up.weight.int8"]["dtype"] == "int8" and "up.weight" not in table
    with open(tmp_path / "summary.json") as f:
        info = json.load(f)["targets"]["tpu-v6e"]
    assert info["quant"] == {"scheme": "weight_only_int8", "int8_weights": 2}
    art = tpu_backend.read_artifact(path)
    text = art.signatures["serving_default"].exported.mlir_module()
    # "auto" with 128/256-wide layers: the int8 kernel (blocks for v6e); the layer norm stays on XLA.
    kernels = set(KERNEL.findall(text))
    assert "_int8_matmul_kernel" in kernels and "_norm_kernel" not in kernels
    assert art.compiled, "tpu-v6e writes the AOT executable when libtpu is installed"
    with torch.no_grad():
        want = model(x)
    err = first_output_rel_err(tpu_backend.load(path)(x), want)
    assert err <= 2e-2, f"int8 MLP via convert: rel err {err:.3g}"


@pytest.mark.libtpu
def test_tpu_targets_refuse_other_quant_schemes_before_capture(tmp_path):
    calls = []

    class Boom(nn.Module):
        def forward(self, x):
            calls.append(1)
            return x

    with pytest.raises(ValueError, match="weight_only_int8"):
        tpu_export.convert(Boom(), (torch.randn(2),), targets=["tpu-v6e"], out_dir=tmp_path,
                          quant_config="dynamic_int8")
    assert not calls
