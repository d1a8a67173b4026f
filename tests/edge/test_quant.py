"""Quantization of the edge output (edge/quantize.py over ai-edge-quantizer), every scheme on the zoo's
CNN classifiers and a transformer classifier, through litert_torch.convert, the targets and the CLI.

The models are tests/zoo.py's WIDE variants: ResNet-18 as in the zoo, MobileNetV2 at torchvision's
width 1.0 and ViT at ViT-Ti's width, so that weights dominate the file as in the real models (at the
zoo's own 30-80K parameters, per-channel scales and float biases kept MobileNetV2 int8 at 0.48x and
ViT fp16 at 0.545x of the float file). Accuracy is measured against torch eager on 200 seeded random
inputs (batch 1, one interpreter call each); static int8 calibrates on 32 other seeded inputs.
"""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest
import torch

from tests.zoo import build_wide
from tpu_export import converter, edge, litert_torch
from tpu_export.edge.quantize import QuantConfig, QuantizationError, calibration_feeds, quantize_tflite

pytestmark = [pytest.mark.slow]

MODELS = ["resnet18", "mobilenet_v2", "vit"]  # the CNN classifiers and the transformer (ViT) classifier
SCHEMES = ["dynamic_int8", "weight_only_int8", "weight_only_int4", "fp16", "static_int8"]
N_EVAL, N_CAL = 200, 32

# Minimum top-1 agreement with the float model over the 200 inputs, the issue's: dynamic int8 >= 0.98,
# static int8 >= 0.95; weight-only int8 and fp16 at least as close as dynamic int8. Measured
# (resnet18 / mobilenet_v2 / vit): dynamic 0.990/0.995/0.995, weight-only int8 1.0/0.995/0.995,
# fp16 1.0/1.0/1.0, static 0.975/0.975/0.975 (bench/quant.py, which runs torch one input at a
# time, sees MobileNetV2 at dynamic 0.990 / static 0.965). The float models predict 3 / 5 / 5
# different classes over the inputs (random weights; 91% / 86% / 63% of the inputs on the most
# frequent one). Int4 has no issue bound (15 levels per output channel, ranges clipped by OCTAV):
# measured 0.90/0.90/0.94.
TOP1 = {
    "dynamic_int8": 0.98, "weight_only_int8": 0.98, "fp16": 0.99, "static_int8": 0.95,
    "weight_only_int4": {"resnet18": 0.85, "mobilenet_v2": 0.85, "vit": 0.9},
}
# Max |quantized - float| over all logits / max |float logit|; fp16 <= 1e-2 is the issue's. Measured:
# dynamic 0.063/0.021/0.015, weight-only int8 0.033/0.017/0.009, int4 0.37/0.18/0.16,
# fp16 0.0015/0.0011/0.0004, static 0.088/0.045/0.24.
REL_ERR = {"dynamic_int8": 0.1, "weight_only_int8": 0.06, "weight_only_int4": 0.5, "fp16": 1e-2, "static_int8": 0.35}
# File size / float file size, the bounds on every model: int8 (dynamic, weight-only, static)
# <= 0.3, fp16 <= 0.55. Measured: dynamic 0.275/0.271/0.268, weight-only int8 0.278/0.271/0.269,
# static 0.288/0.287/0.280, fp16 0.513/0.504/0.505; int4 (no issue bound) 0.155/0.157/0.145.
SIZE = {"dynamic_int8": 0.3, "weight_only_int8": 0.3, "static_int8": 0.3, "fp16": 0.55, "weight_only_int4": 0.2}


def _random_inputs(args, n, seed):
    g = torch.Generator().manual_seed(seed)
    return [tuple(torch.randn(a.shape, generator=g) for a in args) for _ in range(n)]


