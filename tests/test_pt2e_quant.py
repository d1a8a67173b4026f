"""PT2E static / dynamic / QAT quantization end to end: torchao's prepare_pt2e with litert_torch.quantize's
PT2EQuantizer, calibrated here, converted to LiteRT int8 kernels, to the TPU backend and to the iot target.

References and bounds:
- torch's own converted model (``convert_pt2e``: fake-quantized weights and activations) is the reference the
  int8 kernels must reproduce: max |LiteRT - torch| <= 3 steps of the output's int8 scale (the kernels' fixed-point
  requantization rounds a step differently now and then; seen 1 step on the CNN, 1-2 on the block).
- The float model gives the accuracy figure: max |LiteRT - float| / max |float| <= 0.1 (seen ~0.03-0.05).
- The file itself: the int8 kernels and tensor types read from the flatbuffer, every int8 activation's
  (scale, zero point) one the observers chose, every int8 weight's scales the observers' per-channel scales.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

torchao = pytest.importorskip("torchao")

from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e, prepare_qat_pt2e  # noqa: E402

import tpu_export.litert_torch as litert_torch  # noqa: E402
from tpu_export.edge.inspect import read_model  # noqa: E402
from tpu_export.litert_torch.quantize.pt2e_quantizer import (  # noqa: E402
    PT2EQuantizer,
    get_symmetric_quantization_config,
)
from tpu_export.litert_torch.quantize.quant_config import QuantConfig  # noqa: E402

STEPS = 3  # output int8 steps the kernels may differ from torch's fake-quant model by
FLOAT_REL = 0.1  # max |int8 - float| / max |float|

pytestmark = pytest.mark.filterwarnings("ignore:.*register_constant.*", "ignore:.*GraphModule is in training mode")


class CNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.c2 = torch.nn.Conv2d(8, 8, 3, padding=1)
        self.dw = torch.nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.fc = torch.nn.Linear(8 * 4 * 4, 10)

    def forward(self, x):
        y = torch.nn.functional.max_pool2d(torch.relu(self.bn(self.c1(x))), 2)
        y = y + self.c2(y)
        y = torch.relu(self.dw(y))
        return self.fc(torch.flatten(y, 1))


class Block(torch.nn.Module):
    """A pre-norm transformer block: attention (softmax) and an MLP, residual adds."""

    def __init__(self, d=32, heads=4):
        super().__init__()
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.qkv, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.fc1, self.fc2 = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)
        self.heads = heads

    def forward(self, x):
        b, t, c = x.shape
        h = self.heads
        q, k, v = (z.view(b, t, h, c // h).transpose(1, 2) for z in self.qkv(self.ln1(x)).split(c, dim=-1))
        a = torch.softmax(q @ k.transpose(-1, -2) / (c // h) ** 0.5, dim=-1) @ v
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, c))
        return x + self.fc2(torch.relu(self.fc1(self.ln2(x))))


def _model(kind):
    torch.manual_seed(0)
    if kind == "cnn":
        m = CNN()
        with torch.no_grad():  # BatchNorm statistics that are not the identity, folded by prepare_pt2e
            m.bn.running_mean.uniform_(-0.2, 0.2)
            m.bn.running_var.uniform_(0.5, 1.5)
        return m.eval(), lambda: torch.randn(8, 3, 8, 8)  # a batch of 8: 8 calibration calls see 64 images
    return Block().eval(), lambda: torch.randn(1, 8, 32)


def _quantize(model, sample, config, *, qat=False, n_calib=8, fold_quantize=False):
    torch.manual_seed(1)
    quantizer = PT2EQuantizer().set_global(config)
    exported = torch.export.export(model, (sample(),)).module()
    if qat:
        prepared = prepare_qat_pt2e(exported, quantizer)
        opt = torch.optim.SGD(prepared.parameters(), lr=1e-3)
        for _ in range(4):  # a few fake-quantized training steps (the observers learn the ranges as they go)
            opt.zero_grad()
            prepared(sample()).square().mean().backward()
            opt.step()
    else:
        prepared = prepare_pt2e(exported, quantizer)
    with torch.no_grad():
        for _ in range(n_calib):
            prepared(sample())
    converted = convert_pt2e(prepared, fold_quantize=fold_quantize)
    from torchao.quantization.pt2e import move_exported_model_to_eval

    move_exported_model_to_eval(converted)
    return converted, quantizer


def _observed(converted):
    """(activation (scale, zero point) pairs as float32 / int, per-channel weight scale vectors) of the model."""
    acts, weights = set(), []
    for n in converted.graph.nodes:
        name = getattr(n.target, "__name__", "") if n.op == "call_function" else ""
        if name.startswith("quantize_per_tensor"):
            acts.add((float(np.float32(n.args[1])), int(n.args[2])))
        elif name.startswith("quantize_per_channel"):
            weights.append(getattr(converted, n.args[1].target).detach().numpy().astype(np.float32))
    return acts, weights


def _ops(tflite: bytes):
    """[(op name, [input tensors], [output tensors])] of the first subgraph, tensors as the object API's."""
    from tpu_export.edge.builder import builtin_names

    m = read_model(tflite)
    names = builtin_names()
    codes = [max(c.builtinCode, c.deprecatedBuiltinCode) for c in m.operatorCodes]
    sg = m.subgraphs[0]
    return [(names[codes[o.opcodeIndex]], [sg.tensors[i] for i in o.inputs if i >= 0],
             [sg.tensors[i] for i in o.outputs]) for o in sg.operators], m


