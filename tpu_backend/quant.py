"""Weight-only int8 for the TPU artifact: int8 weights + per-output-channel f32 scales.

Which weights: floating 2-D weights of at least ``min_elements`` values whose every use (in
every signature: weights are shared) reads them as a matrix whose rows or columns are output
channels:

- ``aten.linear(x, w, b)``: w [N, K], a scale per row;
- ``aten.embedding(w, ids)``: w [V, D], a scale per row (a tied embedding / lm_head weight
  is quantized once for both uses);
- ``aten.mm`` / ``aten.matmul(x, w)`` / ``aten.addmm(b, x, w)`` with w [K, N] (GPT-2's Conv1D,
  ``x @ w``; ``x @ w.T`` arrives so too, as the converter folds ``w.T`` into a weight): a scale
  per column; stored transposed, so every stored int8 weight is [out, in] (the kernel's layout).

A PT2E-quantized program (``prepare_pt2e`` / ``convert_pt2e``; converter/passes/pt2e_qdq.py) has its linear
weights stored so whether or not ``quant`` is asked, with the observer's per-channel scales, not ones chosen
here; its other quantized weights (convolutions) stay float32 holding the same int8-grid values, and each
observed activation is rounded to its int8 grid (scale, zero point) as torch's converted model rounds it (for every
reader: where torch rounds a value for some readers only, the others see it within half a step of their float).

Each quantized weight ``name`` is stored as ``name.int8`` (int8) and ``name.int8_scale``
(float32) in place of the float tensor: a quarter of the f32 bytes plus 4 bytes per output
channel. Its linears lower through ``tpu_backend.pallas.int8_linear`` (the Pallas dequantizing
matmul on TPU when use_pallas allows, XLA's dequantize-and-dot elsewhere) and its embedding
lookups gather int8 rows and scale them. Symmetric rounding to nearest (|q| <= 127): the
relative error of a weight is at most 1/254 of its channel's largest magnitude.
"""

from __future__ import annotations

import dataclasses

import torch

__all__ = ["WeightOnlyInt8", "QInt8", "QUANT_SCHEMES", "parse_quant", "plan_int8", "int8_rewrite", "Int8Plan",
           "pt2e_weights", "pt2e_activation_ranges"]

aten = torch.ops.aten

QUANT_SCHEMES = ("weight_only_int8", "int8")  # "int8" is an alias


@dataclasses.dataclass(frozen=True)
class WeightOnlyInt8:
    """min_elements: smaller weights stay float (their scales would cost more than they save)."""

    min_elements: int = 1024


def parse_quant(quant) -> WeightOnlyInt8 | None:
    """None, "weight_only_int8" / "int8", or a WeightOnlyInt8 -> the config (None: no quantization)."""
    if quant is None or isinstance(quant, WeightOnlyInt8):
        return quant
    if isinstance(quant, str) and quant.lower() in QUANT_SCHEMES:
        return WeightOnlyInt8()
    raise ValueError(f"TPU quantization {quant!r} is not supported; the TPU backend takes "
                     f"{' / '.join(QUANT_SCHEMES)} (weight-only int8), or dtype='bfloat16'")


@dataclasses.dataclass
class QInt8:
    """What the rewritten users of a quantized weight receive: int8 [out, in] and f32 [out]."""

    values: object
    scale: object


@dataclasses.dataclass
class Int8Plan:
    """weight name -> (int8 [out, in] tensor, f32 [out] scale): the stored parts."""

    weights: dict
    config: WeightOnlyInt8

    def part_names(self, name: str) -> tuple[str, str]:
        return f"{name}.int8", f"{name}.int8_scale"


