"""``tpu_export::detection_postprocess`` (TFLite's ``TFLite_Detection_PostProcess``): the LiteRT model holds the
custom op and the interpreter's own kernel runs it; its outputs must equal the torch eager form (kept boxes within
1e-4, the same classes, scores within 1e-5, the same count), in fast and regular NMS, and so must the TPU backend's
static-shape program on PJRT CPU. The eager form itself is checked on hand-worked boxes. Only torch is needed."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from tpu_export import converter, litert_torch, tpu_backend
from tpu_export.converter import detection_postprocess

SSD_SCALES = dict(y_scale=10.0, x_scale=10.0, h_scale=5.0, w_scale=5.0)


class Post(torch.nn.Module):
    def __init__(self, anchors, **options):
        super().__init__()
        self.register_buffer("anchors", anchors)
        self.options = options

    def forward(self, enc, scores):
        return detection_postprocess(enc, scores, self.anchors, **SSD_SCALES, **self.options)


def _inputs(n, c, batch=1, seed=0):
    """n anchors crowded enough that many decoded boxes overlap; c classes plus a background column."""
    g = torch.Generator().manual_seed(seed)
    anchors = torch.cat([torch.rand(n, 2, generator=g), torch.rand(n, 2, generator=g) * 0.3 + 0.05], 1)
    return anchors, torch.randn(batch, n, 4, generator=g), torch.rand(batch, n, c + 1, generator=g)


def _edge(model, args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = litert_torch.convert(model.eval(), args)
    return m, m(*args)


def _tpu(model, args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return tpu_backend.export_program(converter.prepare(model.eval(), args))(*args)


def _same_detections(got, ref, per=1):
    boxes, classes, scores, count = got
    assert torch.equal(count, ref[3])
    for b in range(count.shape[0]):
        k = int(ref[3][b]) * per
        torch.testing.assert_close(boxes[b, :k], ref[0][b, :k], rtol=0, atol=1e-4)
        assert torch.equal(classes[b, :k], ref[1][b, :k])
        torch.testing.assert_close(scores[b, :k], ref[2][b, :k], rtol=0, atol=1e-5)


def _custom_ops(tflite: bytes) -> list[tuple[str, dict]]:
    from ai_edge_litert import schema_py_generated as s
    from flatbuffers import flexbuffers

    model = s.ModelT.InitFromObj(s.Model.GetRootAs(tflite, 0))
    found = []
    for sg in model.subgraphs:
        for op in sg.operators:
            code = model.operatorCodes[op.opcodeIndex]
            if code.builtinCode == s.BuiltinOperator.CUSTOM:
                found.append((code.customCode.decode(), flexbuffers.Loads(bytes(bytearray(op.customOptions)))))
    return found


@pytest.mark.parametrize("regular,threshold", [(False, 0.3), (True, 0.3), (False, 0.99), (True, 0.99)])
def test_edge_writes_the_custom_op_and_its_kernel_matches_eager(regular, threshold):
    anchors, enc, scores = _inputs(300, 5)
    opts = dict(max_detections=20, detections_per_class=8, score_threshold=threshold, iou_threshold=0.5,
                use_regular_nms=regular, num_classes=5)
    model = Post(anchors, **opts)
    ref = model(enc, scores)
    assert 0 < int(ref[3][0]) <= 20
    if threshold > 0.9:
        assert int(ref[3][0]) < 20  # fewer candidates than slots
    m, got = _edge(model, (enc, scores))
    _same_detections(got, ref)
    (name, options), = _custom_ops(m.tflite_model())
    assert name == "TFLite_Detection_PostProcess"
    assert options == {"max_detections": 20, "max_classes_per_detection": 1, "detections_per_class": 8,
                       "use_regular_nms": regular, "nms_score_threshold": threshold, "nms_iou_threshold": 0.5,
                       "num_classes": 5, **SSD_SCALES}


def test_edge_runs_one_kernel_per_image_and_several_classes_per_box():
    anchors, enc, scores = _inputs(200, 4, batch=2, seed=1)
    model = Post(anchors, max_detections=10, max_classes_per_detection=2, score_threshold=0.2, iou_threshold=0.4,
                 num_classes=4)
    ref = model(enc, scores)
    m, got = _edge(model, (enc, scores))
    assert got[0].shape == (2, 20, 4) and got[3].shape == (2,)
    _same_detections(got, ref, per=2)
    assert len(_custom_ops(m.tflite_model())) == 2


@pytest.mark.parametrize("regular,per", [
    (True, 1),  # the first pays for jax's start
    pytest.param(False, 1, marks=pytest.mark.slow),  # ~3 s each, ~6 s on a loaded 2-core machine
    pytest.param(False, 2, marks=pytest.mark.slow),
])
def test_tpu_matches_eager(regular, per):
    anchors, enc, scores = _inputs(200, 4, batch=2, seed=2)
    model = Post(anchors, max_detections=12, max_classes_per_detection=per, detections_per_class=5,
                 score_threshold=0.3, iou_threshold=0.45, use_regular_nms=regular, num_classes=4)
    ref = model(enc, scores)
    got = _tpu(model, (enc, scores))
    _same_detections(got, ref, per=per)


def test_eager_on_hand_worked_boxes():
    # zero encodings decode to the anchors themselves: (ymin, xmin, ymax, xmax) = (y - h/2, x - w/2, ...)
    anchors = torch.tensor([[0.5, 0.5, 0.4, 0.4], [0.52, 0.5, 0.4, 0.4], [0.2, 0.2, 0.1, 0.1], [0.8, 0.8, 0.0, 0.1]])
    enc = torch.zeros(1, 4, 4)
    # background, class 0, class 1
    scores = torch.tensor([[[0.0, 0.9, 0.1], [0.0, 0.8, 0.7], [0.0, 0.2, 0.6], [0.0, 0.95, 0.0]]])
    kw = dict(score_threshold=0.5, iou_threshold=0.5, num_classes=2, **SSD_SCALES)
    # fast: anchor 3 (no area: suppresses nothing) first, anchor 0, anchor 1 overlaps anchor 0 (IoU 0.9): dropped
    boxes, classes, sc, count = detection_postprocess(enc, scores, anchors, max_detections=5, **kw)
    assert count.tolist() == [3.0]
    torch.testing.assert_close(boxes[0, :3], torch.tensor([[0.8, 0.75, 0.8, 0.85], [0.3, 0.3, 0.7, 0.7],
                                                           [0.15, 0.15, 0.25, 0.25]]))
    assert classes[0, :3].tolist() == [0.0, 0.0, 1.0] and sc[0, :3].tolist() == pytest.approx([0.95, 0.9, 0.6])
    assert boxes[0, 3:].abs().sum() == 0 and sc[0, 3:].abs().sum() == 0
    # regular: class 0 keeps anchors 3, 0 (1 suppressed by 0); class 1 keeps 1 and 2 (0 is under the threshold)
    _, classes, sc, count = detection_postprocess(enc, scores, anchors, max_detections=3, use_regular_nms=True, **kw)
    assert count.tolist() == [3.0] and classes[0].tolist() == [0.0, 0.0, 1.0]
    assert sc[0].tolist() == pytest.approx([0.95, 0.9, 0.7])


def test_decoding_follows_the_box_coder():
    anchors = torch.tensor([[10.0, 20.0, 4.0, 8.0]])
    enc = torch.tensor([[[1.0, -2.0, 0.5, 1.0]]])  # ty, tx, th, tw
    boxes, *_ = detection_postprocess(enc, torch.ones(1, 1, 1), anchors, max_detections=1, score_threshold=0.0,
                                      iou_threshold=0.5, **SSD_SCALES)
    yc, xc = 1.0 / 10 * 4 + 10, -2.0 / 10 * 8 + 20
    hh, hw = 0.5 * np.exp(0.5 / 5) * 4, 0.5 * np.exp(1.0 / 5) * 8
    torch.testing.assert_close(boxes[0, 0], torch.tensor([yc - hh, xc - hw, yc + hh, xc + hw], dtype=torch.float32))


@pytest.mark.parametrize("change,message", [
    (dict(num_classes=3), r"num_classes must be C = 6 \(no background column\) or C - 1 = 5"),
    (dict(iou_threshold=0.0), r"iou_threshold must be in \(0, 1\]"),
    (dict(max_classes_per_detection=6), r"max_classes_per_detection \(6\) must be at most num_classes \(5\)"),
    (dict(max_detections=0), "max_detections must be a positive int"),
    (dict(y_scale=0.0), "y_scale must be positive"),
])
def test_refuses_what_the_kernel_does_not_accept_by_name(change, message):
    anchors, enc, scores = _inputs(10, 5)
    kw = {**dict(max_detections=5, score_threshold=0.1, iou_threshold=0.5, num_classes=5, **SSD_SCALES), **change}
    with pytest.raises(ValueError, match="detection_postprocess: " + message):
        detection_postprocess(enc, scores, anchors, **kw)


@pytest.mark.libtpu
def test_both_targets_from_one_convert_and_the_tpu_program_compiles_for_v6e(tmp_path):
    import tpu_export

    anchors, enc, scores = _inputs(200, 4, seed=3)
    model = Post(anchors, max_detections=12, detections_per_class=5, score_threshold=0.3, iou_threshold=0.45,
                 use_regular_nms=True, num_classes=4).eval()
    ref = model(enc, scores)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        written = tpu_export.convert(model, (enc, scores), targets=["tpu-v6e", "android"], out_dir=tmp_path,
                                     topology="2x2")
    assert list(tpu_backend.read_artifact(written["tpu-v6e"]).reports()) == ["tpu-v6e-2x2"]  # AOT-compiled
    _same_detections(tpu_backend.load(written["tpu-v6e"])(enc, scores), ref)
    _same_detections(litert_torch.load(written["android"])(enc, scores), ref)
