"""Program -> jax.export per signature, weights passed as arguments (never baked in).

Each signature becomes ``jax.export.export(jax.jit(fn, ...), platforms=...)`` of the lowered
function ``fn(weights: list, *inputs) -> list``. Dynamic dims become symbolic shapes, one
``SymbolicScope`` per signature (so inputs that share a dim name share the symbol), with
the Program's dim ranges as constraints. With a mesh, shardings are exported against an
``AbstractMesh``: the export needs no devices, and the artifact runs on any mesh of that shape.
"""

from __future__ import annotations

import dataclasses
import os
import re
import time
from typing import Any

import numpy as np
import torch

from .artifact import structure
from .artifact.dtypes import name_to_numpy, torch_to_name
from .artifact.format import PLATFORMS
from .artifact.specs import ArtifactTensorSpec
from .host import x64_scope
from .sharding import MeshSpec, PartitionRules, named_sharding

__all__ = ["ExportedSignature", "ExportedBundle", "ExportError", "export_program", "export_lowered", "PLATFORMS",
           "state_inputs", "donated_inputs"]

_INT32_MAX = 2**31 - 1


class ExportError(ValueError):
    """The program could not be exported as asked (platforms, dtypes, dynamic dims)."""


@dataclasses.dataclass
class ExportedSignature:
    name: str
    exported: Any  # jax.export.Exported
    weight_names: list[str]
    inputs: list[ArtifactTensorSpec]
    outputs: list[ArtifactTensorSpec]
    input_structure: dict  # artifact.structure of (args, kwargs)
    output_structure: dict
    dim_ranges: dict[str, list[int]]
    export_seconds: float = 0.0

    def serialize(self) -> bytes:
        return bytes(self.exported.serialize())


@dataclasses.dataclass
class ExportedBundle:
    """Everything an artifact holds, in memory. ``save`` writes it; ``compile_for`` adds TPU
    executables; calling it runs it here like the loaded artifact would."""

    signatures: dict[str, ExportedSignature]
    weights: dict[str, torch.Tensor]  # as stored (dtype cast applied)
    platforms: tuple[str, ...]
    # the program's fingerprint (a str), or what computes it (called once, on the first read of .fingerprint):
    # it hashes every weight, which pages in a model mmapped from safetensors, so it waits for the save, after
    # the AOT compile (compile_worker's child then compiles before the weights come in)
    program_fingerprint: Any = dataclasses.field(repr=False)
    dtype: str | None = None
    mesh: MeshSpec | None = None
    rules: PartitionRules | None = None
    weight_shardings: dict[str, list] = dataclasses.field(default_factory=dict)
    enable_x64: bool = False
    compiled: list = dataclasses.field(default_factory=list)  # aot.CompiledTarget
    quant: str | None = None  # "weight_only_int8" when linear weights are stored as int8 + scales
    quant_parts: dict = dataclasses.field(default_factory=dict)  # weight name -> (int8 name, scale name)
    # the runtime program a call runs, made on the first call (weights go to the device once)
    _program: Any = dataclasses.field(default=None, init=False, repr=False, compare=False)

    @property
    def fingerprint(self) -> str:
        if callable(self.program_fingerprint):
            self.program_fingerprint = self.program_fingerprint()
        return self.program_fingerprint

    @property
    def quantized_weights(self) -> list[str]:
        """Program weight names stored as int8 + scales."""
        return sorted(self.quant_parts)

    def save(self, path: str | os.PathLike[str], **kw: Any) -> str:
        """Write this bundle as a TPU artifact at ``path``; ``tpu_export.tpu_backend.save(self, path, **kw)``.

        Args:
            path: the artifact to write: a ``.tpuexp`` directory, or one uncompressed file where ``path`` ends
                in ``.zip``.
            **kw: the keyword arguments of ``tpu_backend.save``.

        Returns:
            The path written.
        """
        from .artifact import save

        return save(self, path, **kw)

    def compile_for(self, target: str, topology: str | None = None, **kw: Any) -> Any:
        """AOT-compile every signature for one TPU slice; ``tpu_export.tpu_backend.compile_for(self, ...)``.

        Args:
            target: a TPU target, e.g. ``"tpu-v6e"``.
            topology: the slice, e.g. ``"2x2"``; None takes the target's default.
            **kw: the keyword arguments of ``tpu_backend.compile_for`` (``cache_dir``, ...).

        Returns:
            The compiled target ``tpu_backend.compile_for`` returns (also kept on the bundle, and saved with it).
        """
        from .aot import compile_for

        return compile_for(self, target, topology, **kw)

    def to_program(self):
        """The runtime program (weights on the device) without a round trip through disk."""
        from .runtime import TpuProgram

        return TpuProgram.from_bundle(self)

    def __call__(self, *args, signature_name: str | None = None, **kwargs):
        if self._program is None:
            self._program = self.to_program()
        return self._program(*args, signature_name=signature_name, **kwargs)


