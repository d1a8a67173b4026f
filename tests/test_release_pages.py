"""converter.page_release.release_pages (#16): the pages of our private weight maps go back once read, never a
page that was written, never a user's memory; a model directory mapped lazily converts to a TPU artifact that
computes transformers' logits, with its shard's pages given back."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tpu_export.converter.lazy_weights import _FileMap
from tpu_export.converter.page_release import release_pages

pytestmark = pytest.mark.skipif(not __import__("os").path.exists("/proc/self/smaps"), reason="Linux /proc only")

_N = 4 << 20  # bytes in the test map: 1024 pages


def _rss_kb(addr: int) -> int:
    """Rss (kB) of the mapping holding ``addr``, from /proc/self/smaps (the kernel's count, not ours)."""
    with open("/proc/self/smaps") as f:
        inside = False
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= addr < hi
            elif inside and head == "Rss:":
                return int(line.split()[1])
    raise AssertionError("no mapping holds the address")


@pytest.fixture
def mapped(tmp_path):
    data = np.random.default_rng(0).standard_normal(_N // 4).astype(np.float32)
    path = tmp_path / "w.bin"
    path.write_bytes(data.tobytes())
    fm = _FileMap(str(path))
    t = fm.tensor(0, torch.empty(_N // 4))
    yield fm, t, torch.from_numpy(data)
    del t
    fm.map.close()


def test_release_drops_the_map_pages_and_the_values_read_again_are_the_same(mapped):
    fm, t, want = mapped
    assert torch.equal(t, want)  # reading pages the whole map in
    assert _rss_kb(fm.base) >= _N // 1024
    assert release_pages(t)
    assert _rss_kb(fm.base) <= 8
    assert torch.equal(t, want)  # re-read from the file
    # a slice in the middle: only its pages go (1 MiB of the 4)
    part = t[(1 << 20) // 4:(2 << 20) // 4]
    assert release_pages(part)
    # (at least its pages: a huge page the file's cache maps whole is unmapped whole, and read again on use)
    assert _rss_kb(fm.base) <= _N // 1024 - 1024
    assert torch.equal(t, want)


def test_a_written_page_is_never_released_and_keeps_its_value(mapped):
    fm, t, want = mapped
    with torch.no_grad():
        t[10] += 1.0  # page 0 is copied on write (the map is private)
    changed = want.clone()
    changed[10] += 1.0
    assert not release_pages(t)  # the range holds a written page: nothing is dropped
    assert not release_pages(t[:16])
    assert torch.equal(t, changed)
    rest = t[1024:]  # from the second page on: never written, released
    assert release_pages(rest)
    assert torch.equal(t, changed)
    # a neighbour sharing the written page at the boundary is refused with it
    assert not release_pages(t[1000:1100])
    assert torch.equal(t, changed)


def test_the_writers_drop_of_every_spool_page_keeps_a_written_one(mapped):
    # edge.builder / quantize_stream give back whole maps (lazy_weights.drop_all_pages / drop_pages): through the
    # same check, so an in-place write to a parameter survives while the never-written pages go
    from tpu_export.converter.lazy_weights import drop_all_pages, drop_pages

    fm, t, want = mapped
    with torch.no_grad():
        t[10] += 1.0
    changed = want.clone()
    changed[10] += 1.0
    drop_all_pages()
    assert drop_pages(t.numpy())  # in a spool: True (the bytes stay readable from it), whatever was released
    assert torch.equal(t, changed)


def test_a_users_tensor_or_array_is_left_alone():
    x = torch.randn(1 << 18)
    keep = x.clone()
    assert not release_pages(x)
    assert not release_pages(x.numpy())
    assert not release_pages(torch.empty(0))
    assert not release_pages(torch.empty(4, device="meta"))
    assert torch.equal(x, keep)


def test_a_lazily_mapped_directory_converts_to_a_tpu_artifact_with_transformers_logits(tmp_path, monkeypatch):
    """convert-lm's lazy load (targets/lm_stream.load_lazily: private maps of the shards) to a TPU artifact
    (cpu-xla, run on PJRT CPU): transformers' logits, and the shard's pages given back by the last reads."""
    import transformers

    import tpu_export
    from tests.numerics import rel_err
    from tpu_export import tpu_backend
    from tpu_export.targets import lm_stream

    d = tmp_path / "llama"
    # 12.5 MB of float32 weights: several times what a read maps around it (fault-around, a huge page), so what
    # stays resident after the conversion shows whether each weight's pages were given back (all 12.5 MB without)
    cfg = transformers.LlamaConfig(vocab_size=4096, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False,
                                   max_position_embeddings=64)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        transformers.LlamaForCausalLM(cfg).save_pretrained(d, safe_serialization=True)
    monkeypatch.setattr(lm_stream, "STREAM_LM_FROM", 0)
    lazy = lm_stream.load_lazily(str(d))
    (shard,) = lazy.tpu_export_spool
    assert isinstance(shard, _FileMap)

    class Logits(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, ids):
            return self.m(input_ids=ids, use_cache=False).logits

    ids = torch.tensor([[1, 5, 9, 30, 100, 7]])
    written = tpu_export.convert(Logits(lazy).eval(), (ids,), targets=["cpu-xla"], out_dir=tmp_path / "out")
    # the last reads of the weights (the fingerprint, weights.safetensors) gave the shard's pages back
    assert _rss_kb(shard.base) * 1024 <= 0.25 * shard.size
    whole = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    with torch.no_grad():
        want = whole(input_ids=ids, use_cache=False).logits
    got = tpu_backend.load(written["cpu-xla"])(ids)
    assert rel_err(np.asarray(got), want) <= 1e-5