_INT8, _INT32, _FLOAT32 = 9, 2, 0


def _int8_ops(ops) -> dict:
    """{op name: count} of the ops whose activations (inputs and outputs that are not constant) are all int8."""
    out = {}
    for name, ins, outs in ops:
        acts = [t for t in ins + outs if t.type != _INT32]
        if acts and all(t.type == _INT8 for t in acts):
            out[name] = out.get(name, 0) + 1
    return out


def _run(model, samples):
    outs = []
    for x in samples:
        y = model(x)
        outs.append(np.asarray(y.detach() if isinstance(y, torch.Tensor) else y, np.float32))
    return outs


def _check_against_torch(edge, converted, float_model, samples, out_scale, label):
    got = _run(edge, samples)
    ref = [converted(x).detach().numpy() for x in samples]
    flt = [float_model(x).detach().numpy() for x in samples]
    err = max(float(np.abs(g - r).max()) for g, r in zip(got, ref))
    rel = max(float(np.abs(g - f).max() / np.abs(f).max()) for g, f in zip(got, flt))
    print(f"\n{label}: max |LiteRT - torch fake-quant| = {err:.4g} ({err / out_scale:.2f} output steps); "
          f"max |LiteRT - float| / max|float| = {rel:.4f}")
    assert err <= STEPS * out_scale + 1e-6, (err, out_scale)
    assert rel <= FLOAT_REL, rel
    return err, rel


def _out_scale(ops):
    """The output's int8 scale: the DEQUANTIZE's input at the end of the graph."""
    deq = [ins[0] for name, ins, _ in ops if name == "DEQUANTIZE"]
    return float(deq[-1].quantization.scale[0])


@pytest.fixture(scope="module")
def cnn_static():
    model, sample = _model("cnn")
    converted, quantizer = _quantize(model, sample, get_symmetric_quantization_config(is_per_channel=True))
    with warnings.catch_warnings():
        warnings.simplefilter("error", category=litert_torch_warning())
        edge = litert_torch.convert(converted, (sample(),), quant_config=QuantConfig(pt2e_quantizer=quantizer))
    return model, sample, converted, quantizer, edge


def litert_torch_warning():
    from tpu_export.edge.quantize_pt2e import Pt2eFloatOpsWarning

    return Pt2eFloatOpsWarning


