"""PT2EQuantizer: the torch.ao / torchao PT2E quantizer of litert-torch 0.10, annotating for LiteRT's int8 kernels.

    quantizer = PT2EQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True))
    m = prepare_pt2e(torch.export.export(model.eval(), args).module(), quantizer)
    m(*calibration_args)
    m = convert_pt2e(m, fold_quantize=False)
    litert_torch.convert(m, args, quant_config=QuantConfig(pt2e_quantizer=quantizer))

``prepare_pt2e`` / ``prepare_qat_pt2e`` / ``convert_pt2e`` come from the ``torchao`` package
(``torchao.quantization.pt2e.quantize_pt2e``): torch 2.13 no longer ships ``torch.ao.quantization.quantize_pt2e``.
The annotation follows what LiteRT runs as int8 (int8 activations per tensor, asymmetric; int8 weights
symmetric in [-127, 127], per output channel or per tensor; bias left float and stored int32 at the input scale
times the weight scale by the converter):

- ``linear`` / ``conv2d`` (a following ``relu`` / ``relu6`` / ``hardtanh(0, 6)`` shares the op's output, as LiteRT
  fuses it; a ``batch_norm`` right after a conv is part of the pattern, which QAT trains folded), ``add`` / ``mul``
  (with a following ``relu`` likewise), ``cat`` (every input and the output share one range, as CONCATENATION
  needs), ``max_pool2d`` / ``avg_pool2d`` / ``adaptive_avg_pool2d`` (output shares the input's range), ``sigmoid`` /
  ``softmax`` (LiteRT's fixed output range: scale 1/256, zero point -128);
- shape ops (view, reshape, flatten, permute, transpose, squeeze, unsqueeze...) after a quantized value keep its
  range, so they run int8 too.

Dynamic (``is_dynamic=True``) annotates the weights of linear and conv2d only: LiteRT's dynamic-range kernels
quantize the float activations as they run.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import torch

__all__ = ["PT2EQuantizer", "QuantizationConfig", "get_symmetric_quantization_config"]

_EPS = 2 ** -12  # the smallest scale an observer gives (a constant tensor's range is 0)


@dataclasses.dataclass(eq=True, frozen=True)
class QuantizationConfig:
    """How activations, weights and bias are observed (torchao ``QuantizationSpec``s; None: left float).

    Attributes:
        input_activation: The spec of an op's activation inputs.
        output_activation: The spec of an op's output.
        weight: The spec of linear / conv weights.
        bias: The spec of the bias (None: float, stored int32 by the converter).
        fixed_qparams: The spec of ops whose LiteRT int8 kernel has a fixed output range (sigmoid, softmax).
        is_qat: Fake-quantize for quantization-aware training (``prepare_qat_pt2e``).
        is_dynamic: Weights only; activations are quantized at run time by LiteRT's dynamic-range kernels.
    """

    input_activation: Any
    output_activation: Any
    weight: Any
    bias: Any
    fixed_qparams: Any = None
    is_qat: bool = False
    is_dynamic: bool = False


@functools.lru_cache
def get_symmetric_quantization_config(is_per_channel: bool = False, is_qat: bool = False,
                                      is_dynamic: bool = False) -> QuantizationConfig:
    """The int8 configuration LiteRT's kernels run: asymmetric per-tensor activations, symmetric weights.

    Args:
        is_per_channel: One weight scale per output channel (else one per tensor).
        is_qat: Fake-quantize modules for quantization-aware training (``prepare_qat_pt2e``).
        is_dynamic: Quantize weights only (dynamic-range kernels); activations stay float in the model.

    Returns:
        A frozen QuantizationConfig (cached: the same arguments give the same object).

    Raises:
        NotImplementedError: ``is_qat`` and ``is_dynamic`` together (QAT trains static ranges).
        ImportError: The ``torchao`` package is not installed (``pip install 'tpu-export[pt2e]'``).
    """
    if is_qat and is_dynamic:
        raise NotImplementedError("get_symmetric_quantization_config: is_qat=True with is_dynamic=True is not "
                                  "supported (QAT learns static ranges); pass one of them")
    ao = _torchao()
    obs, fq = ao["observer"], ao["fake_quantize"]
    spec, fixed_spec = ao["QuantizationSpec"], ao["FixedQParamsQuantizationSpec"]
    if is_qat:
        act_ctr = fq.FusedMovingAvgObsFakeQuantize
    else:
        act_ctr = obs.PlaceholderObserver if is_dynamic else obs.HistogramObserver
    act = spec(dtype=torch.int8, quant_min=-128, quant_max=127, qscheme=torch.per_tensor_affine,
               is_dynamic=is_dynamic, observer_or_fake_quant_ctr=act_ctr.with_args(eps=_EPS))
    qscheme = torch.per_channel_symmetric if is_per_channel else torch.per_tensor_symmetric
    w_args: dict = {"eps": _EPS}
    if is_qat:
        w_ctr = fq.FusedMovingAvgObsFakeQuantize
        w_args["observer"] = (obs.MovingAveragePerChannelMinMaxObserver if is_per_channel
                              else obs.MovingAverageMinMaxObserver)
    else:
        w_ctr = obs.PerChannelMinMaxObserver if is_per_channel else obs.MinMaxObserver
    weight = spec(dtype=torch.int8, quant_min=-127, quant_max=127, qscheme=qscheme, ch_axis=0, is_dynamic=False,
                  observer_or_fake_quant_ctr=w_ctr.with_args(**w_args))
    if is_dynamic:
        return QuantizationConfig(None, None, weight, None, None, is_qat, True)
    fixed = fixed_spec(dtype=torch.int8, scale=1 / 256, zero_point=-128, quant_min=-128, quant_max=127,
                       qscheme=torch.per_tensor_affine)
    return QuantizationConfig(act, act, weight, None, fixed, is_qat, False)


def _torchao() -> dict:
    try:
        from torchao.quantization.pt2e import fake_quantize, observer
        from torchao.quantization.pt2e.quantizer import (
            FixedQParamsQuantizationSpec,
            QuantizationAnnotation,
            QuantizationSpec,
            Quantizer,
            SharedQuantizationSpec,
        )
    except ImportError as e:
        raise ImportError("litert_torch.quantize.pt2e_quantizer needs the torchao package (prepare_pt2e moved there "
                          "from torch.ao): pip install 'tpu-export[pt2e]'") from e
    return {"observer": observer, "fake_quantize": fake_quantize, "QuantizationSpec": QuantizationSpec,
            "FixedQParamsQuantizationSpec": FixedQParamsQuantizationSpec, "Quantizer": Quantizer,
            "QuantizationAnnotation": QuantizationAnnotation, "SharedQuantizationSpec": SharedQuantizationSpec}


def _quantizer_base():
    try:
        from torchao.quantization.pt2e.quantizer import Quantizer
    except ImportError:  # the class still imports; get_symmetric_quantization_config says what to install
        return object
    return Quantizer


# ------------------------------------------------------------------------------------------------ annotation

_aten = torch.ops.aten
_LINEAR = {_aten.linear.default}
_CONV = {_aten.conv2d.default, _aten.conv1d.default}
_RELU = {_aten.relu.default, _aten.relu_.default, _aten.relu6.default, _aten.hardtanh.default,
         _aten.hardtanh_.default}
_BATCH_NORM = {_aten.batch_norm.default}  # what torch.export's graph holds for nn.BatchNorm2d
_BINARY = {_aten.add.Tensor, _aten.add_.Tensor, _aten.mul.Tensor, _aten.mul_.Tensor}
_POOL = {_aten.max_pool2d.default, _aten.avg_pool2d.default, _aten.adaptive_avg_pool2d.default}
_FIXED = {_aten.sigmoid.default, _aten.sigmoid_.default, _aten.softmax.int, _aten._softmax.default}
_CAT = {_aten.cat.default, _aten.concat.default}
# ops that move data without changing values: the output keeps the input's range (LiteRT's RESHAPE,
# TRANSPOSE... need the same scale on both sides)
_SHAPE = {_aten.view.default, _aten.reshape.default, _aten.flatten.using_ints, _aten.permute.default,
          _aten.transpose.int, _aten.squeeze.dim, _aten.squeeze.dims, _aten.squeeze.default,
          _aten.unsqueeze.default, _aten._unsafe_view.default, _aten.contiguous.default, _aten.clone.default,
          _aten.t.default, _aten.dropout.default, _aten.identity.default if hasattr(_aten, "identity") else None}
_SHAPE.discard(None)


def _is_float_tensor(n) -> bool:
    val = getattr(n, "meta", {}).get("val") if isinstance(n, torch.fx.Node) else None
    return isinstance(val, torch.Tensor) and val.dtype.is_floating_point


def _annotated(n) -> bool:
    a = n.meta.get("quantization_annotation")
    return a is not None and a._annotated


def _relu_after(n):
    """The relu-like op that is ``n``'s only reader (LiteRT fuses it into the op), else None."""
    if len(n.users) != 1:
        return None
    u = next(iter(n.users))
    if u.target not in _RELU or _annotated(u):
        return None
    if u.target in (_aten.hardtanh.default, _aten.hardtanh_.default):
        lo = u.args[1] if len(u.args) > 1 else u.kwargs.get("min_val", -1.0)
        hi = u.args[2] if len(u.args) > 2 else u.kwargs.get("max_val", 1.0)
        if (lo, hi) not in ((0.0, 6.0), (0, 6)):
            return None
    return u


