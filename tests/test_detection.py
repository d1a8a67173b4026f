"""Detection ops against torchvision eager: NMS on the LiteRT interpreter (NON_MAX_SUPPRESSION_V5, torch's
data-dependent length) and, with a static number of slots and a valid mask, on both backends (LiteRT and
PJRT CPU); roi_align on both. Kept indices must be exactly torchvision's, in its order. Where torchvision's ops do not
load (torch 2.13), the static form is checked against hand-worked boxes only (its eager kernel then is a
greedy loop in torch)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from tpu_export import converter, litert_torch, tpu_backend
from tpu_export.converter import batched_nms_padded, nms_padded
from tpu_export.converter.errors import UnsupportedOpsError
from tpu_export.converter.registry import LoweringRegistry

try:  # torchvision built for another torch imports but has no ops: skip then, as without it
    from torchvision import ops as tv_ops

    torch.ops.torchvision.nms.default  # noqa: B018
    _NO_TV = ""
except Exception as e:  # noqa: BLE001
    tv_ops, _NO_TV = None, f"torchvision with working ops is needed ({type(e).__name__}: {e})"
needs_torchvision = pytest.mark.skipif(tv_ops is None, reason=_NO_TV)


def _boxes(n, seed, spread=60.0, size=40.0):
    """n boxes crowded enough that about half overlap one another above 0.5 IoU."""
    g = torch.Generator().manual_seed(seed)
    xy = torch.rand(n, 2, generator=g) * spread
    wh = torch.rand(n, 2, generator=g) * size + 2
    return torch.cat([xy, xy + wh], 1), torch.rand(n, generator=g), torch.randint(0, 3, (n,), generator=g)


def _edge(model, args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return litert_torch.convert(model.eval(), args)(*args)


def _tpu(model, args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return tpu_backend.export_program(converter.prepare(model.eval(), args))(*args)


class Nms(torch.nn.Module):
    def __init__(self, iou):
        super().__init__()
        self.iou = iou

    def forward(self, boxes, scores):
        keep = tv_ops.nms(boxes, scores, self.iou)
        return keep, boxes[keep], scores[keep]


@needs_torchvision
@pytest.mark.parametrize("seed,n,iou", [(0, 64, 0.5), (1, 200, 0.3), (2, 32, 0.7)])
def test_edge_nms_keeps_torchvisions_boxes_in_its_order(seed, n, iou):
    boxes, scores, _ = _boxes(n, seed, spread=60.0 if iou < 0.6 else 10.0)
    ref = tv_ops.nms(boxes, scores, iou)
    assert 0 < len(ref) < n  # some boxes suppressed, some kept
    keep, kept_boxes, kept_scores = _edge(Nms(iou), (boxes, scores))
    assert torch.equal(keep.long(), ref)  # same length (set at run time), same indices, same order
    torch.testing.assert_close(kept_boxes, boxes[ref], rtol=0, atol=0)
    torch.testing.assert_close(kept_scores, scores[ref], rtol=0, atol=0)


@needs_torchvision
def test_edge_nms_threshold_is_strict_as_torchvisions():
    # IoU exactly 0.5 (inter 1, union 2) is kept at threshold 0.5; disjoint boxes are kept at threshold 0;
    # a box scored -inf or the lowest float is kept (last), as torchvision keeps it
    boxes = torch.tensor([[0.0, 0.0, 2.0, 1.0], [0.0, 0.0, 1.0, 1.0], [5.0, 5.0, 6.0, 6.0], [0.5, 0, 2.0, 1.0],
                          [9.0, 9.0, 10.0, 10.0], [12.0, 12.0, 13.0, 13.0]])
    scores = torch.tensor([0.9, 0.8, 0.7, 0.6, -float("inf"), torch.finfo(torch.float32).min])
    for iou in (0.5, 0.0, 0.74):
        ref = tv_ops.nms(boxes, scores, iou)
        assert torch.equal(_edge(Nms(iou), (boxes, scores))[0].long(), ref), iou


@needs_torchvision
def test_edge_nms_keeps_zero_area_boxes_as_torchvision():
    # torchvision keeps every zero-area box (IoU 0, or NaN between two of them) and lets it suppress nothing;
    # the kernel, left alone, would select the first one again in every remaining slot
    boxes = torch.tensor([[0.0, 0, 4, 4], [1, 1, 1, 3], [1, 1, 1, 3], [0, 0, 4, 4.5], [2, 2, 6, 2], [8, 8, 9, 9]])
    scores = torch.tensor([0.5, 0.9, 0.8, 0.4, 0.7, 0.6])
    for iou in (0.5, 0.0):
        ref = tv_ops.nms(boxes, scores, iou)
        assert torch.equal(_edge(Nms(iou), (boxes, scores))[0].long(), ref), iou
        keep, valid = _edge(Padded1(3), (boxes, scores))
        assert torch.equal(keep.long()[valid], tv_ops.nms(boxes, scores, 0.5)[:3])


class Padded1(torch.nn.Module):
    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, boxes, scores):
        return nms_padded(boxes, scores, 0.5, self.m)


class Batched(torch.nn.Module):
    def forward(self, boxes, scores, idxs):
        keep = tv_ops.batched_nms(boxes, scores, idxs, 0.4)
        return boxes[keep], idxs[keep]


@needs_torchvision
def test_edge_batched_nms_as_torchvisions():
    boxes, scores, idxs = _boxes(120, 3)
    ref = tv_ops.batched_nms(boxes, scores, idxs, 0.4)
    kept_boxes, kept_idxs = _edge(Batched(), (boxes, scores, idxs))
    torch.testing.assert_close(kept_boxes, boxes[ref], rtol=0, atol=0)
    assert torch.equal(kept_idxs.long(), idxs[ref])


class Padded(torch.nn.Module):
    def __init__(self, max_output_size):
        super().__init__()
        self.m = max_output_size

    def forward(self, boxes, scores, idxs):
        k1, v1 = nms_padded(boxes, scores, 0.5, self.m)
        k2, v2 = batched_nms_padded(boxes, scores, idxs, 0.3)  # every box has a slot
        return k1, v1, k2, v2, boxes[k1] * v1[:, None]


def _check_padded(out, boxes, scores, idxs, m):
    k1, v1, k2, v2, b1 = out
    ref1 = tv_ops.nms(boxes, scores, 0.5)[:m]
    ref2 = tv_ops.batched_nms(boxes, scores, idxs, 0.3)
    assert k1.shape == v1.shape == (m,) and k2.shape == v2.shape == (len(boxes),)
    assert int(v1.sum()) == len(ref1) and int(v2.sum()) == len(ref2)
    assert torch.equal(k1.long()[v1], ref1) and torch.equal(k2.long()[v2], ref2)
    assert not k1[~v1].any() and not k2[~v2].any()  # padding is index 0
    torch.testing.assert_close(b1[v1], boxes[ref1], rtol=0, atol=0)


@needs_torchvision
@pytest.mark.parametrize("m", [16, 100])  # fewer slots than kept boxes (cut, lowest scores first), and more
@pytest.mark.parametrize("backend", ["edge", "tpu"])
def test_padded_nms_matches_torchvision_on_both_backends(backend, m):
    boxes, scores, idxs = _boxes(80, 4)
    assert len(tv_ops.nms(boxes, scores, 0.5)) > 16
    model = Padded(m)
    _check_padded(model(boxes, scores, idxs), boxes, scores, idxs, m)  # the eager op itself
    out = (_edge if backend == "edge" else _tpu)(model, (boxes, scores, idxs))
    _check_padded(out, boxes, scores, idxs, m)


def test_padded_nms_refuses_a_bad_max_output_size_by_name():
    boxes, scores, _ = _boxes(8, 0)
    with pytest.raises(ValueError, match="nms_padded: max_output_size must be a positive int"):
        nms_padded(boxes, scores, 0.5, 0)


@needs_torchvision
def test_tpu_refuses_torchvisions_nms_naming_the_static_form():
    boxes, scores, _ = _boxes(16, 0)
    with pytest.raises(UnsupportedOpsError, match=r"torchvision.nms.default(.|\n)*nms_padded"):
        _tpu(Nms(0.5), (boxes, scores))


class RoiAlign(torch.nn.Module):
    def __init__(self, aligned):
        super().__init__()
        self.aligned = aligned

    def forward(self, x, rois):
        return tv_ops.roi_align(x, rois, (5, 4), spatial_scale=0.25, sampling_ratio=2, aligned=self.aligned)


def _rois(k, seed, size=64.0):
    g = torch.Generator().manual_seed(seed)
    xy = torch.rand(k, 2, generator=g) * size - 8  # some start outside the image
    wh = torch.rand(k, 2, generator=g) * size * 0.6
    batch = torch.randint(0, 2, (k, 1), generator=g).float()
    return torch.cat([batch, xy, xy + wh], 1)


@needs_torchvision
@pytest.mark.parametrize("aligned", [False, True])
def test_tpu_roi_align_matches_torchvision(aligned):
    x = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(5))
    rois = _rois(12, 6)
    ref = RoiAlign(aligned)(x, rois)
    out = _tpu(RoiAlign(aligned), (x, rois))
    np.testing.assert_allclose(out.numpy(), ref.numpy(), rtol=0, atol=1e-5)  # float sums in another order


@needs_torchvision
@pytest.mark.parametrize("aligned", [False, True])
def test_edge_roi_align_matches_torchvision(aligned):
    x = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(5))
    rois = _rois(12, 6)
    ref = RoiAlign(aligned)(x, rois)
    out = _edge(RoiAlign(aligned), (x, rois))
    np.testing.assert_allclose(out.numpy(), ref.numpy(), rtol=0, atol=1e-5)



# Without torchvision: the static form against hand-worked results, and the late binding of a lowering by name.
# D overlaps C by IoU 90/110, A overlaps B by 81/119; D, A, B, C by decreasing score.
_HAND_BOXES = torch.tensor([[0.0, 0, 10, 10], [1, 1, 11, 11], [20, 20, 30, 30], [21, 20, 31, 30]])
_HAND_SCORES = torch.tensor([0.9, 0.8, 0.7, 0.95])
_HAND_LABELS = torch.tensor([0, 1, 0, 1])


class Hand(torch.nn.Module):
    def forward(self, boxes, scores, labels):
        return (*nms_padded(boxes, scores, 0.5, 3), *nms_padded(boxes, scores, 0.7),
                *batched_nms_padded(boxes, scores, labels, 0.5))


@pytest.mark.parametrize("run", ["eager", "edge", "tpu"])
def test_padded_nms_on_hand_worked_boxes(run):
    args = (_HAND_BOXES, _HAND_SCORES, _HAND_LABELS)
    out = Hand()(*args) if run == "eager" else (_edge if run == "edge" else _tpu)(Hand(), args)
    k1, v1, k2, v2, k3, v3 = (t.long() if t.dtype != torch.bool else t for t in out)
    assert k1.tolist() == [3, 0, 0] and v1.tolist() == [True, True, False]  # B, C suppressed
    assert k2.tolist() == [3, 0, 1, 0] and v2.tolist() == [True, True, True, False]  # 0.68 <= 0.7 keeps B
    assert k3.tolist() == [3, 0, 1, 2] and v3.all()  # other labels never suppress each other


def test_a_lowering_registered_by_name_binds_when_its_library_defines_the_op():
    table = LoweringRegistry("example")

    @table.lowering_by_name("detection_test_late.twice.default")
    def twice_lowering(ctx, x):
        return x

    assert len(table) == 0  # the op does not exist yet: nothing listed

    @torch.library.custom_op("detection_test_late::twice", mutates_args=())
    def twice(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    assert table.get(torch.ops.detection_test_late.twice.default) is twice_lowering
    assert list(table.targets()) == [torch.ops.detection_test_late.twice.default]


# ------------------------------------------------------------------ torchvision one-stage detectors, end to end
# torchvision's model classes, heads, anchors, box coders and transforms, on a tiny backbone (three levels of 32
# channels at 128x128) with seeded weights spread wide enough that no two candidates tie on score.


class TinyBackbone(torch.nn.Module):
    def __init__(self, ch=16):
        super().__init__()
        self.out_channels = ch
        self.stem = torch.nn.Sequential(torch.nn.Conv2d(3, ch, 3, 4, 1), torch.nn.BatchNorm2d(ch), torch.nn.ReLU())
        self.levels = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Conv2d(ch, ch, 3, 2, 1), torch.nn.ReLU()) for _ in range(3))

    def forward(self, x):
        from collections import OrderedDict

        feats, f = OrderedDict(), self.stem(x)
        for i, level in enumerate(self.levels):
            f = level(f)
            feats[str(i)] = f
        return feats


def _detector(kind):
    from functools import partial

    from torchvision.models import detection as tvd
    from torchvision.models.detection.anchor_utils import AnchorGenerator, DefaultBoxGenerator
    from torchvision.models.detection.fcos import FCOSHead
    from torchvision.models.detection.retinanet import RetinaNetHead
    from torchvision.models.detection.ssd import SSD, SSDHead
    from torchvision.models.detection.ssdlite import SSDLiteHead

    torch.manual_seed(0)
    ch, size, classes = 32, 128, 3
    if kind in ("ssd", "ssdlite"):
        head = (SSDHead([ch] * 3, [4] * 3, classes) if kind == "ssd" else
                SSDLiteHead([ch] * 3, [4] * 3, classes, partial(torch.nn.BatchNorm2d, eps=0.001, momentum=0.03)))
        m = SSD(TinyBackbone(ch), DefaultBoxGenerator([[2]] * 3), (size, size), classes, head=head)
    elif kind == "retinanet":
        anchors = AnchorGenerator(((16,), (32,), (64,)), ((0.5, 1.0, 2.0),) * 3)
        m = tvd.RetinaNet(TinyBackbone(ch), classes, min_size=size, max_size=size, anchor_generator=anchors,
                          head=RetinaNetHead(ch, 3, classes))
    elif kind in ("fasterrcnn", "maskrcnn", "keypointrcnn"):
        from torchvision.models.detection.faster_rcnn import FastRCNNPredictor, TwoMLPHead
        from torchvision.models.detection.mask_rcnn import MaskRCNNHeads, MaskRCNNPredictor
        from torchvision.ops import MultiScaleRoIAlign

        anchors = AnchorGenerator(((16,), (32,), (64,)), ((0.5, 1.0, 2.0),) * 3)
        kw = dict(min_size=size, max_size=size, rpn_anchor_generator=anchors,
                  box_roi_pool=MultiScaleRoIAlign(["0", "1", "2"], 7, 2), box_head=TwoMLPHead(ch * 49, 64),
                  box_predictor=FastRCNNPredictor(64, classes), rpn_pre_nms_top_n_test=100,
                  rpn_post_nms_top_n_test=40, box_detections_per_img=50)
        if kind == "fasterrcnn":
            m = tvd.FasterRCNN(TinyBackbone(ch), None, **kw)
        elif kind == "keypointrcnn":
            from torchvision.models.detection.keypoint_rcnn import KeypointRCNNHeads, KeypointRCNNPredictor

            m = tvd.KeypointRCNN(TinyBackbone(ch), None, keypoint_roi_pool=MultiScaleRoIAlign(["0", "1", "2"], 14, 2),
                                 keypoint_head=KeypointRCNNHeads(ch, (16, 16)),
                                 keypoint_predictor=KeypointRCNNPredictor(16, 5), **kw)
        else:
            m = tvd.MaskRCNN(TinyBackbone(ch), None, mask_roi_pool=MultiScaleRoIAlign(["0", "1", "2"], 14, 2),
                             mask_head=MaskRCNNHeads(ch, (16, 16), 1),
                             mask_predictor=MaskRCNNPredictor(16, 16, classes), **kw)
    else:
        anchors = AnchorGenerator(((8,), (16,), (32,)), ((1.0,),) * 3)
        m = tvd.FCOS(TinyBackbone(ch), classes, min_size=size, max_size=size, anchor_generator=anchors,
                     head=FCOSHead(ch, 1, classes, num_convs=2))
    return _spread(m).eval()


def _spread(m, seed=1):
    """Seeded weights spread wide enough that candidates' scores differ (torchvision's init ties many of them)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for mod in m.modules():
            if isinstance(mod, torch.nn.Conv2d):
                mod.weight.copy_(torch.randn(mod.weight.shape, generator=g) * (2.0 / mod.weight[0].numel()) ** 0.5)
                if mod.bias is not None:
                    mod.bias.copy_(torch.randn(mod.bias.shape, generator=g) * 0.1)
            elif isinstance(mod, (torch.nn.BatchNorm2d, torch.nn.GroupNorm)):
                mod.bias.copy_(torch.rand(mod.bias.shape, generator=g) * 0.2)
            elif isinstance(mod, torch.nn.Linear):
                mod.weight.copy_(torch.randn(mod.weight.shape, generator=g) * (2.0 / mod.weight.shape[1]) ** 0.5)
    return m