def test_cnn_static_int8_kernels_with_the_observed_scales(cnn_static):
    model, sample, converted, _, edge = cnn_static
    tflite = bytes(edge.tflite_model())
    ops, _ = _ops(tflite)
    int8 = _int8_ops(ops)
    # every compute op int8 (the BatchNorm folded into c1 by prepare_pt2e, the relus fused)
    assert int8.get("CONV_2D") == 2 and int8.get("DEPTHWISE_CONV_2D") == 1 and int8.get("FULLY_CONNECTED") == 1
    assert int8.get("ADD") == 1 and int8.get("MAX_POOL_2D") == 1
    floats = sorted({name for name, ins, outs in ops if any(t.type == _FLOAT32 and t.buffer == 0 for t in ins + outs)})
    assert floats == ["DEQUANTIZE", "QUANTIZE"], floats  # float only at the model's input and output
    acts, weights = _observed(converted)
    for name, ins, outs in ops:
        for t in [t for t in ins + outs if t.type == _INT8 and (t.quantization.scale is not None)]:
            scales = np.asarray(t.quantization.scale, np.float32)
            if len(scales) == 1 and not _is_weight(name, t, ins):
                assert (float(scales[0]), int(t.quantization.zeroPoint[0])) in acts, (name, t.name)
        if name in ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED"):
            w, b = ins[1], ins[2]
            ws = np.asarray(w.quantization.scale, np.float32)
            assert any(len(o) == len(ws) and np.array_equal(o, ws) for o in weights), (name, w.name)
            assert list(w.quantization.zeroPoint) == [0] * len(ws)
            axis = 3 if name == "DEPTHWISE_CONV_2D" else 0
            assert w.quantization.quantizedDimension == axis and w.shape[axis] == len(ws)
            # bias int32 at input scale x weight scale
            assert b.type == _INT32
            np.testing.assert_allclose(b.quantization.scale, ins[0].quantization.scale[0] * ws, rtol=1e-6)
    torch.manual_seed(7)
    samples = [sample() for _ in range(16)]
    _check_against_torch(edge, converted, model, samples, _out_scale(ops), "CNN static int8")


def _is_weight(name, t, ins) -> bool:
    return name in ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED") and t is ins[1]


def test_cnn_file_size_and_accuracy_report(cnn_static, tmp_path):
    model, sample, _, _, edge = cnn_static
    flt = litert_torch.convert(model, (sample(),))
    q_bytes, f_bytes = len(bytes(edge.tflite_model())), len(bytes(flt.tflite_model()))
    print(f"\nCNN .tflite: float {f_bytes} bytes, PT2E int8 {q_bytes} bytes ({q_bytes / f_bytes:.2f}x)")
    assert q_bytes < f_bytes


@pytest.mark.slow
def test_transformer_block_static_int8():
    model, sample = _model("block")
    converted, quantizer = _quantize(model, sample, get_symmetric_quantization_config(is_per_channel=True),
                                     n_calib=64)
    with warnings.catch_warnings():
        warnings.simplefilter("error", category=litert_torch_warning())
        edge = litert_torch.convert(converted, (sample(),), quant_config=QuantConfig(pt2e_quantizer=quantizer))
    ops, _ = _ops(bytes(edge.tflite_model()))
    int8 = _int8_ops(ops)
    # the four projections, both residual adds and the softmax (fixed 1/256 output range) run int8; the layer
    # norms and the attention matmuls stay float, as the quantizer left them (BATCH_MATMUL is not annotated)
    assert int8.get("FULLY_CONNECTED") == 4 and int8.get("ADD") == 2 and int8.get("SOFTMAX") == 1, int8
    sm = next(outs[0] for name, _, outs in ops if name == "SOFTMAX")
    assert np.isclose(sm.quantization.scale[0], 1 / 256) and sm.quantization.zeroPoint[0] == -128
    torch.manual_seed(7)
    samples = [sample() for _ in range(8)]
    _check_against_torch(edge, converted, model, samples, _out_scale(ops), "transformer block static int8")


