"""litert-torch 0.10's other ``convert`` arguments: the ones implemented, and the others refused by name.

``ConvertOptions.parse`` checks everything before capture starts; ``prepare`` captures the signatures (writing each
stage's program to ``debug_dir`` when asked) and applies the marked composites (litert_torch.hlfb).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable

__all__ = ["ConvertOptions", "CONVERTER_FLAGS", "REFUSED_CONVERTER_FLAGS", "UNSUPPORTED_ARGUMENTS",
           "experimental_add_compilation_backend"]

_DEBUG = "enable_debug=True, debug_dir=... writes the captured graphs and each stage's program"
_V2 = ("litert-torch's TensorFlow-based converter V2 is not part of this package (one converter: torch.export -> "
       "LiteRT builtins); drop the argument")
# litert-torch 0.10 convert() argument -> (the values that ask for nothing here, why anything else is refused)
UNSUPPORTED_ARGUMENTS: dict[str, tuple[tuple, str]] = {
    "runtime_constant_folding": ((None, True), "constants are always folded (by torch, in the converter's shared "
                                               "passes); folding cannot be turned off"),
    "use_v2": ((False,), _V2),
    "export_dir": ((None,), f"no MLIR bytecode intermediates are written; {_DEBUG}"),
    "fold_fp16_resource_casts": ((True, False), "only used by converter V2"),
    "allow_reuse_intermediates": ((False,), f"nothing is cached between conversions; {_DEBUG}"),
    "enable_timing": ((False,), "MLIR pass timing belongs to TensorFlow's converter; progress=print prints each long "
                                "step with its duration"),
    "print_ir_before": ((None,), _DEBUG),
    "print_ir_after": ((None,), _DEBUG),
    "elide_elementsattrs_if_larger": ((None,), f"{_DEBUG} (weights are listed by name and shape, never printed)"),
}

# _litert_converter_flags keys this converter applies
CONVERTER_FLAGS = {
    "enable_composite_direct_lowering": "True (default): a marked composite with a registered lowering becomes "
                                        "one op; False: every composite is lowered op by op",
    "enable_debug": "the same as convert(enable_debug=...)",
    "debug_dir": "the same as convert(debug_dir=...)",
    "model_origin_framework": "'PYTORCH' only (what this converter reads)",
    "fold_fp16_resource_casts": "accepted, no effect: converter V2 only",
}
_TF = "a flag of TensorFlow's LiteRT converter, which this conversion does not run"
# keys of TensorFlow's ConverterFlags users pass, with why they are refused
REFUSED_CONVERTER_FLAGS = {
    "unfold_batchmatmul": "the edge backend chooses BATCH_MATMUL or FULLY_CONNECTED itself",
    "allow_custom_ops": "the only custom op written is the one LiteRT's runtime registers "
                        "(TFLite_Detection_PostProcess, from converter.detection_postprocess); register a lowering "
                        "to builtins for others (docs/custom_ops.md)",
    "enable_select_tf_ops": "no TensorFlow ops are emitted (there is no TensorFlow graph)",
    "force_select_tf_ops": "no TensorFlow ops are emitted (there is no TensorFlow graph)",
    "strict_qdq_mode": "quantization is applied by ai-edge-quantizer after lowering (quant_config=...)",
    "inference_type": "use quant_config=... (dynamic_int8, static_int8, fp16, ...)",
    "debug_options": _DEBUG,
}


def _norm_flag(name: str) -> str:
    name = name[len("_experimental_"):] if name.startswith("_experimental_") else name
    return "unfold_batchmatmul" if name == "unfold_batch_matmul" else name


@dataclasses.dataclass
class ConvertOptions:
    debug_dir: str | None = None
    direct_composites: bool = True
    progress: Callable[[str], None] | None = None

    @classmethod
    def parse(cls, *, enable_debug: bool = False, debug_dir: str | os.PathLike[str] | None = None,
              litert_converter_flags: dict[str, Any] | None = None, progress=None,
              extra: dict[str, Any] | None = None) -> ConvertOptions:
        for name, value in (extra or {}).items():
            if name not in UNSUPPORTED_ARGUMENTS:
                raise TypeError(f"convert() got an unexpected keyword argument {name!r}")
            accepted, why = UNSUPPORTED_ARGUMENTS[name]
            if not any(value is a or (type(value) is type(a) and value == a) for a in accepted):
                raise NotImplementedError(f"convert({name}={value!r}) is not supported: {why}")
        direct = True
        flags = dict(litert_converter_flags or {})
        for key, value in flags.items():
            k = _norm_flag(str(key))
            if k == "enable_composite_direct_lowering":
                direct = bool(value)
            elif k == "enable_debug":
                enable_debug = enable_debug or bool(value)
            elif k == "debug_dir":
                debug_dir = debug_dir or value
            elif k == "model_origin_framework":
                if str(value).upper() != "PYTORCH":
                    raise NotImplementedError(f"_litert_converter_flags[{key!r}]={value!r}: this converter reads "
                                              "PyTorch programs only ('PYTORCH')")
            elif k == "fold_fp16_resource_casts":
                pass
            else:
                why = REFUSED_CONVERTER_FLAGS.get(k, _TF)
                raise NotImplementedError(f"_litert_converter_flags[{key!r}] is not supported: {why}; the keys "
                                          f"applied are {', '.join(CONVERTER_FLAGS)}")
        if enable_debug and not debug_dir:
            raise ValueError("enable_debug=True needs debug_dir=<folder> (where the graphs are written)")
        if debug_dir and not enable_debug:
            enable_debug = True  # litert-torch writes its artifacts whenever a directory is given
        if progress is None:
            from ._config import config

            if config.show_progress:
                progress = print
        return cls(os.fspath(debug_dir) if enable_debug else None, direct, progress)

    # ------------------------------------------------------------------ capture
    def prepare(self, requests, *, strict, enable_x64):
        """prepare_many, with each stage written to ``debug_dir``, then the composites applied."""
        from tpu_export.converter import prepare_many

        from .hlfb import apply_composites

        if self.debug_dir is None:
            prog = prepare_many(requests, strict=strict, enable_x64=enable_x64)
        else:
            prog = self._prepare_debug(requests, strict, enable_x64)
        prog = apply_composites(prog, "edge", direct_lowering=self.direct_composites)
        if self.debug_dir is not None:
            self._write_program(prog, "composites")
        return prog

    def _prepare_debug(self, requests, strict, enable_x64):
        import torch

        from tpu_export.converter.capture import capture, forward_params
        from tpu_export.converter.decompositions import KEEP_WHOLE, decompose
        from tpu_export.converter.passes import SHARED_PASSES, run_shared_passes
        from tpu_export.converter.program import program_from_exported

        os.makedirs(self.debug_dir, exist_ok=True)
        self._stage = 0
        exported = {}
        for r in requests:
            ep = capture(r.module, r.args, r.kwargs, dynamic_shapes=r.dynamic_shapes, strict=strict)
            self._write(f"{r.name}.exported", str(ep.graph_module.print_readable(print_output=False)))
            ep = decompose(ep, KEEP_WHOLE, in_place=isinstance(r.module, torch.nn.Module))
            self._write(f"{r.name}.decomposed", str(ep.graph_module.print_readable(print_output=False)))
            args = r.args if isinstance(r.args, tuple) else (r.args,)
            exported[r.name] = (ep, {"args": args, "kwargs": r.kwargs or {}, "dynamic_shapes": r.dynamic_shapes,
                                     "forward_params": forward_params(r.module)})
        prog = program_from_exported(exported, enable_x64=enable_x64)
        self._write_program(prog, "program")

        def dumped(p):
            def run(prog_):
                p(prog_)
                self._write_program(prog_, p.__name__)

            run.__name__ = p.__name__
            if hasattr(p, "writes"):
                run.writes = p.writes
            return run

        return run_shared_passes(prog, passes=[dumped(p) for p in SHARED_PASSES], keep=KEEP_WHOLE)

    def _write(self, stem: str, text: str) -> None:
        from tpu_export.converter.atomic import write_file

        write_file(os.path.join(self.debug_dir, f"{stem}.txt"), text.encode())

    def _write_program(self, prog, stage: str) -> None:
        self._stage = getattr(self, "_stage", 0) + 1
        parts = []
        for name, sig in prog.signatures.items():
            weights = "\n".join(f"#   {w}: {tuple(prog.weights[w].shape)} {prog.weights[w].dtype}"
                                for w in sig.weight_names if w in prog.weights)
            code = sig.graph.python_code("self").src
            parts.append(f"# signature {name!r}\n# weights:\n{weights}\n{code}")
        self._write(f"{self._stage:02d}_{stage}", "\n\n".join(parts))

    def finish(self, model):
        """Write the converted model beside the stages; returns it."""
        if self.debug_dir is not None:
            model.export(os.path.join(self.debug_dir, "model.tflite"))
        return model


def experimental_add_compilation_backend(target: Any = None, **kwargs: Any):
    """litert-torch 0.10's ahead-of-time NPU compilation: not done here.

    Args:
        target: An ``ai_edge_litert.aot`` vendor target.
        **kwargs: The vendor compiler's options.

    Raises:
        NotImplementedError: Always; the message names the alternative.
    """
    raise NotImplementedError(
        "experimental_add_compilation_backend: ahead-of-time NPU compilation (ai_edge_litert.aot vendor targets) is "
        "not done by this converter; compile the .tflite with ai_edge_litert's AOT tools, or target a TPU with "
        "`tpu-export convert MODEL --target tpu-v6e`")