def export_program(prog, *, platforms=("tpu", "cpu"), dtype=None, use_pallas=False, mesh=None,
                   partition_rules=None, signatures=None, generation=None, quant=None,
                   precision="highest") -> ExportedBundle:
    """Lower every signature of ``prog`` (or the named ``signatures``) and export it.

    use_pallas: True / False / "auto" / a PallasConfig: Pallas kernels for attention, norms and
        int8 linears on TPU (plain XLA on the other platforms of the same artifact);
    generation: "v5e" | "v6e" | "v5p" | "tpu7x" | None: the TPU the kernels' blocks are sized for;
    quant: None | "weight_only_int8" (alias "int8") | tpu_backend.quant.WeightOnlyInt8: linear and
        embedding weights stored as int8 + per-channel scales (see tpu_backend.quant);
    precision: "highest" (default: float32-exact, six bf16 MXU passes per float32 matmul/conv on TPU),
        "high" (three passes) or "default" (one, as jax.jit's default): a float32 program's TPU numerics,
        and its TPU compile time (docs/tpu.md); CPU and GPU compute float32 whatever is asked.

    2-d convolution kernels are stored HWIO as ``<name>.hwio`` and, in an export without the tpu platform, linear
    weights [in, out] as ``<name>.io``, where nothing else reads them (tpu_backend.weight_layout).
    """
    from .host import prepare_cpu_host
    from .lowering import lower_signature

    prepare_cpu_host()  # lowering starts jax's backends, libtpu's among them: quiet on a TPU-less host
    platforms = _check_platforms(platforms)
    names = list(signatures) if signatures is not None else list(prog.signatures)
    rewrites = {n: () for n in names}
    qconfig = None
    from .quant import pt2e_weights

    if quant is not None or pt2e_weights(prog, names):  # a PT2E model's linear weights are int8 + its scales
        from .quant import int8_rewrite, parse_quant, plan_int8

        qconfig = parse_quant(quant or "weight_only_int8")
        plan = plan_int8(prog, names, qconfig, pt2e_only=quant is None)
        rewrites = {n: (int8_rewrite(prog, n, plan),) for n in names}
    from .weight_layout import layout_rewrite, plan_layouts

    # convolution kernels stored as the TPU's convolution reads them; linear weights [in, out] off the TPU
    layouts = plan_layouts(prog, names, skip=plan.weights if qconfig is not None else (), platforms=platforms)
    if layouts:
        rewrites = {n: (*rewrites[n], layout_rewrite(prog, n, layouts)) for n in names}
    if use_pallas is not False:
        from .pallas import hooks  # noqa: F401  (registers the kernel hooks before lowering)
    lowered = {
        n: lower_signature(prog, n, dtype=dtype, platforms=platforms, use_pallas=use_pallas, generation=generation,
                           rewrites=rewrites[n], precision=precision)
        for n in names
    }
    bundle = export_lowered(prog, lowered, platforms=platforms, dtype=dtype, mesh=mesh,
                            partition_rules=partition_rules)
    if qconfig is not None:
        bundle.quant = "weight_only_int8"
        bundle.quant_parts = {n: plan.part_names(n) for n in plan.weights}
    return bundle


def export_lowered(prog, lowered: dict, *, platforms=("tpu", "cpu"), dtype=None, mesh=None,
                   partition_rules=None) -> ExportedBundle:
    """Export already-lowered signatures: ``lowered`` maps signature name -> an object with
    ``fn(weights: list, *inputs) -> list`` and ``weight_names``."""
    from .host import prepare_cpu_host

    prepare_cpu_host()
    platforms = _check_platforms(platforms)
    mesh_spec = MeshSpec.of(mesh) if mesh is not None else None
    rules = PartitionRules.of(partition_rules) if mesh_spec is not None else None
    if partition_rules is not None and mesh_spec is None:
        raise ExportError("partition_rules need a mesh; pass mesh={'data': 2, 'model': 2} or similar")

    weights: dict[str, torch.Tensor] = {}
    sources: dict[str, tuple] = {}  # stored name -> (program weight name, perm)
    for lo in lowered.values():
        sources.update(getattr(lo, "weight_sources", None) or {})
        dts = getattr(lo, "weight_dtypes", None) or [None] * len(lo.weight_names)
        values = getattr(lo, "weight_values", None) or {}  # packed parts (int8 + scales) are not program weights
        for w, dt in zip(lo.weight_names, dts):
            if w not in weights:
                weights[w] = _stored_weight(values[w] if w in values else prog.weights[w], dt, dtype)
    weight_shardings = {}
    if mesh_spec is not None:
        weight_shardings = {w: _weight_spec(rules, w, tuple(t.shape), sources.get(w), mesh_spec)
                            for w, t in weights.items()}

    sigs = {}
    with x64_scope(prog.enable_x64):
        for name, lo in lowered.items():
            sigs[name] = _export_signature(prog.signature(name), lo, weights, platforms, mesh_spec, rules,
                                           weight_shardings)
    return ExportedBundle(
        signatures=sigs, weights=weights, platforms=platforms, program_fingerprint=prog.fingerprint,
        dtype=dtype, mesh=mesh_spec, rules=rules, weight_shardings=weight_shardings,
        enable_x64=prog.enable_x64,
    )