def test_dynamic_config_uses_dynamic_range_kernels():
    model, sample = _model("cnn")
    converted, quantizer = _quantize(model, sample, get_symmetric_quantization_config(is_per_channel=True,
                                                                                     is_dynamic=True))
    edge = litert_torch.convert(converted, (sample(),), quant_config=QuantConfig(pt2e_quantizer=quantizer))
    ops, _ = _ops(bytes(edge.tflite_model()))
    names = [n for n, _, _ in ops]
    assert "QUANTIZE" not in names and "DEQUANTIZE" not in names
    hybrid = [n for n, ins, outs in ops if len(ins) > 1 and ins[1].type == _INT8 and ins[0].type == _FLOAT32
              and outs[0].type == _FLOAT32]
    assert sorted(hybrid) == ["CONV_2D", "CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED"], hybrid
    torch.manual_seed(7)
    samples = [sample() for _ in range(8)]
    got, ref = _run(edge, samples), [converted(x).detach().numpy() for x in samples]
    rel = max(float(np.abs(g - r).max() / np.abs(r).max()) for g, r in zip(got, ref))
    print(f"\nCNN dynamic: max |LiteRT - torch| / max|torch| = {rel:.4f}")
    assert rel <= 0.05  # activations quantized on the fly by the kernels (torch's dynamic model keeps them float)


@pytest.mark.slow  # convert_pt2e folds the QAT conv + batch norm pattern back: ~25 s of torchao's graph matching
def test_qat_prepared_module_converts_to_int8_kernels():
    model, sample = _model("cnn")
    model.train()
    converted, quantizer = _quantize(model, sample, get_symmetric_quantization_config(is_per_channel=True,
                                                                                     is_qat=True), qat=True)
    model.eval()
    edge = litert_torch.convert(converted, (sample(),), quant_config=QuantConfig(pt2e_quantizer=quantizer))
    ops, _ = _ops(bytes(edge.tflite_model()))
    int8 = _int8_ops(ops)
    assert int8.get("FULLY_CONNECTED") == 1 and int8.get("CONV_2D", 0) + int8.get("DEPTHWISE_CONV_2D", 0) == 3
    torch.manual_seed(7)
    samples = [sample() for _ in range(8)]
    got = _run(edge, samples)
    ref = [converted(x).detach().numpy() for x in samples]
    err = max(float(np.abs(g - r).max()) for g, r in zip(got, ref))
    assert err <= STEPS * _out_scale(ops) + 1e-6


@pytest.mark.slow
def test_tpu_backend_keeps_int8_weights_and_scales():
    from tpu_export import converter, tpu_backend

    model, sample = _model("block")
    converted, _ = _quantize(model, sample, get_symmetric_quantization_config(is_per_channel=True), n_calib=64)
    prog = converter.prepare(converted, (sample(),))
    bundle = tpu_backend.export_program(prog, platforms=("cpu",))
    assert sorted(bundle.quantized_weights) == ["fc1.weight.pt2e", "fc2.weight.pt2e", "proj.weight.pt2e",
                                                "qkv.weight.pt2e"]
    _, weights = _observed(converted)
    plan_scales = [np.asarray(bundle.weights[s], np.float32) for _, s in bundle.quant_parts.values()]
    for s in plan_scales:  # the observers' scales, not re-chosen ones
        assert any(len(o) == len(s) and np.allclose(o, s, rtol=1e-7, atol=0) for o in weights)
    torch.manual_seed(7)
    samples = [sample() for _ in range(4)]
    ref = [converted(x).detach().numpy() for x in samples]
    got = [np.asarray(bundle(x)[0] if isinstance(bundle(x), (list, tuple)) else bundle(x)) for x in samples]
    err = max(float(np.abs(g - r).max()) for g, r in zip(got, ref))
    flt = max(float(np.abs(g - model(x).detach().numpy()).max() / np.abs(model(x).detach().numpy()).max())
              for g, x in zip(got, samples))
    print(f"\nTPU backend (PJRT CPU), block: max |out - torch fake-quant| = {err:.4g}; rel vs float {flt:.4f}")
    out_scale = converted.graph.find_nodes(op="output")[0].args[0][0].args[1]  # the last dequantize's scale
    assert err <= STEPS * out_scale + 1e-6
    assert flt <= FLOAT_REL


