"""The zoo's architectures (tests/zoo.py) exported to ONNX by both torch exporters (TorchScript at opset 17,
dynamo/onnxscript at opset 18), imported, converted to both outputs and compared with onnxruntime
(rel err <= 1e-4). On the edge path an imported model (a CNN in NHWC form: channel-last inputs and image
outputs) has no more TRANSPOSE ops than the same model converted from torch: the importer adds no layout
transposes."""

from __future__ import annotations

import io
import warnings

import numpy as np
import pytest
import torch

from tests.numerics import rel_err
from tests.zoo import ZOO, build

pytestmark = [pytest.mark.slow]


def _export(name, kind):
    m, args = build(name)
    buf = io.BytesIO()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        if kind == "torchscript17":
            torch.onnx.export(m, args, buf, opset_version=17, dynamo=False)
            data = buf.getvalue()
        else:
            data = torch.onnx.export(m, args, opset_version=18, dynamo=True, verbose=False).model_proto
            data = data.SerializeToString()
    return m, args, data


def _ort(data, args):
    import onnxruntime as ort

    sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    feeds = {i.name: a.numpy() for i, a in zip(sess.get_inputs(), args)}
    return [o.name for o in sess.get_outputs()], sess.run(None, feeds)


_GELU_MODELS = {"convnext", "vit", "swin", "bert", "t5"}


def _params():
    for name in ZOO:
        for kind in ("torchscript17", "dynamo18"):
            yield pytest.param(name, kind, id=f"{name}-{kind}")


@pytest.mark.parametrize("name,kind", list(_params()))
def test_zoo_model_from_onnx(name, kind):
    import jax
    import onnx

    from tpu_export import converter, litert_torch
    from tpu_export.converter.onnx import import_onnx
    from tpu_export.edge import convert_program, op_histogram
    from tpu_export.tpu_backend.lowering import lower_signature

    m, args, data = _export(name, kind)
    names, want = _ort(data, args)
    imp = import_onnx(onnx.load_model_from_string(data))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prog = converter.prepare(imp.module, imp.sample_args, dynamic_shapes=imp.dynamic_shapes)
    low = lower_signature(prog)
    flat = [a.numpy().astype(dt) for a, dt in zip(args, low.input_dtypes)]
    tpu = jax.jit(low.fn)(low.weight_arrays(prog), *flat)
    for n, g, w in zip(names, tpu, want):
        assert rel_err(np.asarray(g), w) <= 1e-4, f"tpu {n}: {rel_err(np.asarray(g), w):.3g}"
    fb = convert_program(prog)
    edge = litert_torch.Model(fb)(*args)
    for n, w in zip(names, want):
        assert rel_err(edge[n], w) <= 1e-4, f"edge {n}: {rel_err(edge[n], w):.3g}"
    hist = op_histogram(fb)
    # the exporters write GELU as Erf (or Tanh) arithmetic; the importer folds it back into one GELU
    assert "ERF" not in hist and (hist.get("GELU", 0) > 0) == (name in _GELU_MODELS), hist
    if kind == "torchscript17":  # one exporter is enough: the layout is the importer's
        io_ = ((0,), tuple(i for i, w in enumerate(want) if w.ndim == 4)) if ZOO[name].kind == "cnn" else ((), ())
        ours = op_histogram(convert_program(prog, to_channel_last_io=io_)).get("TRANSPOSE", 0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ref = converter.prepare(m, args)
        theirs = op_histogram(convert_program(ref, to_channel_last_io=io_)).get("TRANSPOSE", 0)
        assert ours <= theirs, f"{ours} TRANSPOSE ops from ONNX, {theirs} from torch"


@pytest.mark.parametrize("name", ["resnet18", "swin", "bert"])
def test_zoo_model_with_dynamic_batch(name, tmp_path):
    """A TorchScript export with dynamic_axes: the dim_params 'batch' (and for bert 'seq', given a range) are
    dynamic dims of the Program (shape arithmetic on them traced with SymInts), and both outputs run other
    batches (and lengths) like onnxruntime."""
    import onnxruntime as ort

    import tpu_export
    from tests.zoo import batch_like
    from tpu_export import litert_torch, tpu_backend

    m, args = build(name)
    names = [f"in{i}" for i in range(len(args))]
    axes = {0: "batch", 1: "seq"} if name == "bert" else {0: "batch"}
    path = tmp_path / f"{name}.onnx"
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(m, args, str(path), opset_version=17, dynamo=False, input_names=names,
                          dynamic_axes={n: axes for n in names})
    # bert's position table has 16 rows: seq takes a range, as torch.export.Dim would
    written = tpu_export.convert(path, targets=["cpu-xla", "cpu"], out_dir=tmp_path / "out",
                                 dim_sizes={"seq": (2, 16)} if 1 in axes else None)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    tpu, edge = tpu_backend.load(written["cpu-xla"]), litert_torch.load(written["cpu"])
    for b, length in ((3, 16), (1, 7)):
        a = batch_like(args, b)
        a = tuple(x[:, :length] for x in a) if 1 in axes else a
        want = sess.run(None, {n: x.numpy() for n, x in zip(names, a)})
        for got in (tpu(*a), edge(*a)):
            got = list(got.values()) if isinstance(got, dict) else [got]
            assert [rel_err(g, w) <= 1e-4 for g, w in zip(got, want)] == [True] * len(want), (b, got)
