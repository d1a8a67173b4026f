"""convert(), signature() and Converter: capture once with converter/, lower with edge/."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping

if TYPE_CHECKING:
    import onnx
    import torch

    from tpu_export.edge.quantize import QuantConfig

    from ._model import Model

__all__ = ["convert", "signature", "Converter"]


class Converter:
    """Collects signatures (name, module, sample inputs) and converts them into one Model.

    ``litert_torch.signature(...)`` starts one. The signatures share weights: a parameter common to several
    modules (an encoder and a decoder holding the same embedding) is stored once.

    Examples:
        >>> import torch
        >>> from tpu_export import litert_torch
        >>> encode, decode = torch.nn.Linear(4, 8).eval(), torch.nn.Linear(8, 4).eval()
        >>> model = (litert_torch.signature("encode", encode, (torch.ones(1, 4),))
        ...          .signature("decode", decode, (torch.ones(1, 8),))
        ...          .convert())
        >>> model.signature_names()
        ['encode', 'decode']
        >>> model(torch.ones(1, 4), signature_name="encode").shape
        torch.Size([1, 8])
    """

    def __init__(self) -> None:
        self._requests: list = []

    def signature(self, name: str,
                  module: torch.nn.Module | torch.export.ExportedProgram | str | os.PathLike[str] | onnx.ModelProto,
                  sample_args: tuple[Any, ...] | None = None, sample_kwargs: dict[str, Any] | None = None, *,
                  dynamic_shapes: Any = None, dim_sizes: dict[str, int] | None = None) -> Converter:
        """Add a signature: a named entry point of the converted model.

        Args:
            name: The signature's name (``model(..., signature_name=name)`` runs it).
            module: An ``nn.Module`` (called as ``module(*sample_args, **sample_kwargs)``), a
                ``torch.export.ExportedProgram``, the path of a ``.pt2`` file saved by ``torch.export.save``, or an
                ONNX model (an ``.onnx`` path or an ``onnx.ModelProto``: sample inputs optional, shapes come from the
                graph).
            sample_args: Example positional inputs: a tuple, or a single tensor.
            sample_kwargs: Example keyword inputs.
            dynamic_shapes: ``torch.export``'s dynamic-shape spec (a ``torch.export.Dim`` per dynamic dim).
            dim_sizes: For an ONNX model: sizes for its named dims (``{"batch": 1}``); the others stay dynamic.

        Returns:
            This Converter, to chain ``.signature(...)`` calls and end with ``.convert()``.

        Raises:
            ValueError: A signature of that name was already added.
            TypeError: ``dim_sizes`` is given for a model that is not ONNX.
        """
        from tpu_export.converter import SignatureRequest
        from tpu_export.converter.onnx import is_onnx

        if any(r.name == name for r in self._requests):
            raise ValueError(f"signature {name!r} was already added")
        if is_onnx(module):
            from tpu_export.converter.onnx import capture_inputs

            module, sample_args, dynamic_shapes = capture_inputs(module, sample_args, dynamic_shapes, dim_sizes)
        elif dim_sizes is not None:
            raise TypeError("dim_sizes is for ONNX models (an .onnx path or a ModelProto)")
        args = () if sample_args is None else sample_args
        self._requests.append(SignatureRequest(name, module, args, sample_kwargs, dynamic_shapes))
        return self

    def experimental_add_compilation_backend(self, target: Any = None, **kwargs: Any) -> Converter:
        """litert-torch 0.10's ahead-of-time NPU compilation: not done here.

        Args:
            target: An ``ai_edge_litert.aot`` vendor target.
            **kwargs: The vendor compiler's options.

        Returns:
            Never returns.

        Raises:
            NotImplementedError: Always; the message names the alternative.
        """
        from ._options import experimental_add_compilation_backend

        return experimental_add_compilation_backend(target, **kwargs)

    def convert(self,
                module: torch.nn.Module | torch.export.ExportedProgram | str | os.PathLike[str] | onnx.ModelProto
                | None = None,
                sample_args: tuple[Any, ...] | None = None, sample_kwargs: dict[str, Any] | None = None, *,
                strict_export: bool | str = "auto",
                quant_config: str | QuantConfig | list[dict] | None = None,
                calibration_data: Iterable[tuple[Any, ...]] | None = None, dynamic_shapes: Any = None,
                enable_x64: bool = False, output_file_path: str | os.PathLike[str] | None = None,
                lightweight_conversion: bool = False, delete_in_memory_params: bool = False,
                weights_loader: Callable[[str], torch.Tensor] | Mapping[str, torch.Tensor] | None = None,
                progress: Callable[[str], None] | None = None, dim_sizes: dict[str, int] | None = None,
                enable_debug: bool = False, debug_dir: str | os.PathLike[str] | None = None,
                _litert_converter_flags: dict[str, Any] | None = None, **litert_torch_options: Any) -> Model:
        """Convert the signatures added so far (and ``module``, if given) into one LiteRT Model.

        Args:
            module: Optional: one more module, added as the signature ``"serving_default"`` (what
                ``litert_torch.convert(module, ...)`` does).
            sample_args: Example positional inputs: a tuple, or a single tensor.
            sample_kwargs: Example keyword inputs.
            strict_export: ``torch.export`` tracing: ``"auto"`` (non-strict first, then strict), ``True`` or ``False``.
            quant_config: Quantize the model: a scheme name (``"dynamic_int8"``, ``"weight_only_int8"``,
                ``"weight_only_int4"``, ``"dynamic_int4_block32"``, ``"fp16"``, ``"static_int8"``), a ``QuantConfig``
                (e.g. ``QuantConfig("static_int8", io_dtype="int8")``) or an ai-edge-quantizer recipe (a list of
                dicts), or ``litert_torch.quantize.quant_config.QuantConfig(pt2e_quantizer=...)`` for a module
                quantized with PT2E (``convert_pt2e``'s output; its ranges become int8 kernels). None: float32.
            calibration_data: For static int8 only: an iterable of sample-argument tuples the activation ranges are
                measured on.
            dynamic_shapes: ``torch.export``'s dynamic-shape spec (a ``torch.export.Dim`` per dynamic dim).
            enable_x64: Keep 64-bit dtypes 64-bit (by default int64 and float64 compute as 32-bit).
            output_file_path: Write the ``.tflite`` there, streaming the weights into the file (no whole-model bytes
                in memory), and return a Model that memory-maps it. Past 2 GiB the file is in the large-model form
                (weights after the flatbuffer).
            lightweight_conversion: The same streaming write into a temporary file when no path is given (deleted
                with the Model).
            delete_in_memory_params: Free each parameter's storage once its bytes are in the file (the module is
                unusable afterwards).
            weights_loader: For a module built on the meta device: a callable ``name -> tensor`` or a dict giving the
                parameter values by ``named_parameters()`` name, loaded one at a time into a file-backed map
                (``converter.safetensors_weights.safetensors_loader(folder)`` reads a model directory's shards).
            progress: Called with a line per long step (weights written: tensors, MiB, MiB/s).
            dim_sizes: For an ONNX model: sizes for its named dims (``{"batch": 1}``); the others stay dynamic.
            enable_debug: Write the captured graphs, each stage's program and the ``.tflite`` to ``debug_dir``.
            debug_dir: The folder for ``enable_debug`` (giving it turns ``enable_debug`` on).
            _litert_converter_flags: litert-torch's converter flags: the keys applied are
                ``enable_composite_direct_lowering``, ``enable_debug``, ``debug_dir``, ``model_origin_framework``;
                any other key is refused by name (NotImplementedError).
            **litert_torch_options: litert-torch 0.10's other arguments (``use_v2``, ``export_dir``,
                ``runtime_constant_folding``, ...): their defaults are accepted, other values refused by name
                (NotImplementedError, with the alternative).

        Returns:
            The converted Model (on the file, with ``output_file_path``).

        Raises:
            tpu_export.converter.ExportFailedError: ``module`` is not something this converts, or ``torch.export``
                failed on it (the message explains the cause and the fix).
            tpu_export.converter.UnsupportedOpsError: The model uses ops the LiteRT backend does not lower (all of them
                are listed, with their source lines, before anything is written).
            tpu_export.litert_torch.QuantizationError: ``quant_config`` names no scheme, or the calibration data do
                not fit the model (a ValueError).
            ValueError: ``calibration_data`` is given without static int8 quantization, or nothing was added to
                convert.
            TypeError: ``dim_sizes`` is given for a model that is not ONNX.
            MemoryError: The conversion would need more memory than the machine has available (nothing was
                started; the message says which of the large-model options to use).
            NotImplementedError: A litert-torch 0.10 argument or converter flag asks for what this converter does
                not do (the message names it and the alternative); an unknown keyword is a TypeError.
        """
        from tpu_export.converter.gc_pause import gc_paused
        from tpu_export.edge.quantize import as_quant_config, calibration_feeds, check_pt2e, quantize_tflite

        from ._large import check_memory, materialized, streams_quantization, write_or_bytes
        from ._options import ConvertOptions

        quant = as_quant_config(quant_config)  # an unknown scheme fails before capture
        opts = ConvertOptions.parse(enable_debug=enable_debug, debug_dir=debug_dir, progress=progress,
                                    litert_converter_flags=_litert_converter_flags, extra=litert_torch_options)
        progress = opts.progress
        if calibration_data is not None and (quant is None or not quant.needs_calibration):
            raise ValueError(f"calibration_data is only used by static int8 quantization; quant_config is "
                             f"{quant_config!r}")
        if module is not None:
            self.signature("serving_default", module, sample_args, sample_kwargs, dynamic_shapes=dynamic_shapes,
                           dim_sizes=dim_sizes)
        if not self._requests:
            raise ValueError("nothing to convert: pass a module, or add signatures with .signature(...)")
        modules = [r.module for r in self._requests]
        to_file = output_file_path is not None or lightweight_conversion
        streamed = streams_quantization(quant, modules, to_file)
        if streamed:
            quant = None  # applied tensor by tensor as the weights are written
        check_memory(modules, to_file=to_file and quant is None, loader=weights_loader)
        with materialized(modules, weights_loader, output_file_path, progress), gc_paused():
            prog = opts.prepare(self._requests, strict=strict_export, enable_x64=enable_x64)
            check_pt2e(quant_config, prog)  # PT2E: the quantize/dequantize pairs are in the graph
            # calibration samples are checked against the signatures before lowering
            feeds = calibration_feeds(prog, calibration_data) if quant is not None and quant.needs_calibration else None
            result = write_or_bytes(prog, modules, output_file_path=None if quant is not None else output_file_path,
                                    lightweight=lightweight_conversion and quant is None,
                                    delete_params=delete_in_memory_params, progress=progress,
                                    stream_quant=streamed)
        if quant is not None:
            result = quantize_tflite(result.tflite_model() if not isinstance(result, bytes) else result, quant, feeds)
            if output_file_path is not None:
                from ._model import Model

                Model(result).export(output_file_path)
                return opts.finish(Model(output_file_path))
        if isinstance(result, bytes):
            from ._model import Model

            return opts.finish(Model(result))
        return opts.finish(result)


def convert(module: torch.nn.Module | torch.export.ExportedProgram | str | os.PathLike[str] | onnx.ModelProto,
            sample_args: tuple[Any, ...] | None = None, sample_kwargs: dict[str, Any] | None = None, *,
            strict_export: bool | str = "auto",
            quant_config: str | QuantConfig | list[dict] | None = None,
            calibration_data: Iterable[tuple[Any, ...]] | None = None, dynamic_shapes: Any = None,
            enable_x64: bool = False, output_file_path: str | os.PathLike[str] | None = None,
            lightweight_conversion: bool = False, delete_in_memory_params: bool = False,
            weights_loader: Callable[[str], torch.Tensor] | Mapping[str, torch.Tensor] | None = None,
            progress: Callable[[str], None] | None = None, dim_sizes: dict[str, int] | None = None,
            enable_debug: bool = False, debug_dir: str | os.PathLike[str] | None = None,
            _litert_converter_flags: dict[str, Any] | None = None, **litert_torch_options: Any) -> Model:
    """Convert a PyTorch module to a LiteRT Model (a ``.tflite``), as litert-torch's ``convert`` does.

    The module is captured with ``torch.export`` and lowered to LiteRT builtin ops (no TensorFlow). The Model
    runs on the LiteRT interpreter with the module's calling convention and writes the ``.tflite`` with
    ``model.export(path)``. Large models: ``output_file_path``, ``lightweight_conversion``,
    ``delete_in_memory_params`` and ``weights_loader`` keep the weights out of memory (litert-torch 0.10's names
    and meanings). With ``quant_config`` ``"dynamic_int8"``, ``"weight_only_int8"`` or
    ``"dynamic_int4_block32"``, a file output and more than 1 GiB of weights, the weights are quantized as they
    are written, without a float copy of the model in memory.

    Args:
        module: An ``nn.Module`` (called as ``module(*sample_args, **sample_kwargs)``), a
            ``torch.export.ExportedProgram``, the path of a ``.pt2`` file saved by ``torch.export.save``, or an
            ONNX model (an ``.onnx`` path or an ``onnx.ModelProto``: sample inputs optional, shapes come from the
            graph).
        sample_args: Example positional inputs: a tuple, or a single tensor.
        sample_kwargs: Example keyword inputs.
        strict_export: ``torch.export`` tracing: ``"auto"`` (non-strict first, then strict), ``True`` or ``False``.
        quant_config: Quantize the model: a scheme name (``"dynamic_int8"``, ``"weight_only_int8"``,
            ``"weight_only_int4"``, ``"dynamic_int4_block32"``, ``"fp16"``, ``"static_int8"``), a ``QuantConfig``
            (e.g. ``QuantConfig("static_int8", io_dtype="int8")``) or an ai-edge-quantizer recipe (a list of
            dicts), or ``litert_torch.quantize.quant_config.QuantConfig(pt2e_quantizer=...)`` for a module
            quantized with PT2E (``convert_pt2e``'s output; its ranges become int8 kernels). None: float32.
        calibration_data: For static int8 only: an iterable of sample-argument tuples the activation ranges are
            measured on.
        dynamic_shapes: ``torch.export``'s dynamic-shape spec (a ``torch.export.Dim`` per dynamic dim).
        enable_x64: Keep 64-bit dtypes 64-bit (by default int64 and float64 compute as 32-bit).
        output_file_path: Write the ``.tflite`` there, streaming the weights into the file (no whole-model bytes
            in memory), and return a Model that memory-maps it. Past 2 GiB the file is in the large-model form
            (weights after the flatbuffer).
        lightweight_conversion: The same streaming write into a temporary file when no path is given (deleted
            with the Model).
        delete_in_memory_params: Free each parameter's storage once its bytes are in the file (the module is
            unusable afterwards).
        weights_loader: For a module built on the meta device: a callable ``name -> tensor`` or a dict giving the
            parameter values by ``named_parameters()`` name, loaded one at a time into a file-backed map
            (``converter.safetensors_weights.safetensors_loader(folder)`` reads a model directory's shards).
        progress: Called with a line per long step (weights written: tensors, MiB, MiB/s).
        dim_sizes: For an ONNX model: sizes for its named dims (``{"batch": 1}``); the others stay dynamic.
        enable_debug: Write the captured graphs, each stage's program and the ``.tflite`` to ``debug_dir``.
        debug_dir: The folder for ``enable_debug`` (giving it turns ``enable_debug`` on).
        _litert_converter_flags: litert-torch's converter flags: the keys applied are
            ``enable_composite_direct_lowering``, ``enable_debug``, ``debug_dir``, ``model_origin_framework``;
            any other key is refused by name (NotImplementedError).
        **litert_torch_options: litert-torch 0.10's other arguments (``use_v2``, ``export_dir``,
            ``runtime_constant_folding``, ...): their defaults are accepted, other values refused by name
            (NotImplementedError, with the alternative).

    Returns:
        The converted Model: ``model(*sample_args)`` runs it, ``model.export(path)`` writes the ``.tflite``.

    Raises:
        tpu_export.converter.ExportFailedError: ``module`` is not something this converts, or ``torch.export``
            failed on it (the message explains the cause and the fix).
        tpu_export.converter.UnsupportedOpsError: The model uses ops the LiteRT backend does not lower (all of them
            are listed, with their source lines, before anything is written).
        tpu_export.litert_torch.QuantizationError: ``quant_config`` names no scheme, or the calibration data do
            not fit the model (a ValueError).
        ValueError: ``calibration_data`` is given without static int8 quantization.
        TypeError: ``dim_sizes`` is given for a model that is not ONNX.
        MemoryError: The conversion would need more memory than the machine has available (nothing was
            started; the message says which of the large-model options to use).
        NotImplementedError: A litert-torch 0.10 argument or converter flag asks for what this converter does not
            do (the message names it and the alternative); an unknown keyword is a TypeError.

    Examples:
        >>> import os, tempfile
        >>> import torch
        >>> from tpu_export import litert_torch
        >>> m = torch.nn.Sequential(torch.nn.Linear(4, 2), torch.nn.ReLU()).eval()
        >>> x = torch.ones(1, 4)
        >>> model = litert_torch.convert(m, (x,))
        >>> torch.allclose(model(x), m(x), atol=1e-6)
        True
        >>> model.export(os.path.join(tempfile.mkdtemp(), "m.tflite"))
        >>> small = litert_torch.convert(m, (x,), quant_config="dynamic_int8")      # int8 weights

        A dynamic batch:

        >>> batch = torch.export.Dim("batch", min=1, max=8)
        >>> model = litert_torch.convert(m, (torch.ones(2, 4),), dynamic_shapes=({0: batch},))
        >>> model(torch.ones(5, 4)).shape
        torch.Size([5, 2])
    """
    return Converter().convert(module, sample_args, sample_kwargs, strict_export=strict_export,
                               quant_config=quant_config, calibration_data=calibration_data,
                               dynamic_shapes=dynamic_shapes, enable_x64=enable_x64,
                               output_file_path=output_file_path, lightweight_conversion=lightweight_conversion,
                               delete_in_memory_params=delete_in_memory_params, weights_loader=weights_loader,
                               progress=progress, dim_sizes=dim_sizes, enable_debug=enable_debug,
                               debug_dir=debug_dir, _litert_converter_flags=_litert_converter_flags,
                               **litert_torch_options)


def signature(name: str,
              module: torch.nn.Module | torch.export.ExportedProgram | str | os.PathLike[str] | onnx.ModelProto,
              sample_args: tuple[Any, ...] | None = None, sample_kwargs: dict[str, Any] | None = None, *,
              dynamic_shapes: Any = None, dim_sizes: dict[str, int] | None = None) -> Converter:
    """Start a multi-signature conversion: ``signature(...).signature(...).convert()``.

    Each signature is a named entry point of one Model; the modules' shared parameters are stored once.

    Args:
        name: The signature's name (``model(..., signature_name=name)`` runs it).
        module: An ``nn.Module`` (called as ``module(*sample_args, **sample_kwargs)``), a
            ``torch.export.ExportedProgram``, the path of a ``.pt2`` file saved by ``torch.export.save``, or an
            ONNX model (an ``.onnx`` path or an ``onnx.ModelProto``: sample inputs optional, shapes come from the
            graph).
        sample_args: Example positional inputs: a tuple, or a single tensor.
        sample_kwargs: Example keyword inputs.
        dynamic_shapes: ``torch.export``'s dynamic-shape spec (a ``torch.export.Dim`` per dynamic dim).
        dim_sizes: For an ONNX model: sizes for its named dims (``{"batch": 1}``); the others stay dynamic.

    Returns:
        A Converter holding this signature; add more with ``.signature(...)``, then call ``.convert()``.

    Raises:
        TypeError: ``dim_sizes`` is given for a model that is not ONNX.

    Examples:
        >>> import torch
        >>> from tpu_export import litert_torch
        >>> m = torch.nn.Linear(4, 2).eval()
        >>> model = (litert_torch.signature("one", m, (torch.ones(1, 4),))
        ...          .signature("eight", m, (torch.ones(8, 4),))
        ...          .convert())
        >>> model(torch.ones(8, 4), signature_name="eight").shape
        torch.Size([8, 2])
    """
    return Converter().signature(name, module, sample_args, sample_kwargs, dynamic_shapes=dynamic_shapes,
                                 dim_sizes=dim_sizes)