@pytest.mark.slow
def test_iot_target_takes_the_pt2e_model_as_full_integer(cnn_static, tmp_path):
    from tpu_export import converter, targets

    model, sample, converted, quantizer, _ = cnn_static
    prog = converter.prepare(converted, (sample(),))
    torch.manual_seed(7)
    ver = [(sample(),) for _ in range(4)]
    files = targets.package("iot", prog, str(tmp_path), quant_config=QuantConfig(pt2e_quantizer=quantizer),
                            verify_inputs=ver, say=lambda s: None)
    data = open(files["model.tflite"], "rb").read()
    ops, m = _ops(data)
    sg = m.subgraphs[0]
    assert all(sg.tensors[i].type == _INT8 for i in list(sg.inputs) + list(sg.outputs))
    names = {n for n, _, _ in ops}
    assert "QUANTIZE" not in names and "DEQUANTIZE" not in names
    from tpu_export.targets.tflm_run import measure_arena, run_tflm

    arena = measure_arena(data)
    for (x,) in ver:  # TFLite Micro vs torch's fake-quant model (input NHWC: the iot layout)
        got = next(iter(run_tflm(data, {"x": x.permute(0, 2, 3, 1).numpy()}, arena).values()))
        scale = sg.tensors[sg.outputs[0]].quantization.scale[0]
        assert np.abs(got - converted(x).detach().numpy()).max() <= STEPS * scale + 1e-6


def test_dynamic_config_refused_by_iot():
    from tpu_export.targets.quantize import QuantizationError, iot_scheme

    q = PT2EQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True, is_dynamic=True))
    with pytest.raises(QuantizationError, match="dynamic PT2E"):
        iot_scheme(QuantConfig(pt2e_quantizer=q))


def test_pt2e_config_without_quantized_graph_and_double_quantization_refused():
    model, sample = _model("cnn")
    q = PT2EQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True))
    with pytest.raises(litert_torch.QuantizationError, match="holds no PT2E"):
        litert_torch.convert(model, (sample(),), quant_config=QuantConfig(pt2e_quantizer=q))
    converted, _ = _quantize(*_model("cnn"), get_symmetric_quantization_config(is_per_channel=True), n_calib=1)
    with pytest.raises(litert_torch.QuantizationError, match="quantize it twice"):
        litert_torch.convert(converted, (sample(),), quant_config="dynamic_int8")
    with pytest.raises(NotImplementedError, match="generative_recipe"):
        QuantConfig(generative_recipe=object())
    with pytest.raises(NotImplementedError, match="is_qat"):
        get_symmetric_quantization_config(is_qat=True, is_dynamic=True)