def _weight_spec(rules, name, shape, source, mesh) -> list:
    """The partition spec of a stored weight; one stored permuted (``source`` = (name, perm)) takes the rule of
    the program's weight, written against torch's shape, with the spec permuted the same way."""
    if source is None:
        return rules.weight_spec(name, shape, mesh)
    src, perm = source
    spec = rules.weight_spec(src, tuple(shape[perm.index(i)] for i in range(len(perm))), mesh)
    return [spec[i] for i in perm]


def _check_platforms(platforms) -> tuple[str, ...]:
    platforms = (platforms,) if isinstance(platforms, str) else tuple(platforms)
    bad = [p for p in platforms if p not in PLATFORMS]
    if bad or not platforms:
        raise ExportError(f"unknown platform(s) {bad or platforms}; choose from {PLATFORMS}")
    return platforms


def _stored_weight(t: torch.Tensor, lowered_dtype, dtype) -> torch.Tensor:
    """The weight in the dtype the lowered function computes it in (bf16 under
    dtype="bfloat16"), so the artifact stores and ships it at that size."""
    t = t.detach()
    if lowered_dtype is not None:
        want = getattr(torch, str(np.dtype(lowered_dtype)))
    elif dtype is not None and t.is_floating_point():
        want = getattr(torch, dtype)
    else:
        want = t.dtype
    return t.to(want) if t.dtype != want else t


def _export_signature(sig, lo, weights, platforms, mesh, rules, weight_shardings) -> ExportedSignature:
    import jax
    from jax import export

    t0 = time.perf_counter()
    inputs = [_artifact_spec(s) for s in sig.inputs]
    outputs = [_artifact_spec(s) for s in sig.outputs]
    ranges = {k: [int(a), int(b)] for k, (a, b) in sig.dim_ranges.items()}

    rename: dict[str, str] = {}  # dyn dim -> expression with the data-axis factor pulled out
    if mesh is not None:
        inputs = [_place_input(s, mesh, rules, rename) for s in inputs]
        batch_dims = {s.shape[0] for s in inputs if s.sharding and s.sharding[0] is not None}
        outputs = [dataclasses.replace(s, sharding=rules.batch_spec(s.shape, mesh, s.name)
                                       if s.shape and s.shape[0] in batch_dims else [None] * len(s.shape))
                   for s in outputs]

    scope = export.SymbolicScope(_constraints(inputs, ranges, rename))
    in_sds = [jax.ShapeDtypeStruct(_jax_shape(s, rename, scope, sig.name), name_to_numpy(s.dtype))
              for s in inputs]
    if rename:
        inputs = [dataclasses.replace(s, jax_shape=[rename.get(d, d) if isinstance(d, str) else d for d in s.shape])
                  if s.is_dynamic else s for s in inputs]
    w_sds = [jax.ShapeDtypeStruct(tuple(weights[w].shape), name_to_numpy(torch_to_name(weights[w].dtype)))
             for w in lo.weight_names]

    # State (an input and an output of the same name, shape and dtype: an LLM's KV cache) is donated, so the
    # module aliases each such input to an output (tf.aliasing_output) and a runtime that donates the buffer
    # gets it updated in place instead of a second copy. jax pairs donated inputs with same-typed outputs in
    # order; state_inputs lists them in output order, so each is aliased to its own-named output.
    jit_kw: dict = {"keep_unused": True, "donate_argnums": tuple(1 + i for i in state_inputs(inputs, outputs))}
    if mesh is not None:
        am = mesh.abstract()
        jit_kw["in_shardings"] = (
            [named_sharding(am, weight_shardings[w]) for w in lo.weight_names],
            *[named_sharding(am, s.sharding) for s in inputs],
        )
        jit_kw["out_shardings"] = [named_sharding(am, s.sharding) for s in outputs]

    out_dtypes = [name_to_numpy(s.dtype) for s in outputs]

    def entry(weights_list, *xs):
        # Outputs keep the model's dtypes (a bf16 export computes in bf16 and returns float32).
        return [o.astype(dt) if o.dtype != dt else o for o, dt in zip(lo.fn(list(weights_list), *xs), out_dtypes)]

    entry.__name__ = f"sig_{re.sub(r'[^0-9A-Za-z_]', '_', sig.name)}"
    try:
        exp = export.export(jax.jit(entry, **jit_kw), platforms=platforms)(w_sds, *in_sds)
    except Exception as e:  # noqa: BLE001 - surface what jax says with the signature named
        raise ExportError(f"signature {sig.name!r}: jax.export failed for platforms {platforms}: {e}") from e
    if len(exp.out_avals) != len(outputs):
        raise ExportError(f"signature {sig.name!r}: lowering returned {len(exp.out_avals)} outputs, "
                          f"the program has {len(outputs)}")

    in_names = [s.name for s in inputs]
    out_names = [s.name for s in outputs]
    return ExportedSignature(
        name=sig.name, exported=exp, weight_names=list(lo.weight_names), inputs=inputs, outputs=outputs,
        input_structure=structure.from_treespec(sig.in_spec, in_names),
        output_structure=structure.from_treespec(sig.out_spec, out_names),
        dim_ranges=ranges, export_seconds=time.perf_counter() - t0,
    )