def _uses(w) -> list | None:
    """[(orientation, node to rewrite)] for weight node ``w``; None if some use reads it otherwise.
    orientation "rows": rows are output channels; "cols": columns are."""
    out = []
    for u in w.users:
        if u.target is aten.linear.default and u.args[1] is w and u.args[0] is not w and w not in u.args[2:]:
            out.append(("rows", u))
        elif u.target is aten.embedding.default and u.args[0] is w and w not in u.args[1:]:
            out.append(("rows", u))
        elif u.target in (aten.mm.default, aten.matmul.default, aten.addmm.default) and _right_operand(u, w):
            out.append(("cols", u))
        else:
            return None
    return out


def _right_operand(u, w) -> bool:
    """w is the [in, out] operand of mm / matmul / addmm ``u``, and nothing else of it."""
    if u.target is not aten.addmm.default:
        return u.args[1] is w and u.args[0] is not w
    return u.args[2] is w and w not in u.args[:2]


def pt2e_weights(prog, signature_names) -> dict:
    """{weight name: QParams} of the weights a PT2E model quantized (converter/passes/pt2e_qdq.py): their values
    are on the int8 grid of the observer's scales, which the plan keeps instead of choosing its own."""
    out = {}
    for name in signature_names:
        for w in prog.signature(name).weight_nodes():
            qp = w.meta.get("pt2e_qparams")
            if qp is not None:
                out[w.meta["weight_name"]] = qp
    return out


def pt2e_activation_ranges(sig) -> dict:
    """{node: fake-quantize function} for the activations of signature ``sig`` a PT2E model observed: the value
    rounded to its int8 grid and back, as torch's converted model (and the edge's int8 kernels) compute it."""
    out = {}
    for n in sig.graph.nodes:
        qp = n.meta.get("pt2e_qparams")
        if qp is not None and qp.axis is None and "weight_name" not in n.meta:
            out[n] = _fake_quant(qp)
    return out


def _fake_quant(qp):
    def apply(x):
        import jax.numpy as jnp

        if not jnp.issubdtype(x.dtype, jnp.floating):
            return x
        xf = x.astype(jnp.float32)
        q = jnp.clip(jnp.round(xf * jnp.float32(1.0 / qp.scale)) + qp.zero_point, qp.qmin, qp.qmax)
        return ((q - qp.zero_point) * jnp.float32(qp.scale)).astype(x.dtype)
    return apply


def _pt2e_rows(t: torch.Tensor, qp):
    """(int8 [out, in], f32 [out]) of a PT2E weight [out, in] with per-row (axis 0) or per-tensor scales: the
    observer's scales themselves (None when they are not per row, nor symmetric)."""
    if qp.axis not in (None, 0) or any(z != 0 for z in (qp.zero_point if qp.axis is not None else (qp.zero_point,))):
        return None
    scales = torch.tensor(qp.scale if qp.axis is not None else [qp.scale] * t.shape[0], dtype=torch.float64)
    if scales.numel() != t.shape[0]:
        return None
    q = torch.clamp(torch.round(t.double() / scales[:, None]), -127, 127).to(torch.int8)
    return q, scales.float()


def plan_int8(prog, signature_names, config: WeightOnlyInt8, *, pt2e_only: bool = False) -> Int8Plan:
    """Choose and quantize the weights (see module doc), looking at every listed signature. A PT2E-quantized
    weight (``pt2e_weights``) keeps the observer's scales, whatever its size; ``pt2e_only``: only those."""
    from .pallas.int8_matmul import quantize_int8_per_channel

    pt2e = pt2e_weights(prog, signature_names)
    orientation: dict[str, set] = {}
    refused: set = set()
    for name in signature_names:
        sig = prog.signature(name)
        for w in sig.weight_nodes():
            wname = w.meta["weight_name"]
            t = prog.weights[wname]
            big = t.numel() >= config.min_elements if wname not in pt2e else True
            uses = _uses(w) if t.is_floating_point() and t.dim() == 2 and big else None
            if not uses or (pt2e_only and wname not in pt2e):
                refused.add(wname)
                continue
            orientation.setdefault(wname, set()).update(o for o, _ in uses)
    chosen = {}
    for wname, kinds in orientation.items():
        if wname in refused or len(kinds) != 1:
            continue
        t = prog.weights[wname].detach().float()
        given = _pt2e_rows(t, pt2e[wname]) if wname in pt2e and kinds == {"rows"} else None
        if given is not None:
            chosen[wname] = given
            continue
        if wname in pt2e and pt2e_only:
            continue  # stays float: its values are on the int8 grid already
        q, s = quantize_int8_per_channel(t if kinds == {"rows"} else t.T.contiguous())
        chosen[wname] = (torch.from_numpy(q), torch.from_numpy(s))
    return Int8Plan(chosen, config)


