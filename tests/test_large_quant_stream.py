"""Quantize while streaming (#16): int8 and int4 blockwise weights and embedding tables computed tensor by tensor as
the .tflite is written give the bytes, scales and outputs of ai-edge-quantizer's in-memory pass on the same model."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.numerics import rel_err
from tpu_export import litert_torch

pytestmark = [pytest.mark.slow]


class TinyLm(torch.nn.Module):
    """An embedding table tied to the output projection (read by the lookup and by a FULLY_CONNECTED), two linears."""

    def __init__(self, vocab=320, dim=64, hidden=96):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, dim)
        self.up = torch.nn.Linear(dim, hidden)
        self.down = torch.nn.Linear(hidden, dim)
        self.head = torch.nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids):
        h = self.emb(ids)
        return self.head(h + self.down(torch.nn.functional.gelu(self.up(h))))


def _quantized(data, subgraph: int = 0) -> dict:
    """{tensor name: (type, raw bytes, scales, quantized dim, block size, blockwise scales)}: the quantized ones."""
    from tpu_export.edge.inspect import read_model

    mt = read_model(data)
    sg = mt.subgraphs[subgraph]

    def raw(t):
        buf = mt.buffers[t.buffer]  # the quantizer writes the large-model form (data after the flatbuffer)
        return bytes(buf.data) if buf.data is not None else bytes(data[buf.offset:buf.offset + buf.size])

    out = {}
    for t in sg.tensors:
        qp = t.quantization
        if t.type not in (9, 17) or qp is None:  # INT8, INT4
            continue
        block = qp.details
        out[t.name.decode()] = (t.type, raw(t), None if qp.scale is None else np.asarray(qp.scale).tolist(),
                                qp.quantizedDimension, block and block.blockSize,
                                block and (sg.tensors[block.scales].type, raw(sg.tensors[block.scales])))
    return out


def _op_counts(data) -> dict:
    import collections

    from tpu_export.edge.builder import builtin_names
    from tpu_export.edge.inspect import read_model

    mt, names = read_model(data), builtin_names()
    return collections.Counter(names[mt.operatorCodes[op.opcodeIndex].builtinCode] for op in mt.subgraphs[0].operators)


@pytest.mark.parametrize("scheme,kind", [("dynamic_int8", 9), ("weight_only_int8", 9), ("dynamic_int4_block32", 17)])
def test_streamed_weights_and_tables_are_ai_edge_quantizers(tmp_path, monkeypatch, scheme, kind):
    from tpu_export.edge.quantize import quantize_tflite
    from tpu_export.edge.quantize_post import ZERO_BLOCK_SCALE
    from tpu_export.litert_torch import _large

    torch.manual_seed(0)
    m, ids = TinyLm().eval(), torch.randint(0, 320, (1, 8))
    with torch.no_grad():  # all-zero rows (int8: the quantizer's 1e-9 range floor, not a divide by zero; int4: a
        m.up.weight[5].zero_()  # float16 scale 0, which XNNPACK refuses, made float16's smallest normal), among them
        m.emb.weight[0].zero_()  # the tied table's (Gemma's padding row), and a block whose scale rounds to 0 unzeroed
        m.down.weight[3, 32:64] = 1e-8
    float_bytes = litert_torch.convert(m, (ids,)).tflite_model()
    theirs = litert_torch.Model(quantize_tflite(float_bytes, scheme))
    monkeypatch.setattr(_large, "_STREAM_QUANT_FROM", 0)  # the 1 GiB threshold, for a 130 KB model
    ours = litert_torch.convert(m, (ids,), quant_config=scheme, output_file_path=tmp_path / "q.tflite")
    a, b = _quantized(ours.tflite_model()), _quantized(theirs.tflite_model())
    assert sorted(a) == sorted(b) == ["down.weight", "emb.weight", "up.weight"]
    for name in a:
        assert a[name][0] == kind and a[name][1:] == b[name][1:], name
    if kind == 17:  # 2 + 2 blocks of the zero rows, 1 of the tiny block; no scale 0 left
        scales = np.concatenate([np.frombuffer(b[name][5][1], np.float16) for name in b])
        assert (scales == ZERO_BLOCK_SCALE).sum() == 5 and (scales > 0).all()
    size = len(ours.tflite_model())
    assert size < len(float_bytes) / (3 if kind == 9 else 5) and abs(size - len(theirs.tflite_model())) < 2048
    assert _op_counts(ours.tflite_model()) == _op_counts(theirs.tflite_model())  # weight-only: 3 DEQUANTIZE
    got, want = ours(ids), theirs(ids)
    assert np.array_equal(np.asarray(got), np.asarray(want))
    assert rel_err(got, m(ids)) < (0.02 if kind == 9 else 0.2)


# weight_only_int8 has dynamic_int8's bytes (its DEQUANTIZE form is checked on TinyLm above): not repeated here
@pytest.mark.engine
@pytest.mark.parametrize("scheme", [None, "dynamic_int8", "dynamic_int4_block32"])
def test_convert_lm_streams_a_large_lm_into_the_same_bundle(tmp_path, monkeypatch, scheme):
    """convert-lm past its streaming threshold (lowered here to 0): the directory's weights are read one tensor at a
    time into a file-backed spool (never loaded whole), model.tflite is written tensor by tensor, quantized as it
    goes, and bundled from the file. Float: the in-memory path's bytes; quantized: the quantizer's weights in
    every signature, and the LiteRT-LM engine replies with the in-memory bundle's greedy text. Gemma 3: a tied,
    scaled embedding table read by the lookup and the logits projection, whose padding row is all zeros (under
    int4 its float16 scale was 0 in either path, and XNNPACK refused the decode's logits projection)."""
    litert_lm = pytest.importorskip("litert_lm")
    from tests.llm_models import save_model_dir
    from tpu_export.targets import lm_stream
    from tpu_export.targets.lm import convert_lm

    d = save_model_dir("gemma3", tmp_path / "gemma3")
    kw = dict(prefill_lengths=(8,), cache_len=64, quantize=scheme)
    mem = convert_lm(d, ["android"], tmp_path / "mem", **kw)["android"]
    monkeypatch.setattr(lm_stream, "STREAM_LM_FROM", 0)
    import transformers

    def no_full_load(*a, **k):
        raise AssertionError("the directory was loaded whole; past the threshold its weights stay in a spool file")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", no_full_load)
    lines = []
    ours = convert_lm(d, ["android"], tmp_path / "ours", progress=lines.append, **kw)["android"]
    assert any("streamed" in line for line in lines)
    a, b = (open(w["model.tflite"], "rb").read() for w in (ours, mem))
    if scheme is None:
        assert a == b
        return
    for sg in (0, 1):  # prefill_8 and decode; the quantizer renames repeated names, so compare the values
        assert sorted(_quantized(a, sg).values()) == sorted(_quantized(b, sg).values())
        assert len(_quantized(a, sg)) >= 2 * 5 + 1  # 2 layers x (qkv, o, gate, up, down) at least + the table

    def reply(path):
        engine = litert_lm.Engine(str(path), max_num_tokens=64)
        session = engine.create_session(apply_prompt_template=False, sampler_config=litert_lm.SamplerConfig(top_k=1),
                                        max_output_tokens=24)
        session.run_prefill(["hello world, the cache holds keys"])
        return session.run_decode().texts[0]

    text = reply(ours["model.litertlm"])
    assert text and text == reply(mem["model.litertlm"])


@pytest.mark.parametrize("arch", ["qwen3", "phi3", "mixtral"])
def test_a_lazily_loaded_directory_computes_what_the_whole_load_does(tmp_path, monkeypatch, arch):
    """convert-lm's lazy directory load (parameters in a file-backed spool, buffers built by the constructors): the
    same logits as transformers' own load; a checkpoint whose names transformers converts as it loads (Mixtral's
    per-expert tensors, fused in transformers 5) is left to transformers (None)."""
    import transformers

    from tests.llm_models import save_model_dir
    from tpu_export.targets import lm_stream

    d = save_model_dir(arch, tmp_path / arch)
    monkeypatch.setattr(lm_stream, "STREAM_LM_FROM", 0)
    lazy = lm_stream.load_lazily(str(d))
    if arch == "mixtral":
        assert lazy is None
        return
    whole = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    ids = torch.tensor([[1, 5, 9, 30, 100, 7]])
    with torch.no_grad():
        assert torch.equal(lazy(ids).logits, whole(ids).logits)


def test_a_float32_directory_is_mapped_where_it_lies_and_a_bf16_one_cast_into_a_spool(tmp_path, monkeypatch):
    """The lazy load without a copy (#15): a float32 checkpoint, here in two shards, becomes private maps of its
    shards (no spool file is written; a write to a parameter never reaches the user's file), a bf16 one is cast into
    the spool as it is read. Both give transformers' logits exactly."""
    import hashlib

    import transformers

    from tests.llm_models import tiny_model
    from tpu_export.converter.lazy_weights import _FileMap
    from tpu_export.targets import lm_stream

    monkeypatch.setattr(lm_stream, "STREAM_LM_FROM", 0)
    ids = torch.tensor([[1, 5, 9, 30, 100, 7]])
    for dtype, mapped in ((torch.float32, True), (torch.bfloat16, False)):
        d = tmp_path / str(dtype)
        tiny_model("llama").to(dtype).save_pretrained(d, safe_serialization=True, max_shard_size="200KB")
        shards = sorted(d.glob("*.safetensors"))
        assert len(shards) >= 2
        before = [hashlib.sha256(s.read_bytes()).digest() for s in shards]
        lazy = lm_stream.load_lazily(str(d))
        spool = lazy.tpu_export_spool
        assert (isinstance(spool, list) and all(isinstance(m, _FileMap) for m in spool)) == mapped
        whole = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
        with torch.no_grad():
            assert torch.equal(lazy(ids).logits, whole(ids).logits)
            lazy.model.embed_tokens.weight.add_(1.0)  # private: the shard on disk stays as it was
        assert [hashlib.sha256(s.read_bytes()).digest() for s in shards] == before
