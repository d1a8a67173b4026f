"""ai-edge-quantizer moves every buffer of 1 KiB or more after the flatbuffer (Buffer.offset / size), our
``tpu_export.structure`` metadata included when a model has many inputs or outputs (a real-size LLM's 20+ cache
tensors per signature): the quantized file must still load with its pytree structure."""

from __future__ import annotations

import torch

from tests.numerics import rel_err
from tpu_export import litert_torch


class ManyHeads(torch.nn.Module):
    """48 named outputs: the structure metadata (names, pytree spec) passes 1 KiB; 0.5 M body weights: the quantized
    buffers pass 256 KiB, above which ai-edge-quantizer writes the offset form."""

    def __init__(self, n: int = 48):
        super().__init__()
        self.body = torch.nn.Linear(512, 1024)
        self.heads = torch.nn.ModuleList(torch.nn.Linear(1024, 4) for _ in range(n))

    def forward(self, x):
        h = torch.relu(self.body(x))
        return {f"kv_cache_head_output_{i:02d}": head(h) for i, head in enumerate(self.heads)}


def _metadata_offsets(data: bytes) -> list[int]:
    from ai_edge_litert import schema_py_generated as s

    m = s.Model.GetRootAs(data, 0)
    return [m.Buffers(m.Metadata(i).Buffer()).Offset() for i in range(m.MetadataLength())
            if m.Metadata(i).Name() == b"tpu_export.structure"]


def test_quantized_file_with_large_structure_metadata_loads_with_its_structure(tmp_path):
    torch.manual_seed(0)
    m = ManyHeads().eval()
    x = torch.randn(2, 512)
    with torch.no_grad():
        want = m(x)
    path = tmp_path / "many.tflite"
    litert_torch.convert(m, (x,), quant_config="dynamic_int8").export(str(path))
    offsets = _metadata_offsets(path.read_bytes())
    assert offsets and offsets[0] > 1, "metadata kept inline: this test no longer checks the offset form"
    got = litert_torch.load(str(path))(x)
    assert set(got) == set(want)
    for k in want:
        assert rel_err(got[k], want[k]) <= 0.05, k  # dynamic int8 weights and activations