def _pairs(ref, boxes, scores, labels, atol=1e-3, score_tol=1e-5):
    """For each of torchvision's detections, the index of the backend detection of the same label within tolerance
    (each used once), or -1."""
    used = torch.zeros(len(boxes), dtype=torch.bool)
    out = []
    for b, s, lab in zip(ref["boxes"], ref["scores"], ref["labels"]):
        ok = (~used & (labels.long() == lab) & ((scores - s).abs() <= score_tol)
              & ((boxes - b).abs().amax(1) <= atol)).nonzero().flatten()
        out.append(int(ok[0]) if len(ok) else -1)
        if len(ok):
            used[ok[0]] = True
    return out


def _unmatched(ref, boxes, scores, labels, atol=1e-3, score_tol=1e-5):
    """torchvision's detections with no backend detection of the same label within tolerance (each used once)."""
    return _pairs(ref, boxes, scores, labels, atol, score_tol).count(-1)


@needs_torchvision
@pytest.mark.parametrize("kind,backend", [
    *((k, b) for k in ("ssd", "ssdlite", "retinanet", "fcos") for b in ("edge", "tpu")),
    ("fasterrcnn", "edge"),
    pytest.param("fasterrcnn", "tpu", marks=pytest.mark.slow),  # ~15 s: three roi_aligns and two NMS loops
    pytest.param("maskrcnn", "edge", marks=pytest.mark.slow),  # ~10 s
    pytest.param("maskrcnn", "tpu", marks=pytest.mark.slow),  # ~23 s
])
def test_torchvision_detector_matches_eager(kind, backend):
    from tpu_export.converter import static_detector

    m = _detector(kind)
    x = torch.rand(1, 3, 128, 128, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ref = m([x[0]])[0]
        static = static_detector(m)
        eager = static(x)
    n = len(ref["boxes"])
    assert 10 < n and len(torch.unique(ref["scores"])) == n  # detections to compare, no ties to break
    # the static form in eager: torchvision's detections exactly, in its order, then invalid slots
    assert int(eager[3].sum()) == n and bool(eager[3][0, :n].all())
    for got, want in zip(eager[:3], (ref["boxes"], ref["scores"], ref["labels"])):
        assert torch.equal(got[0, :n], want)
    if kind == "maskrcnn":  # pasted in static shapes: the same bilinear rules, float sums in another order
        torch.testing.assert_close(eager[4][0, :n], ref["masks"], rtol=0, atol=1e-5)
    out = (_edge if backend == "edge" else _tpu)(static, (x,))
    boxes, scores, labels, valid = out[:4]
    assert boxes.shape == (1, static.slots, 4) and valid.dtype == torch.bool
    assert int(valid.sum()) == n
    v = valid[0]
    # the same detections; two whose scores differ by float rounding may come in either order
    assert _unmatched(ref, boxes[0][v], scores[0][v], labels[0][v]) == 0
    if kind == "maskrcnn":
        torch.testing.assert_close(out[4][0, :n], ref["masks"], rtol=0, atol=1e-5)


def _keypoints_differ(ref_kps, ref_scores, kps, scores, score_atol, box_atol=1e-3):
    """The keypoints (of [N, K]) decoded at another heatmap pixel than torchvision's (more than box_atol, the boxes'
    own float drift, away); each must be a near-tie: one resized-map pixel away (the box over its ceil size, at most
    1 px), its score within score_atol."""
    dist = np.abs(kps[..., :2] - ref_kps[..., :2]).max(-1)
    assert bool((kps[..., 2] == 1).all()) and float(dist.max()) <= 1.0 + box_atol
    np.testing.assert_allclose(scores, ref_scores, rtol=0, atol=score_atol)
    return int((dist > box_atol).sum())


@needs_torchvision
@pytest.mark.parametrize("backend", [
    "edge",
    pytest.param("tpu", marks=pytest.mark.slow),  # ~20 s: three roi_aligns and two NMS loops
])
def test_keypoint_rcnn_matches_eager_with_host_decode(backend):
    from tpu_export.converter import static_detector
    from tpu_export.targets import decode_keypoints

    m = _detector("keypointrcnn")
    # 160x160, resized to 128x128 by the model's transform: boxes and keypoints are scaled back by 1.25
    x = torch.rand(1, 3, 160, 160, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ref = m([x[0]])[0]
        static = static_detector(m)
        eager = static(x)
    n = len(ref["boxes"])
    assert 10 < n and len(torch.unique(ref["scores"])) == n
    assert len(eager) == 7 and eager[4].shape == (1, static.slots, 5, 56, 56) and eager[6].tolist() == [[1.25, 1.25]]
    assert int(eager[3].sum()) == n
    for got, want in zip(eager[:3], (ref["boxes"], ref["scores"], ref["labels"])):
        assert torch.equal(got[0, :n], want)
    # in eager, the host decode of the static heatmaps is torchvision's keypoints exactly
    kps, kscores = decode_keypoints(*(t.numpy() for t in (eager[4], eager[5], eager[3], eager[6])))
    assert kps.shape == (1, static.slots, 5, 3) and not kps[0, n:].any() and not kscores[0, n:].any()
    np.testing.assert_array_equal(kps[0, :n], ref["keypoints"].numpy())
    np.testing.assert_array_equal(kscores[0, :n], ref["keypoints_scores"].numpy())

    out = (_edge if backend == "edge" else _tpu)(static, (x,))
    boxes, scores, labels, valid, heatmaps, kboxes, kscale = out
    assert int(valid.sum()) == n and heatmaps.shape == eager[4].shape
    torch.testing.assert_close(kscale, eager[6], rtol=0, atol=0)
    pairs = _pairs(ref, boxes[0], scores[0], labels[0])
    assert -1 not in pairs
    torch.testing.assert_close(heatmaps[0, pairs], eager[4][0, :n], rtol=0, atol=1e-4)
    kps, kscores = decode_keypoints(heatmaps.numpy(), kboxes.numpy(), valid.numpy(), kscale.numpy())
    differ = _keypoints_differ(ref["keypoints"].numpy(), ref["keypoints_scores"].numpy(), kps[0, pairs],
                               kscores[0, pairs], 1e-4)
    assert differ <= 0.02 * n * 5, differ  # argmax positions: the same but for near-ties (0 of 250 measured)


@pytest.mark.slow
@needs_torchvision
@pytest.mark.parametrize("backend", ["edge", "tpu"])
def test_keypointrcnn_resnet50_fpn_matches_eager(backend):
    from torchvision.models.detection import keypointrcnn_resnet50_fpn

    from tpu_export.converter import static_detector
    from tpu_export.targets import decode_keypoints

    torch.manual_seed(0)  # torchvision's own initialization, seeded; 8 slots keep its 8-conv keypoint head cheap
    m = keypointrcnn_resnet50_fpn(weights=None, weights_backbone=None, num_classes=2, min_size=128, max_size=128,
                                  rpn_pre_nms_top_n_test=100, rpn_post_nms_top_n_test=40,
                                  box_detections_per_img=8).eval()
    with torch.no_grad():  # the untrained backbone's features reach ~200, which saturates every score: scale them
        for block in m.backbone.fpn.layer_blocks:
            block[0].weight.mul_(0.01)
    x = torch.rand(1, 3, 128, 128, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ref = m([x[0]])[0]
        static = static_detector(m)
        eager = static(x)
    n = len(ref["boxes"])
    assert n == 8 and len(torch.unique(ref["scores"])) == n  # every slot a detection, no ties to break
    assert eager[4].shape == (1, 8, 17, 56, 56) and torch.equal(eager[3], torch.ones(1, 8, dtype=torch.bool))
    for got, want in zip(eager[:3], (ref["boxes"], ref["scores"], ref["labels"])):
        assert torch.equal(got[0], want)
    out = (_edge if backend == "edge" else _tpu)(static, (x,))
    boxes, scores, labels, valid, heatmaps, kboxes, kscale = out
    assert bool(valid.all())
    pairs = _pairs(ref, boxes[0], scores[0], labels[0])  # 2e-5 px and 1e-7 measured
    assert -1 not in pairs
    kps, kscores = decode_keypoints(heatmaps.numpy(), kboxes.numpy(), valid.numpy(), kscale.numpy())
    differ = _keypoints_differ(ref["keypoints"].numpy(), ref["keypoints_scores"].numpy(), kps[0, pairs],
                               kscores[0, pairs], 1e-4)
    assert differ <= 0.05 * n * 17, differ  # 0 of 136 measured


@needs_torchvision
def test_static_detector_refuses_what_it_cannot_make_static_by_name():
    from torchvision.models.detection import keypointrcnn_resnet50_fpn

    from tpu_export.converter import static_detector

    m = keypointrcnn_resnet50_fpn(weights=None, weights_backbone=None, num_classes=2)
    m.roi_heads.keypoint_roi_pool = torch.nn.Identity()  # a pooler of one's own: no static form
    with pytest.raises(ValueError, match=r"KeypointRCNN.roi_heads.keypoint_roi_pool \(Identity\) is not torchvision's"):
        static_detector(m)
    with pytest.raises(ValueError, match="static_detector: Linear is not supported"):
        static_detector(torch.nn.Linear(2, 2))


@needs_torchvision
def test_decode_keypoints_is_torchvisions_heatmaps_to_keypoints():
    from torchvision.models.detection.roi_heads import heatmaps_to_keypoints

    from tpu_export.targets import decode_keypoints

    g = torch.Generator().manual_seed(0)
    n = 48
    maps = torch.randn(n, 17, 56, 56, generator=g)
    xy = torch.rand(n, 2, generator=g) * 300 - 20  # some boxes start outside the image
    wh = torch.rand(n, 2, generator=g) * 250
    # under a pixel (clamped to 1), exactly the map's size, a fractional edge, a point box
    wh[:4] = torch.tensor([[0.3, 0.5], [56.0, 56.0], [1.0, 200.5], [0.0, 0.0]])
    rois = torch.cat([xy, xy + wh], 1)
    ref_kps, ref_scores = heatmaps_to_keypoints(maps, rois)
    valid = np.ones(n, bool)
    valid[-3:] = False
    scale = np.array([1.5, 0.75], np.float32)
    kps, scores = decode_keypoints(maps.numpy(), rois.numpy(), valid, scale)  # one image: [D, ...]
    want = ref_kps.numpy()[:-3] * np.array([1.5, 0.75, 1.0], np.float32)  # torchvision's resize_keypoints
    # bicubic taps, sums and argmax as torch's CPU kernel (AVX2 / AVX512: fused multiply-adds) computes them
    if torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512"):
        np.testing.assert_array_equal(kps[:-3], want)
        np.testing.assert_array_equal(scores[:-3], ref_scores.numpy()[:-3])
    else:  # torch's kernel without FMA rounds each product: scores within float32 rounding, ties aside
        np.testing.assert_allclose(scores[:-3], ref_scores.numpy()[:-3], rtol=0, atol=1e-5)
    assert not kps[-3:].any() and not scores[-3:].any()


def test_decode_keypoints_on_hand_worked_heatmaps():
    from tpu_export.targets import decode_keypoints

    # one peak per map: its pixel's centre, mapped through the box (size / ceil(size)) and the image scale
    heatmaps = np.zeros((1, 2, 2, 56, 56), np.float32)
    heatmaps[0, 0, 0, 10, 20] = heatmaps[0, 0, 1, 40, 5] = 1.0
    heatmaps[0, 1, 0, 0, 55] = 2.0
    boxes = np.array([[[0.0, 0.0, 56.0, 56.0], [10.0, 20.0, 66.0, 76.0]]], np.float32)
    kps, scores = decode_keypoints(heatmaps, boxes, np.array([[True, False]]), np.array([[2.0, 0.5]], np.float32))
    assert kps[0, 0].tolist() == [[41.0, 5.25, 1.0], [11.0, 20.25, 1.0]]
    assert scores[0, 0].tolist() == [1.0, 1.0] and not kps[0, 1].any() and not scores[0, 1].any()
    with pytest.raises(ValueError, match=r"decode_keypoints: boxes must be \[B, D, 4\]"):
        decode_keypoints(heatmaps, boxes[:, :1])


@pytest.mark.subprocess
def test_decode_keypoints_imports_without_torch(tmp_path):
    import subprocess
    import sys

    code = ("import sys; from tpu_export.targets import decode_keypoints; import numpy as np; "
            "decode_keypoints(np.zeros((1, 1, 56, 56), np.float32), np.zeros((1, 4), np.float32)); "
            "assert 'torch' not in sys.modules, 'torch was imported'")
    r = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]


# ------------------------------------------------------------------ SSD ending in TFLite_Detection_PostProcess


@needs_torchvision
@pytest.mark.parametrize("kind,backend", [
    ("ssd", "edge"),
    pytest.param("ssd", "tpu", marks=pytest.mark.slow),  # ~15 s: an NMS loop per class over 1344 anchors
    pytest.param("ssdlite", "edge", marks=pytest.mark.slow),
])
def test_ssd_with_tflite_postprocess_matches_torchvision(kind, backend, monkeypatch):
    from torchvision.models.detection import ssd as tv_ssd

    from tpu_export.converter import static_detector

    m = _detector(kind)
    x = torch.rand(1, 3, 128, 128, generator=torch.Generator().manual_seed(3))
    det = static_detector(m, postprocess="tflite")
    with torch.no_grad():
        boxes, classes, scores, count = det(x)
        ref = m([x[0]])[0]
        n = int(count[0])
        # torchvision's boxes are (x1, y1, x2, y2) in pixels, its labels count the background
        mine = (boxes[0, :n][:, [1, 0, 3, 2]] * 128, scores[0, :n], classes[0, :n].long() + 1)
        assert len(ref["boxes"]) == n == det.slots  # enough candidates to fill every slot
        # torchvision clips the decoded boxes to the image before NMS, the kernel does not: where boxes cross
        # the border, overlaps and so some decisions differ; the detections both keep agree
        both = n - _unmatched(ref, mine[0].clamp(0, 128), mine[1], mine[2], atol=1e-3, score_tol=1e-5)
        assert both >= 0.85 * n  # 175 of 200 (SSD), 179 (SSDlite)
        # without that clipping and with every anchor a candidate (topk_candidates), the same detections
        m.topk_candidates = det.num_anchors
        monkeypatch.setattr(tv_ssd.box_ops, "clip_boxes_to_image", lambda b, size: b)
        ref = m([x[0]])[0]
    assert len(ref["boxes"]) == n and _unmatched(ref, *mine, atol=1e-3, score_tol=1e-5) == 0
    out = (_edge if backend == "edge" else _tpu)(det, (x,))
    assert torch.equal(out[3], count)
    torch.testing.assert_close(out[0][0, :n], boxes[0, :n], rtol=0, atol=1e-5)  # units of the image size
    assert torch.equal(out[1][0, :n], classes[0, :n])
    torch.testing.assert_close(out[2][0, :n], scores[0, :n], rtol=0, atol=1e-5)


@needs_torchvision
def test_ssd_with_tflite_fast_postprocess_on_the_kernel_matches_eager():
    from tpu_export.converter import static_detector

    det = static_detector(_detector("ssd"), max_detections=50, postprocess="tflite_fast")
    x = torch.rand(1, 3, 128, 128, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want = det(x)
    n = int(want[3][0])
    assert n == 50
    got = _edge(det, (x,))
    assert torch.equal(got[3], want[3]) and torch.equal(got[1][0, :n], want[1][0, :n])
    torch.testing.assert_close(got[0][0, :n], want[0][0, :n], rtol=0, atol=1e-5)
    torch.testing.assert_close(got[2][0, :n], want[2][0, :n], rtol=0, atol=1e-5)


@needs_torchvision
def test_static_detector_tflite_postprocess_is_for_ssd_only():
    from tpu_export.converter import static_detector

    with pytest.raises(ValueError, match="static_detector: postprocess='tflite' is for torchvision's SSD"):
        static_detector(_detector("retinanet"), postprocess="tflite")
    with pytest.raises(ValueError, match="static_detector: postprocess must be one of static, tflite, tflite_fast"):
        static_detector(_detector("ssd"), postprocess="nms")


# ------------------------------------------------------------------ MultiScaleRoIAlign in a model of one's own


class Pooler(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.pool = tv_ops.MultiScaleRoIAlign(["p2", "p3", "p4"], 7, 2)

    def forward(self, f2, f3, f4, boxes_a, boxes_b):
        from collections import OrderedDict

        feats = OrderedDict([("p2", f2), ("p3", f3), ("p4", f4)])
        return self.pool(feats, [boxes_a, boxes_b], [(256, 256), (256, 240)])


@needs_torchvision
@pytest.mark.parametrize("backend", ["edge", "tpu"])
def test_multiscale_roi_align_in_a_users_model_matches_torchvision(backend):
    g = torch.Generator().manual_seed(0)
    feats = [torch.randn(2, 8, 256 // s, 256 // s, generator=g) for s in (4, 8, 16)]

    def boxes(k):
        side = torch.exp(torch.rand(k, 2, generator=g) * (np.log(300) - np.log(8)) + np.log(8))  # 8 to 300 px
        xy = torch.rand(k, 2, generator=g) * 200
        return torch.cat([xy, xy + side], 1)

    args = (*feats, boxes(24), boxes(16))
    m = Pooler().eval()
    ref = m(*args)
    levels = m.pool.map_levels([args[3], args[4]])
    assert set(levels.tolist()) == {0, 1, 2}  # every level is some box's
    out = (_edge if backend == "edge" else _tpu)(m, args)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-4)


# ------------------------------------------------------------------ ultralytics YOLO: its own Detect head, built
# from its yaml with seeded random weights (no download), with and without NMS in the graph


class YoloWithNms(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x):
        from tpu_export.converter import yolo_nms_padded

        raw = self.model(x)[0]  # [B, 4 + nc, A]: the head's boxes (cx, cy, w, h) and class scores
        dets, valid = yolo_nms_padded(raw, 0.25, 0.45, 100)
        return raw, dets, valid


@pytest.mark.slow
@needs_torchvision
@pytest.mark.parametrize("backend", ["edge", "tpu"])
@pytest.mark.parametrize("cfg", ["yolov8n.yaml", "yolo11n.yaml"])
def test_ultralytics_yolo_matches_eager(cfg, backend, tmp_path, monkeypatch):
    monkeypatch.setenv("YOLO_OFFLINE", "1")
    monkeypatch.setenv("YOLO_CONFIG_DIR", str(tmp_path))  # ultralytics writes its settings file there
    pytest.importorskip("ultralytics")
    from ultralytics.nn.tasks import DetectionModel
    from ultralytics.utils.nms import non_max_suppression

    torch.manual_seed(0)
    m = DetectionModel(cfg, nc=3, verbose=False).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # spread weights: its init gives near-equal scores, which only a tie-break would order
        for mod in m.modules():
            if isinstance(mod, torch.nn.Conv2d):
                mod.weight.copy_(torch.randn(mod.weight.shape, generator=g) * (2.0 / mod.weight[0].numel()) ** 0.5)
                if mod.bias is not None:
                    mod.bias.copy_(torch.randn(mod.bias.shape, generator=g) * 0.1)
            elif isinstance(mod, torch.nn.BatchNorm2d):
                mod.bias.copy_(torch.rand(mod.bias.shape, generator=g) * 0.2)
    x = torch.rand(1, 3, 128, 128, generator=torch.Generator().manual_seed(2))
    model = YoloWithNms(m).eval()
    with torch.no_grad():
        raw, dets, valid = model(x)
        ref = non_max_suppression(raw.clone(), 0.25, 0.45, max_det=100)[0]  # ultralytics' own NMS, in eager
    n = len(ref)
    assert n > 20 and int(valid.sum()) == n and torch.equal(dets[0, :n], ref)  # the static form: exactly its rows
    raw2, dets2, valid2 = (_edge if backend == "edge" else _tpu)(model, (x,))
    np.testing.assert_allclose(raw2.numpy(), raw.numpy(), rtol=0, atol=1e-4)  # boxes in pixels, scores in [0, 1]
    assert int(valid2.sum()) == n
    torch.testing.assert_close(dets2[0, :n], ref, rtol=0, atol=1e-4)
