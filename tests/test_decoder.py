"""Our decoder's logits against Hugging Face transformers on tiny random models."""

from __future__ import annotations

import pytest
import torch

from tandem.config import Numerics
from tandem.models.decoder import KVCache
from tandem.models.loader import load_model

from . import tiny

TOL = 1e-4
F32 = Numerics(dtype="float32")


def _ours(m, ids: list[int], chunk: int | None = None) -> torch.Tensor:
    """Logits for every position, the prompt fed in chunks of `chunk` tokens."""
    cache = KVCache(m.args, 1, 64, m.dtype)
    chunk = chunk or len(ids)
    out = []
    for s in range(0, len(ids), chunk):
        part = ids[s:s + chunk]
        out.append(m.model(torch.tensor([part]), cache, [0], [s])[0])
        cache.append(0, part)
    return torch.cat(out)


@pytest.fixture(scope="module", params=["qwen2", "llama", "qwen3", "gemma3"])
def pair(request, tmp_path_factory):
    arch = request.param
    ref = tiny.hf_model(arch, seed=1)
    d = tmp_path_factory.mktemp(arch)
    tiny.write_hf(ref, d / "hf")
    tiny.write_gguf(ref, d / "model.gguf", arch)
    return arch, ref, d


@pytest.mark.parametrize("source", ["hf", "gguf"])
def test_logits_match_transformers(pair, source):
    arch, ref, d = pair
    m = load_model(d / "hf" if source == "hf" else d / "model.gguf", F32)
    assert m.args.arch == arch and m.dtype == torch.float32
    ids = [5, 17, 42, 99, 3, 250, 7, 8, 9, 10, 11, 120]
    with torch.no_grad():
        want = ref(torch.tensor([ids])).logits[0]
    got = _ours(m, ids)
    assert (got - want).abs().max().item() <= TOL
    # chunked prefill and one-token steps give the same rows as one pass
    assert (_ours(m, ids, chunk=5) - want).abs().max().item() <= TOL
    assert (_ours(m, ids, chunk=1) - want).abs().max().item() <= TOL


def test_tied_embeddings_gguf(tmp_path):
    ref = tiny.hf_model("qwen2", seed=2, tie_word_embeddings=True)
    path = tiny.write_gguf(ref, tmp_path / "tied.gguf", "qwen2")
    m = load_model(path, F32)
    assert m.args.tie_embeddings
    ids = [1, 2, 3, 4, 200]
    with torch.no_grad():
        want = ref(torch.tensor([ids])).logits[0]
    assert (_ours(m, ids) - want).abs().max().item() <= TOL


def test_batched_rows_equal_single_rows(pair):
    """Several slots in one forward pass, and several rows of one slot, give bit for bit the
    logits each token gets when decoded alone (greedy answers depend on it)."""
    _, _, d = pair
    m = load_model(d / "model.gguf", F32)
    prompts = [[5, 6, 7, 8, 9, 10], [11, 12, 13], [100, 101, 102, 103, 104, 105, 106, 107]]
    cache = KVCache(m.args, 3, 64, m.dtype)
    for s, p in enumerate(prompts):
        m.model(torch.tensor([p[:-1]]), cache, [s], [0])
        cache.append(s, p[:-1])
    # rows of different useful length, padded to 3: [last, d1, d2] / [last] / [last, d1]
    rows = torch.tensor([[10, 20, 21], [13, 0, 0], [107, 30, 0]])
    starts = [cache.length(s) for s in range(3)]
    batched = m.model(rows, cache, [0, 1, 2], starts)
    for s, (p, n) in enumerate(zip(prompts, [3, 1, 2])):
        alone = KVCache(m.args, 1, 64, m.dtype)
        m.model(torch.tensor([p[:-1]]), alone, [0], [0])
        want = m.model(rows[s:s + 1, :n], alone, [0], [len(p) - 1])[0]
        assert torch.equal(batched[s, :n], want)
        alone.append(0, p[:-1])
        for t in range(n):  # one token at a time, as plain decoding does
            one = m.model(rows[s:s + 1, t:t + 1], alone, [0], [len(p) - 1 + t])[0, 0]
            assert torch.equal(batched[s, t], one)