class _Annotator:
    def __init__(self, config: QuantizationConfig, keep: Callable):
        self.c = config
        self.keep = keep
        self.ao = _torchao()

    def mark(self, node, inputs: dict, output=None) -> None:
        node.meta["quantization_annotation"] = self.ao["QuantizationAnnotation"](
            input_qspec_map=inputs, output_qspec=output, _annotated=True)

    def weighted(self, n) -> None:
        """linear / conv: activation in, weight, optional fused relu; the output range after the relu."""
        x, w = n.args[0], n.args[1]
        if not isinstance(w, torch.fx.Node) or not _is_float_tensor(x):
            return
        # input, weight, bias in this order: prepare_qat_pt2e's conv-bn fusion maps the specs by position
        inputs = {x: self.c.input_activation} if self.c.input_activation is not None else {}
        inputs[w] = self.c.weight
        if len(n.args) > 2 and isinstance(n.args[2], torch.fx.Node) and self.c.bias is not None:
            inputs[n.args[2]] = self.c.bias
        out = n
        if n.target in _CONV and len(n.users) == 1 and next(iter(n.users)).target in _BATCH_NORM:
            # conv -> batch norm as one pattern: QAT trains the folded weight (prepare_qat_pt2e fuses the pair and
            # convert_pt2e folds it back into the conv); the range is the norm's output
            out = next(iter(n.users))
        relu = _relu_after(out) if self.c.output_activation is not None else None
        last = relu if relu is not None else out
        self.mark(n, inputs, self.c.output_activation if last is n else None)
        if out is not n:
            self.mark(out, {}, self.c.output_activation if last is out else None)
        if relu is not None:
            self.mark(relu, {}, self.c.output_activation)

    def binary(self, n) -> None:
        ins = [a for a in n.args[:2] if isinstance(a, torch.fx.Node) and _is_float_tensor(a)]
        if len(ins) != 2 or not _is_float_tensor(n):
            return  # a tensor and a Python scalar: left float (its constant has no observer)
        relu = _relu_after(n)
        self.mark(n, {a: self.c.input_activation for a in ins}, None if relu is not None else self.c.output_activation)
        if relu is not None:
            self.mark(relu, {}, self.c.output_activation)

    def pool(self, n) -> None:
        x = n.args[0]
        if not _is_float_tensor(x):
            return
        self.mark(n, {x: self.c.input_activation}, self.ao["SharedQuantizationSpec"]((x, n)))

    def fixed(self, n) -> None:
        x = n.args[0]
        if not _is_float_tensor(x) or self.c.fixed_qparams is None:
            return
        self.mark(n, {x: self.c.input_activation}, self.c.fixed_qparams)

    def cat(self, n) -> None:
        ins = [a for a in n.args[0] if isinstance(a, torch.fx.Node)]
        if not ins or not all(_is_float_tensor(a) for a in ins):
            return
        first = ins[0]
        shared = self.ao["SharedQuantizationSpec"]((first, n))
        self.mark(n, {a: (self.c.input_activation if a is first else shared) for a in ins}, shared)

    def shape(self, n) -> None:
        x = n.args[0]
        if not isinstance(x, torch.fx.Node) or not _annotated(x) or not _is_float_tensor(n):
            return
        if x.meta["quantization_annotation"].output_qspec is None:
            return
        shared = self.ao["SharedQuantizationSpec"](x)
        self.mark(n, {x: shared}, shared)

    def run(self, model: torch.fx.GraphModule) -> None:
        c = self.c
        for n in model.graph.nodes:
            if n.op != "call_function" or _annotated(n) or not self.keep(n):
                continue
            if n.target in _LINEAR or n.target in _CONV:
                self.weighted(n)
            elif c.is_dynamic or c.input_activation is None:
                continue
            elif n.target in _BINARY:
                self.binary(n)
            elif n.target in _POOL:
                self.pool(n)
            elif n.target in _FIXED:
                self.fixed(n)
            elif n.target in _CAT:
                self.cat(n)
        if c.is_dynamic or c.input_activation is None:
            return
        for n in model.graph.nodes:  # in order, so a chain of shape ops passes the range along
            if n.op == "call_function" and n.target in _SHAPE and not _annotated(n) and self.keep(n):
                self.shape(n)