@pytest.fixture(scope="module", params=MODELS)
def zoo_model(request):
    """(name, Program, float .tflite, eval feeds, torch logits for them, calibration feeds)."""
    name = request.param
    module, args = build_wide(name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prog = converter.prepare(module, args)
    float_tflite = edge.convert_program(prog)
    xs = _random_inputs(args, N_EVAL, seed=1)
    with torch.no_grad():
        ref = module(torch.cat([x[0] for x in xs])).numpy()
    feeds = calibration_feeds(prog, xs)["serving_default"]  # the same checks and layout as calibration
    cal = calibration_feeds(prog, _random_inputs(args, N_CAL, seed=2))
    return name, prog, float_tflite, feeds, ref, cal


def test_writer_names_tensors_uniquely(zoo_model):
    """ai-edge-quantizer keys recipes and calibration by tensor name: our writer never repeats one
    (a PAD before a CONV_2D used to share the conv's name), so the renaming fallback is a no-op."""
    from tpu_export.edge.quantize import unique_tensor_names

    float_tflite = zoo_model[2]
    assert unique_tensor_names(float_tflite) is float_tflite


def _run_all(tflite, feeds):
    from ai_edge_litert.interpreter import Interpreter

    runner = Interpreter(model_content=tflite, num_threads=1).get_signature_runner()
    return np.concatenate([runner(**f)["output_0"] for f in feeds])


@pytest.mark.parametrize("scheme", SCHEMES)
def test_scheme_accuracy_and_size(zoo_model, scheme):
    name, prog, float_tflite, feeds, ref, cal = zoo_model
    q = quantize_tflite(float_tflite, scheme, cal if scheme == "static_int8" else None)
    got = _run_all(q, feeds)
    top1 = float((got.argmax(1) == ref.argmax(1)).mean())
    rel = float(np.abs(got - ref).max() / np.abs(ref).max())
    ratio = len(q) / len(float_tflite)
    bound = TOP1[scheme][name] if isinstance(TOP1[scheme], dict) else TOP1[scheme]
    assert top1 >= bound, f"{name} {scheme}: top-1 agreement {top1:.3f} < {bound}"
    assert rel <= REL_ERR[scheme], f"{name} {scheme}: rel err {rel:.4f} > {REL_ERR[scheme]}"
    assert ratio <= SIZE[scheme], f"{name} {scheme}: size {ratio:.3f}x float > {SIZE[scheme]}"
    _assert_scheme_shape(q, scheme)


def test_static_int8_output_range_covers_the_calibration_data(zoo_model):
    """Each activation's int8 range is its min/max over all calibration samples. ai-edge-quantizer's
    own calibration averages per-sample ranges (exponential moving average), which left ResNet-18's
    int8 logits [-1.7, 2.0] where the calibration samples reach [-3.4, 3.8] (rel err 0.40)."""
    from ai_edge_litert import schema_py_generated as schema
    from ai_edge_litert.interpreter import Interpreter

    name, prog, float_tflite, feeds, ref, cal = zoo_model
    q = quantize_tflite(float_tflite, "static_int8", cal)
    runner = Interpreter(model_content=float_tflite, num_threads=1).get_signature_runner()
    logits = np.concatenate([runner(**f)["output_0"] for f in cal["serving_default"]])
    sg = schema.Model.GetRootAs(q, 0).Subgraphs(0)
    (out,) = [sg.Operators(i) for i in range(sg.OperatorsLength())
              if sg.Operators(i).Outputs(0) == sg.Outputs(0)]  # the DEQUANTIZE of the int8 logits
    qp = sg.Tensors(out.Inputs(0)).Quantization()
    scale, zero = float(qp.Scale(0)), int(qp.ZeroPoint(0))
    lo, hi = (-128 - zero) * scale, (127 - zero) * scale
    assert lo <= logits.min() + scale and hi >= logits.max() - scale, (name, (lo, hi), logits.min(), logits.max())
    # and no wider than the data: the int8 steps are spent on the range that occurs
    assert hi - lo <= (logits.max() - logits.min()) * 1.05 + 2 * scale, (name, (lo, hi))


def _assert_scheme_shape(tflite, scheme):
    """What each scheme leaves in the file: weight dtypes, DEQUANTIZE ops, float or int8 activations."""
    from tpu_export.targets.compat.model_ops import read_ops

    ops = read_ops(tflite)
    weights = {t.dtype for op in ops if op.name in ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED", "DEQUANTIZE")
               for t in op.inputs[:2] if t is not None and t.is_const}
    deq = [op for op in ops if op.name == "DEQUANTIZE"]
    if scheme == "dynamic_int8":
        assert "int8" in weights and not deq
    elif scheme == "weight_only_int8":
        assert {op.inputs[0].dtype for op in deq} == {"int8"}
    elif scheme == "weight_only_int4":
        assert "int4" in {op.inputs[0].dtype for op in deq}
    elif scheme == "fp16":
        assert {op.inputs[0].dtype for op in deq} == {"float16"}
    else:  # static: integer compute between the float boundary's QUANTIZE and DEQUANTIZE
        conv = [op for op in ops if op.name in ("CONV_2D", "FULLY_CONNECTED")]
        assert conv and all(op.inputs[0].dtype == "int8" for op in conv)


# ----------------------------------------------------------------------------- litert_torch API


@pytest.fixture(scope="module")
def small_cnn():
    from tpu_export.demo_models import small_cnn

    return small_cnn()


def test_convert_static_int8_float_and_int8_io(small_cnn):
    module, args = small_cnn
    cal = _random_inputs(args, N_CAL, seed=3)
    xs = _random_inputs(args, 20, seed=4)
    with torch.no_grad():
        ref = module(torch.cat([x[0] for x in xs])).numpy()
    f_io = litert_torch.convert(module, args, quant_config="static_int8", calibration_data=cal)
    got = np.concatenate([f_io(*x).numpy() for x in xs])  # float in, float out
    assert float((got.argmax(1) == ref.argmax(1)).mean()) >= 0.95
    assert np.abs(got - ref).max() <= 0.2 * np.abs(ref).max()

    i_io = litert_torch.convert(module, args, quant_config=QuantConfig("static_int8", io_dtype="int8"),
                                calibration_data=iter(cal))  # any iterable
    from ai_edge_litert.interpreter import Interpreter

    from tpu_export.targets.tflm_run import _dequantize, _quantize, measure_arena, run_tflm

    tfl = i_io.tflite_model()
    interp = Interpreter(model_content=tfl)
    (din,), (dout,) = interp.get_input_details(), interp.get_output_details()
    assert din["dtype"] == np.int8 and dout["dtype"] == np.int8
    runner = interp.get_signature_runner()
    (in_name,) = interp.get_signature_list()["serving_default"]["inputs"]
    litert = [_dequantize(runner(**{in_name: _quantize(x[0].numpy(), din)})["output_0"], dout) for x in xs[:5]]
    # the same int8 model in TFLite Micro (the iot runtime) gives the same integers
    arena = measure_arena(tfl)
    for x, want in zip(xs[:5], litert):
        mcu = run_tflm(tfl, {in_name: x[0].numpy()}, arena)["output_0"]
        np.testing.assert_allclose(mcu, want, atol=float(dout["quantization"][0]) * 1.01)
    np.testing.assert_allclose(np.concatenate(litert), ref[:5], atol=0.2 * np.abs(ref).max())
    # Model(...) with float tensors quantizes them with the input's scale/zero point (no blind cast)
    via_model = [_dequantize(i_io(x[0]).numpy(), dout) for x in xs[:5]]
    np.testing.assert_array_equal(np.concatenate(via_model), np.concatenate(litert))


def test_quantized_model_keeps_signatures_and_structure():
    """Two outputs in a dict, keyword inputs: the quantized file keeps the signature and pytree metadata."""

    class TwoHeads(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.body = torch.nn.Linear(32, 64)
            self.a, self.b = torch.nn.Linear(64, 8), torch.nn.Linear(64, 3)

        def forward(self, x, scale):
            h = torch.relu(self.body(x)) * scale
            return {"a": self.a(h), "b": self.b(h)}

    torch.manual_seed(0)
    m = TwoHeads().eval()
    args = (torch.randn(4, 32), torch.ones(4, 1))
    with torch.no_grad():
        want = m(*args)
    for scheme, tol in [("dynamic_int8", 0.05), ("weight_only_int8", 0.05), ("weight_only_int4", 0.25), ("fp16", 1e-2)]:
        got = litert_torch.convert(m, args, quant_config=scheme)(*args)
        assert set(got) == {"a", "b"}
        for k in got:
            assert got[k].shape == want[k].shape
            assert (got[k] - want[k]).abs().max() <= tol * want[k].abs().max(), (scheme, k)


def test_dynamic_batch_calibration_and_quantized_run():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
                            torch.nn.Flatten(), torch.nn.Linear(16, 5)).eval()
    dyn = ({0: torch.export.Dim("batch", min=1, max=16)},)
    cal = [(torch.randn(n, 3, 12, 12),) for n in (1, 3, 8, 2)]  # any batch in range
    model = litert_torch.convert(m, (torch.randn(2, 3, 12, 12),), dynamic_shapes=dyn, quant_config="static_int8",
                                 calibration_data=cal)
    for n in (1, 5):
        x = torch.randn(n, 3, 12, 12)
        with torch.no_grad():
            want = m(x)
        got = model(x)
        assert got.shape == (n, 5) and (got - want).abs().max() <= 0.1 * want.abs().max() + 0.05
    with pytest.raises(QuantizationError, match=r"shape \(17, 3, 12, 12\).*\('batch', 3, 12, 12\)"):
        litert_torch.convert(m, (torch.randn(2, 3, 12, 12),), dynamic_shapes=dyn, quant_config="static_int8",
                             calibration_data=[(torch.randn(17, 3, 12, 12),)])


# ----------------------------------------------------------------------------- errors, before writing


def test_calibration_errors_are_clear(small_cnn):
    module, args = small_cnn
    ok = (torch.randn(args[0].shape),)
    cases = [
        ([], "empty"),
        ([ok, (torch.randn(1, 3, 8, 8),)], r"calibration sample 1 .* shape \(1, 3, 8, 8\) but the signature takes"),
        ([(torch.randint(0, 5, args[0].shape),)], "dtype int64 but the signature takes float32"),
        ([(args[0], args[0])], r"takes inputs \['image'\]; got 2 values"),
        ([{"y": args[0]}], r"missing \['image'\], unknown \['y'\]"),
    ]
    for data, msg in cases:
        with pytest.raises(QuantizationError, match=msg):
            litert_torch.convert(module, args, quant_config="static_int8", calibration_data=data)
    with pytest.raises(QuantizationError, match="calibration_data is required"):
        litert_torch.convert(module, args, quant_config="static_int8")
    with pytest.raises(ValueError, match="only used by static int8"):
        litert_torch.convert(module, args, quant_config="fp16", calibration_data=[ok])


def test_config_errors_are_clear():
    with pytest.raises(QuantizationError, match="unknown quantization scheme 'int3'.*dynamic_int8"):
        QuantConfig("int3")
    with pytest.raises(QuantizationError, match="needs scheme 'static_int8'"):
        QuantConfig("dynamic_int8", io_dtype="int8")
    assert QuantConfig("float16").scheme == "fp16"
    from ai_edge_quantizer import recipe

    raw = litert_torch.QuantConfig(recipe=recipe.dynamic_wi8_afp32())
    assert raw.scheme == "recipe" and not raw.needs_calibration
    assert QuantConfig(recipe=recipe.static_wi8_ai8()).needs_calibration


def test_targets_refuse_schemes_their_runtime_cannot_run(small_cnn, tmp_path):
    from tpu_export.targets import package

    module, args = small_cnn
    prog = converter.prepare(module, args)
    for target, quant, msg in [("iot", "weight_only_int4", "not runnable there"), ("iot", "fp16", "not runnable"),
                               ("web", QuantConfig("static_int8", io_dtype="int8"), "LiteRT.js")]:
        with pytest.raises(QuantizationError, match=msg):
            package(target, prog, str(tmp_path / target), quant_config=quant, calibration_data=[args],
                    say=lambda m: None)
    with pytest.raises(QuantizationError, match="empty"):
        package("android", prog, str(tmp_path / "a"), quant_config="static_int8", calibration_data=[],
                say=lambda m: None)
    assert not os.listdir(tmp_path)  # nothing written


@pytest.mark.parametrize("target", ["android", "ios", "cpu", "web"])
def test_targets_take_every_scheme_their_runtime_runs(small_cnn, tmp_path, target):
    from tpu_export.targets import package

    module, args = small_cnn
    prog = converter.prepare(module, args)
    sizes = {}
    for scheme in SCHEMES:
        cal = _random_inputs(args, 8, seed=5) if scheme == "static_int8" else None
        written = package(target, prog, str(tmp_path / scheme), quant_config=scheme, calibration_data=cal,
                          say=lambda m: None)
        sizes[scheme] = os.path.getsize(next(p for f, p in written.items() if f.endswith(".tflite")))
    assert sizes["weight_only_int4"] < sizes["weight_only_int8"] < sizes["fp16"]


def test_cli_quantize_and_calibration(tmp_path):
    from tpu_export.cli import main
    from tpu_export.demo_models import small_cnn

    _, args = small_cnn()
    npz = tmp_path / "cal.npz"
    np.savez(npz, x=np.random.default_rng(0).standard_normal((16, *args[0].shape[1:])).astype(np.float32)[:, None])
    rc = main(["convert", "tpu_export.demo_models:small_cnn", "--target", "cpu", "-o", str(tmp_path / "o"),
               "--quantize", "static_int8", "--calibration", str(npz), "--quiet"])
    assert rc == 0
    from tpu_export.targets.compat.model_ops import read_ops

    ops = read_ops(open(tmp_path / "o" / "cpu" / "cpu.tflite", "rb").read())
    assert any(op.name == "QUANTIZE" for op in ops)
    bad = tmp_path / "bad.npz"
    np.savez(bad, x=np.zeros((4, 1, 3, 8, 8), np.float32))
    rc = main(["convert", "tpu_export.demo_models:small_cnn", "--target", "cpu", "-o", str(tmp_path / "b"),
               "--quantize", "static_int8", "--calibration", str(bad), "--quiet"])
    assert rc == 1 and not os.path.exists(tmp_path / "b" / "cpu")
    rc = main(["convert", "tpu_export.demo_models:small_cnn", "--target", "iot", "-o", str(tmp_path / "c"),
               "--quantize", "weight_only_int4", "--quiet"])
    assert rc == 1 and not os.path.exists(tmp_path / "c")
