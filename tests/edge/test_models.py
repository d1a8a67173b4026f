"""Every zoo model through the edge backend: it converts, matches torch (rel err <= 1e-4 on
every output), a CNN has TRANSPOSE ops only at its boundary, and a dynamic batch runs."""

from __future__ import annotations

import os
import warnings

import pytest
import torch

from tests.edge._util import assert_close, leaves
from tests.zoo import ZOO, batch_like

pytestmark = [pytest.mark.slow]

RTOL = 1e-4
# TRANSPOSEs a model asks for itself, beyond the boundary: ShuffleNet's channel shuffle is a
# permute that really moves data (no layout makes it free); one per shuffle unit, written as
# up to three TRANSPOSEs (a pair swap runs faster that way under XNNPACK: Lowerer._transpose).
MODEL_TRANSPOSES = {"shufflenet_v2": 7 * 3}
# Dynamic-batch capture is slow in torch.export (~10 s a model here), so the suite runs a
# subset covering the dynamic-shape lowerings (channel shuffle views, resize, class-token
# expand, attention reshapes, GQA); EDGE_FULL_ZOO=1 runs every zoo model.
DYNAMIC = [n for n, e in ZOO.items() if e.dynamic_batch and (
    os.environ.get("EDGE_FULL_ZOO") or n in ("shufflenet_v2", "deeplabv3", "vit", "bert", "llama"))]


def _convert(module, args, **kw):
    from tpu_export import litert_torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return litert_torch.convert(module, args, **kw)


def _hist(model):
    from tpu_export.edge import op_histogram

    return op_histogram(model.tflite_model())


@pytest.mark.parametrize("name", list(ZOO))
def test_zoo_model_matches_torch(name):
    module, args = ZOO[name].build()
    model = _convert(module, args)
    with torch.no_grad():
        want = module(*args)
    assert_close(model(*args), want, RTOL, what=name)
    if ZOO[name].kind == "cnn":
        boundary = sum(a.dim() == 4 for a in args) + sum(o.dim() == 4 for o in leaves(want))
        n = _hist(model).get("TRANSPOSE", 0)
        assert n <= boundary + MODEL_TRANSPOSES.get(name, 0), f"{name}: {n} TRANSPOSE ops, boundary {boundary}"


@pytest.mark.parametrize("name", DYNAMIC)
def test_zoo_model_dynamic_batch(name):
    module, args = ZOO[name].build()
    sample = batch_like(args, 2)
    dyn = tuple({0: torch.export.Dim("batch", min=1, max=64)} for _ in sample)
    model = _convert(module, sample, dynamic_shapes=dyn)
    # the file itself says the batch is dynamic (other runtimes read only its shape_signature): the dtype
    # policy once specialized deeplabv3's batch to the sample's 2 while re-running max_pool2d_with_indices
    from ai_edge_litert.interpreter import Interpreter

    runner = Interpreter(model_content=model.tflite_model()).get_signature_runner()
    assert all(d["shape_signature"][0] == -1 for d in runner.get_input_details().values()), name
    for n in (1, 4):
        x = batch_like(args, n, seed=n)
        with torch.no_grad():
            want = module(*x)
        assert_close(model(*x), want, RTOL, what=f"{name} batch {n}")


def test_dynamic_batch_resize_tensor_input():
    """The plain interpreter flow: resize_tensor_input + allocate_tensors, then invoke."""
    import numpy as np
    from ai_edge_litert.interpreter import Interpreter

    torch.manual_seed(0)
    module = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, stride=2, padding=1), torch.nn.ReLU6(), torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(), torch.nn.Linear(8, 5)).eval()
    sample = (torch.randn(2, 3, 16, 16),)
    model = _convert(module, sample, dynamic_shapes=({0: torch.export.Dim("batch", max=64)},))
    interp = Interpreter(model_content=model.tflite_model())
    inp = interp.get_input_details()[0]
    assert list(inp["shape_signature"]) == [-1, 3, 16, 16]
    for n in (1, 4):
        x = torch.randn(n, 3, 16, 16)
        interp.resize_tensor_input(inp["index"], [n, 3, 16, 16])
        interp.allocate_tensors()
        interp.set_tensor(inp["index"], x.numpy())
        interp.invoke()
        got = interp.get_tensor(interp.get_output_details()[0]["index"])
        with torch.no_grad():
            want = module(x)
        assert_close(torch.from_numpy(np.array(got)), want, RTOL, what=f"batch {n}")


@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v2", "deeplabv3"])
def test_channel_last_io_has_no_transpose(name):
    from tpu_export import litert_torch

    module, args = ZOO[name].build()
    with torch.no_grad():
        want = module(*args)
    outs = [i for i, o in enumerate(leaves(want)) if o.dim() == 4]
    wrapped = litert_torch.to_channel_last_io(module, args=[0], outputs=outs)
    nhwc = (args[0].permute(0, 2, 3, 1).contiguous(),)
    model = _convert(wrapped, nhwc)
    assert _hist(model).get("TRANSPOSE", 0) == 0
    want_nhwc = want.permute(0, 2, 3, 1) if outs else want
    assert_close(model(*nhwc), want_nhwc, RTOL, what=name)