def _module_path_filter(names: list[str], types: list) -> Callable:
    """True for nodes outside every named submodule and every listed module type."""
    def keep(n) -> bool:
        stack = n.meta.get("nn_module_stack") or {}
        for path, kind in stack.values():
            if any(path == nm or path.startswith(nm + ".") for nm in names):
                return False
            if any(kind is t or getattr(kind, "__name__", None) == getattr(t, "__name__", t) for t in types):
                return False
        return True
    return keep


def _in_module(name: str) -> Callable:
    return lambda n: any(p == name or p.startswith(name + ".")
                         for p, _ in (n.meta.get("nn_module_stack") or {}).values())


def _of_type(tp) -> Callable:
    return lambda n: any(k is tp or getattr(k, "__name__", None) == getattr(tp, "__name__", tp)
                         for _, k in (n.meta.get("nn_module_stack") or {}).values())


class PT2EQuantizer(_quantizer_base()):
    """The quantizer ``prepare_pt2e`` / ``prepare_qat_pt2e`` take, annotating for LiteRT's int8 kernels.

    Configure it with ``set_global`` (and optionally ``set_module_name`` / ``set_module_type`` /
    ``set_operator_type`` for parts of the model), then hand it to torchao's ``prepare_pt2e``. The module
    docstring lists the ops it annotates; everything else stays float.
    """

    def __init__(self):
        super().__init__()
        self.global_config: QuantizationConfig | None = None
        self.operator_type_config: dict = {}
        self.module_type_config: dict = {}
        self.module_name_config: dict = {}

    def set_global(self, quantization_config: QuantizationConfig) -> PT2EQuantizer:
        """Quantize every supported op with ``quantization_config``.

        Args:
            quantization_config: From ``get_symmetric_quantization_config``.

        Returns:
            This quantizer.
        """
        self.global_config = quantization_config
        return self

    def set_operator_type(self, operator_type: Any, quantization_config: QuantizationConfig) -> PT2EQuantizer:
        """Quantize ops of ``operator_type`` (an aten overload packet, e.g. ``torch.ops.aten.linear``) with
        ``quantization_config``.

        Args:
            operator_type: An aten op packet.
            quantization_config: From ``get_symmetric_quantization_config``.

        Returns:
            This quantizer.
        """
        self.operator_type_config[operator_type] = quantization_config
        return self

    def set_module_type(self, module_type: Callable, quantization_config: QuantizationConfig) -> PT2EQuantizer:
        """Quantize the ops inside submodules of class ``module_type`` with ``quantization_config``.

        Args:
            module_type: An ``nn.Module`` subclass.
            quantization_config: From ``get_symmetric_quantization_config``.

        Returns:
            This quantizer.
        """
        self.module_type_config[module_type] = quantization_config
        return self

    def set_module_name(self, module_name: str, quantization_config: QuantizationConfig) -> PT2EQuantizer:
        """Quantize the ops inside the submodule ``module_name`` (a dotted path) with ``quantization_config``.

        Args:
            module_name: A submodule's qualified name (``"blocks.0.attn"``).
            quantization_config: From ``get_symmetric_quantization_config`` (None is not accepted).

        Returns:
            This quantizer.

        Raises:
            ValueError: ``quantization_config`` is None.
        """
        if quantization_config is None:
            raise ValueError(f"set_module_name({module_name!r}, None): a quantization_config is required")
        self.module_name_config[module_name] = quantization_config
        return self

    def transform_for_annotation(self, model: torch.fx.GraphModule) -> torch.fx.GraphModule:
        """Unchanged: the annotation works on the exported graph as it is."""
        return model

    def annotate(self, model: torch.fx.GraphModule) -> torch.fx.GraphModule:
        """Attach torchao quantization annotations to the nodes of ``model`` (``prepare_pt2e`` calls this).

        Args:
            model: The exported graph module.

        Returns:
            ``model``, annotated in place.
        """
        names, types = list(self.module_name_config), list(self.module_type_config)
        for op, cfg in self.operator_type_config.items():
            _Annotator(cfg, lambda n, op=op: getattr(n.target, "overloadpacket", None) is op).run(model)
        for name, cfg in self.module_name_config.items():
            _Annotator(cfg, _in_module(name)).run(model)
        for tp, cfg in self.module_type_config.items():
            _Annotator(cfg, _of_type(tp)).run(model)
        if self.global_config is not None:
            _Annotator(self.global_config, _module_path_filter(names, types)).run(model)
        return model

    def validate(self, model: torch.fx.GraphModule) -> None:
        """Nothing to check: every annotation this quantizer writes is one LiteRT runs."""