def test_annotated_op_without_int8_kernel_stays_float_and_is_named():
    """A quantizer that puts sin (no int8 kernel) between observed values: the op runs float between DEQUANTIZE and
    QUANTIZE, a warning names it, and the output still matches torch's converted model."""
    from torchao.quantization.pt2e.quantizer import QuantizationAnnotation, Quantizer

    act = get_symmetric_quantization_config().input_activation

    class SinQuantizer(Quantizer):
        def annotate(self, gm):
            for n in gm.graph.nodes:
                if n.op == "call_function" and n.target is torch.ops.aten.sin.default:
                    n.meta["quantization_annotation"] = QuantizationAnnotation({n.args[0]: act}, act, _annotated=True)
            return gm

        def validate(self, gm):
            pass

    class M(torch.nn.Module):
        def forward(self, x):
            return torch.sin(x) * 2

    torch.manual_seed(0)
    gm = prepare_pt2e(torch.export.export(M(), (torch.randn(4, 8),)).module(), SinQuantizer())
    for _ in range(4):
        gm(torch.randn(4, 8))
    gm = convert_pt2e(gm, fold_quantize=False)
    with pytest.warns(litert_torch_warning(), match=r"SIN \("):
        edge = litert_torch.convert(gm, (torch.randn(4, 8),))
    ops, _ = _ops(bytes(edge.tflite_model()))
    sin = next(ins[0] for name, ins, _ in ops if name == "SIN")
    assert sin.type == _FLOAT32
    x = torch.randn(4, 8)
    np.testing.assert_allclose(_run(edge, [x])[0], gm(x).detach().numpy(), atol=1e-5)


class Gate(torch.nn.Module):
    """y * sigmoid(y) (SiLU written out): the sigmoid's fixed 1/256 range is requantized for the mul's input."""

    def __init__(self):
        super().__init__()
        self.fc, self.fc2 = torch.nn.Linear(16, 16), torch.nn.Linear(16, 4)

    def forward(self, x):
        y = self.fc(x)
        return self.fc2(y * torch.sigmoid(y))


def test_fixed_range_requantized_per_tensor_weights_stored_int8():
    torch.manual_seed(0)
    model = Gate().eval()
    # fold_quantize=True: the weights stored int8, only their dequantize left in the graph
    converted, quantizer = _quantize(model, lambda: torch.randn(4, 16), get_symmetric_quantization_config(), n_calib=32,
                                     fold_quantize=True)
    edge = litert_torch.convert(converted, (torch.randn(4, 16),), quant_config=QuantConfig(pt2e_quantizer=quantizer))
    ops, _ = _ops(bytes(edge.tflite_model()))
    int8 = _int8_ops(ops)
    assert int8.get("FULLY_CONNECTED") == 2 and int8.get("LOGISTIC") == 1 and int8.get("MUL") == 1, int8
    logistic = next(outs[0] for name, _, outs in ops if name == "LOGISTIC")
    assert np.isclose(logistic.quantization.scale[0], 1 / 256) and logistic.quantization.zeroPoint[0] == -128
    # the int8 -> int8 QUANTIZE to the range the mul's input observer chose
    requant = [outs[0] for name, ins, outs in ops if name == "QUANTIZE" and ins[0].type == _INT8]
    acts, _ = _observed(converted)
    assert len(requant) == 1
    assert (float(np.float32(requant[0].quantization.scale[0])), int(requant[0].quantization.zeroPoint[0])) in acts
    for name, ins, _ in ops:
        if name == "FULLY_CONNECTED":
            assert len(ins[1].quantization.scale) == 1  # per-tensor weights
    torch.manual_seed(7)
    samples = [torch.randn(4, 16) for _ in range(8)]
    _check_against_torch(edge, converted, model, samples, _out_scale(ops), "sigmoid gate, per-tensor weights")


@pytest.mark.slow
@pytest.mark.libtpu
def test_tpu_artifact_runs_the_int8_matmul_kernel_and_compiles():
    from tests.tpu.artifact_helpers import KERNEL
    from tpu_export import converter, tpu_backend

    model, sample = _model("block")
    converted, _ = _quantize(model, sample, get_symmetric_quantization_config(is_per_channel=True))
    bundle = tpu_backend.export_program(converter.prepare(converted, (sample(),)), platforms=("tpu", "cpu"),
                                        use_pallas=True)
    assert "_int8_matmul_kernel" in KERNEL.findall(bundle.signatures["serving_default"].exported.mlir_module())
    assert bundle.compile_for("tpu-v6e").report["signatures"]["serving_default"]["executable_bytes"] > 0