def _artifact_spec(s) -> ArtifactTensorSpec:
    """A converter TensorSpec as the artifact records it (the dtype by name)."""
    bound = int(s.index_bound) if s.index_bound is not None else None  # embedding ids: checked like torch
    return ArtifactTensorSpec(s.name, tuple(d if isinstance(d, str) else int(d) for d in s.shape),
                              torch_to_name(s.dtype), bound)


def _place_input(spec, mesh, rules, rename) -> ArtifactTensorSpec:
    """The input's batch dim over the data axis; a dynamic batch dim named in ``rename`` as a
    multiple of that axis's size (jax must see it divides)."""
    sh = rules.batch_spec(spec.shape, mesh, spec.name)
    d0 = spec.shape[0] if spec.shape else None
    if sh and sh[0] and isinstance(d0, str):
        if not re.fullmatch(r"[A-Za-z_]\w*", d0):
            sh[0] = None  # an expression: leave it whole
        else:
            rename[d0] = f"{mesh.axis_size(sh[0])}*{d0}_per_{sh[0]}"
    return dataclasses.replace(spec, sharding=sh)


def _constraints(inputs, ranges, rename) -> list[str]:
    used = {d for s in inputs for d in s.shape if isinstance(d, str)}
    out = []
    for name, (lo, hi) in ranges.items():
        if name not in used:
            continue
        expr = rename.get(name, name)
        if lo > 1:
            out.append(f"{expr} >= {lo}")
        if hi < _INT32_MAX:
            out.append(f"{expr} <= {hi}")
    return out


def _jax_shape(spec, rename, scope, sig_name):
    from jax import export

    if not spec.is_dynamic:
        return spec.shape
    text = ", ".join(rename.get(d, d) if isinstance(d, str) else str(d) for d in spec.shape)
    try:
        return export.symbolic_shape(text, scope=scope)
    except Exception as e:  # noqa: BLE001
        raise ExportError(
            f"signature {sig_name!r}: input {spec.name!r} has dynamic shape {list(spec.shape)} that jax "
            f"cannot express as a symbolic shape ({e}). Fix: give that dim a plain torch.export.Dim."
        ) from e


def state_inputs(inputs, outputs) -> list[int]:
    """Indices of the inputs that are state: an output has the same name, shape and dtype (KV caches)."""
    out = {s.name: (tuple(s.shape), s.dtype) for s in outputs}
    return [i for i, s in enumerate(inputs) if out.get(s.name) == (tuple(s.shape), s.dtype)]


_ALIAS = re.compile(r"tf\.aliasing_output = (\d+)")


def donated_inputs(exported, num_weights: int) -> dict[int, int]:
    """{input index: output index} of the inputs the exported module aliases to an output (donated
    buffers), read from the module itself, so an artifact says what it donates without a manifest field
    (a loader that does not donate runs it the same, with a copy). The module's arguments are an optional
    platform index, then ``num_weights`` weights, then the inputs."""
    text = exported.mlir_module()
    start = text.index("func.func public @main(")
    head = text[start: text.index("\n", start)]  # the signature is one line of the printed module
    args = re.split(r"%arg\d+: ", head)[1:]
    args = args[len(args) - len(exported.in_avals):]  # drop the platform index argument if there is one
    found = {}
    for j, a in enumerate(args[num_weights:]):
        m = _ALIAS.search(a)
        if m:
            found[j] = int(m.group(1))
    return found