def _int8_matmul(ctx, x, qw: QInt8, bias=None, *, beta=1, alpha=1):
    from .lowering.helpers import cast
    from .pallas import PallasConfig, int8_linear

    cfg = ctx.options.pallas or PallasConfig(mode=False)
    dt = ctx.out_dtype
    y = int8_linear(cast(x, dt), qw.values, qw.scale, config=cfg)
    if alpha != 1:
        y = y * alpha
    if bias is not None and beta != 0:
        b = cast(bias, dt)
        y = y + (b if beta == 1 else b * beta)
    return y


# aten::linear(Tensor input, Tensor weight, Tensor? bias=None) -> Tensor   (weight: QInt8)
def _linear(ctx, x, qw, bias=None):
    from .lowering.helpers import cast
    from .pallas import PallasConfig, int8_linear

    cfg = ctx.options.pallas or PallasConfig(mode=False)
    dt = ctx.out_dtype
    return int8_linear(cast(x, dt), qw.values, qw.scale, None if bias is None else cast(bias, dt), config=cfg)


# aten::mm(Tensor self, Tensor mat2) -> Tensor;  aten::matmul(Tensor self, Tensor other) -> Tensor
# (mat2 / other: QInt8, read as [in, out]; self [..., in])
def _mm(ctx, x, qw):
    return _int8_matmul(ctx, x, qw)


# aten::addmm(Tensor self, Tensor mat1, Tensor mat2, *, Scalar beta=1, Scalar alpha=1) -> Tensor
def _addmm(ctx, bias, x, qw, beta=1, alpha=1):
    return _int8_matmul(ctx, x, qw, bias, beta=beta, alpha=alpha)


# aten::embedding(Tensor weight, Tensor indices, SymInt padding_idx=-1, bool scale_grad_by_freq=False,
#     bool sparse=False) -> Tensor   (weight: QInt8; scales are per row, so a row dequantizes alone)
def _embedding(ctx, qw, ids, *_):
    import jax.numpy as jnp

    rows = jnp.take(qw.values, ids, axis=0, mode="clip").astype(jnp.float32)
    scale = jnp.take(qw.scale, ids, axis=0, mode="clip")
    return (rows * scale[..., None]).astype(ctx.out_dtype)


_REWRITTEN = {aten.linear.default: _linear, aten.mm.default: _mm, aten.matmul.default: _mm, aten.addmm.default: _addmm,
              aten.embedding.default: _embedding}


def int8_rewrite(prog, signature_name, plan: Int8Plan):
    """The GraphRewrite of one signature for ``plan``: packed weights and rewritten users."""
    from tpu_export.converter.registry import bind_args

    from .lowering.interpreter import GraphRewrite, PackedWeight

    rewrite = GraphRewrite()
    sig = prog.signature(signature_name)
    for w in sig.weight_nodes():
        wname = w.meta["weight_name"]
        if wname not in plan.weights:
            continue
        q, s = plan.weights[wname]
        qname, sname = plan.part_names(wname)
        if qname in prog.weights or sname in prog.weights:
            raise ValueError(f"cannot quantize {wname!r}: the program already has a weight named {qname!r}")
        rewrite.packed_weights[wname] = PackedWeight([(qname, q), (sname, s)], QInt8)
        for _, node in _uses(w):
            args = bind_args(node)
            rewrite.lowerings[node] = (_REWRITTEN[node.target], args)  # _uses admits only these ops
    return rewrite