def test_set_module_name_quantizes_that_submodule_only():
    torch.manual_seed(0)
    model = Gate().eval()
    quantizer = PT2EQuantizer().set_module_name("fc2", get_symmetric_quantization_config(is_per_channel=True))
    prepared = prepare_pt2e(torch.export.export(model, (torch.randn(4, 16),)).module(), quantizer)
    with torch.no_grad():
        for _ in range(8):
            prepared(torch.randn(4, 16))
    converted = convert_pt2e(prepared, fold_quantize=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", category=litert_torch_warning())
        edge = litert_torch.convert(converted, (torch.randn(4, 16),),
                                    quant_config=QuantConfig(pt2e_quantizer=quantizer))
    ops, _ = _ops(bytes(edge.tflite_model()))
    assert _int8_ops(ops) == {"FULLY_CONNECTED": 1}
    fcs = [ins[1].type for name, ins, _ in ops if name == "FULLY_CONNECTED"]
    assert sorted(fcs) == [_FLOAT32, _INT8]  # fc stays float, fc2 int8
    x = torch.randn(4, 16)
    out_scale = _out_scale(ops)
    assert np.abs(_run(edge, [x])[0] - converted(x).detach().numpy()).max() <= STEPS * out_scale + 1e-6


@pytest.mark.subprocess
def test_saved_pt2e_program_converts_in_a_process_without_torchao(cnn_static, tmp_path):
    """A .pt2 of convert_pt2e's output calls torch.ops.quantized_decomposed.*, which torch registers only when its
    module is imported: the CLI converts it in a fresh process that never imports torchao, and the file matches
    torch's fake-quant model."""
    import subprocess
    import sys

    from ai_edge_litert.interpreter import Interpreter

    _, sample, converted, _, _ = cnn_static
    torch.manual_seed(3)
    x = sample()
    pt2 = tmp_path / "q.pt2"
    torch.export.save(torch.export.export(converted, (x,)), str(pt2))
    code = ("import sys\nfrom tpu_export.cli import main\n"
            f"rc = main(['convert', {str(pt2)!r}, '--target', 'cpu', '-o', {str(tmp_path / 'out')!r}, '--quiet'])\n"
            "print('torchao' in sys.modules, rc)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split()[-2:] == ["False", "0"], r.stdout[-500:]
    it = Interpreter(model_path=str(tmp_path / "out" / "cpu" / "cpu.tflite"))
    run = it.get_signature_runner()
    (got,) = run(**{next(iter(run.get_input_details())): x.numpy()}).values()
    want = converted(x).detach().numpy()
    # the float program computes the fake-quant graph itself: float32 rounding, plus a requantized value that a
    # 1e-7 difference puts in the next int8 step
    assert np.abs(got - want).max() <= 0.02 * np.abs(want).max()


def test_a_pt2_calling_an_unregistered_op_is_named(tmp_path):
    import json
    import zipfile

    from tpu_export.converter.errors import ExportFailedError
    from tpu_export.converter.pt2_load import load_pt2

    m = torch.nn.Linear(4, 2).eval()
    pt2 = tmp_path / "m.pt2"
    torch.export.save(torch.export.export(m, (torch.randn(1, 4),)), str(pt2))
    altered = tmp_path / "altered.pt2"
    with zipfile.ZipFile(pt2) as src, zipfile.ZipFile(altered, "w") as dst:
        for info in src.infolist():
            data = src.read(info)
            if info.filename.endswith("models/model.json"):
                data = json.dumps(json.loads(data)).replace("torch.ops.aten.linear.default",
                                                           "torch.ops.torchao.not_registered.default").encode()
            dst.writestr(info, data)
    with pytest.raises(ExportFailedError, match=r"altered\.pt2: its graph calls torch\.ops\.torchao\.not_registered"
                                                r"\.default, which no imported library has registered.*import torchao"):
        load_pt2(str(altered))
