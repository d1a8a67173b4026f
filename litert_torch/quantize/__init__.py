"""litert_torch.quantize: PT2E quantization, in litert-torch 0.10's module layout.

    from litert_torch.quantize.pt2e_quantizer import PT2EQuantizer, get_symmetric_quantization_config
    from litert_torch.quantize.quant_config import QuantConfig
    from torchao.quantization.pt2e.quantize_pt2e import prepare_pt2e, convert_pt2e

    quantizer = PT2EQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True))
    m = prepare_pt2e(torch.export.export(model.eval(), args).module(), quantizer)
    m(*calibration_args)
    m = convert_pt2e(m, fold_quantize=False)
    edge_model = litert_torch.convert(m, args, quant_config=QuantConfig(pt2e_quantizer=quantizer))

The public names are this package's ``__all__`` and its modules ``pt2e_quantizer`` and ``quant_config``
(litert-torch's import paths); its other submodules are internal and may change between releases.
"""

from __future__ import annotations

from tpu_export.converter.lazy_exports import lazy_getattr

__all__ = ["PT2EQuantizer", "QuantizationConfig", "get_symmetric_quantization_config", "QuantConfig"]

_WHERE = {"PT2EQuantizer": "pt2e_quantizer", "QuantizationConfig": "pt2e_quantizer",
          "get_symmetric_quantization_config": "pt2e_quantizer", "QuantConfig": "quant_config"}


__getattr__ = lazy_getattr(__name__, _WHERE)
