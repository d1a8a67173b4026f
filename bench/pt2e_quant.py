"""PT2E static int8 on the zoo's CNNs: our int8 kernels against torch's converted model, the float model and the
ai-edge-quantizer static_int8 scheme.

    .venv/bin/python bench/pt2e_quant.py [--models resnet18,mobilenet_v2] [--calib 32] [--eval 64]

Per model (tests/zoo.py's own builds, 64x64 images): PT2EQuantizer (per-channel weights) + torchao prepare_pt2e on
--calib seeded random inputs, convert_pt2e, litert_torch.convert(QuantConfig(pt2e_quantizer=...)); then, over --eval
other seeded inputs on the LiteRT interpreter: the int8 ops in the file, max rel err (max |got - float| /
max |float|) and top-1 agreement with the float torch model, the same for static_int8 (ai-edge-quantizer calibrated
on the same inputs) and for torch's converted model itself, and the distance of our file from torch's converted
model in steps of the output's int8 scale (median / max over the inputs).
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _stats(run, model, inputs):
    errs, agree = [], 0
    for x in inputs:
        ref = model(x).detach().numpy()
        out = np.asarray(run(x).detach() if isinstance(run(x), torch.Tensor) else run(x), np.float32)
        errs.append(float(np.abs(out - ref).max() / np.abs(ref).max()))
        agree += int(out.argmax() == ref.argmax())
    return max(errs), agree / len(inputs)


def bench(name: str, n_calib: int, n_eval: int) -> None:
    from torchao.quantization.pt2e import move_exported_model_to_eval
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    import tpu_export.litert_torch as litert_torch
    from tests import zoo
    from tpu_export.edge.inspect import op_histogram
    from tpu_export.litert_torch.quantize.pt2e_quantizer import PT2EQuantizer, get_symmetric_quantization_config
    from tpu_export.litert_torch.quantize.quant_config import QuantConfig

    model, args = zoo.build(name)
    model.eval()
    torch.manual_seed(1)
    calib = [torch.randn_like(args[0]) for _ in range(n_calib)]
    test = [torch.randn_like(args[0]) for _ in range(n_eval)]
    quantizer = PT2EQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True))
    m = prepare_pt2e(torch.export.export(model, args).module(), quantizer)
    with torch.no_grad():
        for c in calib:
            m(c)
    m = convert_pt2e(m, fold_quantize=False)
    move_exported_model_to_eval(m)
    ours = litert_torch.convert(m, args, quant_config=QuantConfig(pt2e_quantizer=quantizer))
    flt = litert_torch.convert(model, args)
    static = litert_torch.convert(model, args, quant_config="static_int8", calibration_data=[(c,) for c in calib])
    data = bytes(ours.tflite_model())
    print(f"{name}: ops {op_histogram(data)}")
    for label, run, size in (("PT2E int8 (ours, LiteRT)", ours, len(data)),
                             ("static_int8 (ai-edge-quantizer)", static, len(bytes(static.tflite_model()))),
                             ("torch convert_pt2e (fake quant)", m, None),
                             ("float (LiteRT)", flt, len(bytes(flt.tflite_model())))):
        rel, top1 = _stats(run, model, test)
        print(f"  {label:34s} max rel err {rel:.4f}  top-1 {top1:.2f}" + (f"  {size} bytes" if size else ""))
    from tpu_export.edge.inspect import read_model

    sg = read_model(data).subgraphs[0]
    deq = [op for op in sg.operators if sg.tensors[op.outputs[0]].type == 0 and sg.tensors[op.inputs[0]].type == 9]
    scale = float(sg.tensors[deq[-1].inputs[0]].quantization.scale[0])
    steps = sorted(float(np.abs(np.asarray(ours(x)) - m(x).detach().numpy()).max()) / scale for x in test)
    print(f"  vs torch convert_pt2e: median {steps[len(steps) // 2]:.0f}, max {steps[-1]:.0f} output steps "
          f"(scale {scale:.4g})")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="resnet18,mobilenet_v2")
    p.add_argument("--calib", type=int, default=32)
    p.add_argument("--eval", type=int, default=64)
    a = p.parse_args()
    warnings.filterwarnings("ignore")
    for name in a.models.split(","):
        bench(name, a.calib, a.eval)


if __name__ == "__main__":
    main()
