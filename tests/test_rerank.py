"""POST /rerank (llama-server's --reranking) on a tiny qwen3 reranker made the way llama.cpp
converts Qwen3-Reranker: a `cls.output` head of two output rows ("yes", "no"), a "rerank" prompt.
The score is then the model's probability of "yes" against "no" after the prompt, which
transformers gives independently."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import httpx
import pytest
import torch

from tandem.errors import ModelFileError
from tandem.models.loader import _rank_head, load_model
from tandem.server.rerank import rerank_tokens

from tests import tiny
from tests.servers import Server

YES, NO = 120, 200  # the tiny vocabulary's stand-ins for "yes" and "no"
QUERY = "def add(a, b):"
DOCS = ["The quick brown fox jumps over the lazy dog.", "def add(a, b):\n    return a + b\n",
        "Once upon a time there was a small robot", "import os\nimport sys\n"]


@pytest.fixture(scope="module")
def ranker(tmp_path_factory):
    d = tmp_path_factory.mktemp("rerank")
    model = tiny.hf_model("qwen3", seed=4)
    path = tiny.write_gguf(model, d / "reranker.gguf", "qwen3", rank_tokens=[YES, NO])
    plain = tiny.write_gguf(model, d / "plain.gguf", "qwen3")
    on = Server(["--model", str(path), "--reranking", "-c", "512", "-b", "64", "-t", "1"],
                d / "on.log")
    off = Server(["--model", str(path), "-c", "256", "-t", "1", "--embedding"], d / "off.log")
    try:
        on.wait_ready(120)
        off.wait_ready(120)
        yield SimpleNamespace(on=on, off=off, model=model, path=path, plain=plain, dir=d)
    finally:
        on.stop()
        off.stop()


def post(server: Server, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, timeout=60)


def _reference(r, query: str, docs: list[str]) -> tuple[list[float], int]:
    """transformers' P("yes") over {"yes", "no"} after each rerank prompt; total tokens."""
    m = load_model(r.path)
    scores, total = [], 0
    for doc in docs:
        ids = rerank_tokens(m.tokenizer, m.rank_head, query, doc)
        total += len(ids)
        with torch.no_grad():
            last = r.model(torch.tensor([ids])).logits[0, -1]
        scores.append(torch.softmax(last[[YES, NO]], -1)[0].item())
    return scores, total


def test_scores_are_the_models_yes_probability_most_relevant_first(ranker):
    want, total = _reference(ranker, QUERY, DOCS)
    assert max(want) - min(want) > 1e-3  # the documents are told apart
    out = post(ranker.on, "/rerank", {"query": QUERY, "documents": DOCS})
    assert out.status_code == 200, out.text
    body = out.json()
    assert body["object"] == "list" and body["usage"] == {"prompt_tokens": total,
                                                          "total_tokens": total}
    got = body["results"]
    assert sorted(r["index"] for r in got) == [0, 1, 2, 3]
    assert [r["relevance_score"] for r in got] == sorted((r["relevance_score"] for r in got),
                                                          reverse=True)
    for r in got:  # (the server's int8/int16 activations and half cache against float32)
        assert r["relevance_score"] == pytest.approx(want[r["index"]], abs=2e-3)
    # the other routes and TEI's form (a bare list, "score", the text when asked)
    for route in ("/reranking", "/v1/rerank", "/v1/reranking"):
        assert post(ranker.on, route, {"query": QUERY, "documents": DOCS}).json() == body
    tei = post(ranker.on, "/rerank", {"query": QUERY, "texts": DOCS, "return_text": True}).json()
    assert [(t["index"], t["text"]) for t in tei] == [(r["index"], DOCS[r["index"]])
                                                      for r in got]
    assert [t["score"] for t in tei] == [r["relevance_score"] for r in got]


def test_a_document_longer_than_the_batch_is_read_in_chunks(ranker):
    doc = " ".join(DOCS * 5)
    want, total = _reference(ranker, QUERY, [doc])
    assert total > 3 * 64  # the server reads it in passes of -b 64
    got = post(ranker.on, "/rerank", {"query": QUERY, "documents": [doc]}).json()
    assert got["usage"]["prompt_tokens"] == total
    assert got["results"][0]["relevance_score"] == pytest.approx(want[0], abs=2e-3)


@pytest.mark.parametrize("top_n,n", [(None, 4), (2, 2), (4, 4), (99, 4), (0, 0)])
def test_top_n_keeps_the_most_relevant(ranker, top_n, n):
    full = post(ranker.on, "/rerank", {"query": QUERY, "documents": DOCS}).json()["results"]
    body = {"query": QUERY, "documents": DOCS} | ({} if top_n is None else {"top_n": top_n})
    assert post(ranker.on, "/rerank", body).json()["results"] == full[:n]
    tei = {"query": QUERY, "texts": DOCS} | ({} if top_n is None else {"top_n": top_n})
    assert len(post(ranker.on, "/rerank", tei).json()) == n


@pytest.mark.parametrize("body,message", [
    ({"query": QUERY, "documents": []}, "must be a non-empty string array"),
    ({"query": QUERY, "documents": None}, "must be a non-empty string array"),
    ({"query": QUERY, "documents": 123}, "must be a non-empty string array"),
    ({"query": QUERY, "documents": [1, 2, 3]}, "must be a non-empty string array"),
    ({"documents": DOCS}, "\"query\" must be provided"),
    ({"query": 5, "documents": DOCS}, "\"query\" must be a string"),
    ({"query": QUERY, "documents": DOCS, "top_n": "2"}, "\"top_n\" must be an integer"),
    ({"query": QUERY, "documents": ["word " * 600]}, "but the context holds 512 per slot"),
])
def test_bad_rerank_requests_get_400_naming_the_field(ranker, body, message):
    r = post(ranker.on, "/rerank", body)
    assert r.status_code == 400 and message in r.json()["error"]["message"], r.text


def test_reranking_only_where_started_with_it(ranker):
    r = post(ranker.off, "/rerank", {"query": QUERY, "documents": DOCS})
    assert r.status_code == 501 and "--reranking" in r.json()["error"]["message"]
    r = post(ranker.on, "/v1/embeddings", {"input": "hello"})
    assert r.status_code == 400 and "/rerank" in r.json()["error"]["message"]


def test_a_model_without_a_ranking_head_is_refused_at_start(ranker):
    p = subprocess.run([sys.executable, "-m", "tandem.cli", "serve", "--model",
                        str(ranker.plain), "--reranking", "-c", "256", "-t", "1",
                        "--port", "1"], capture_output=True, text=True, timeout=120)
    assert p.returncode != 0
    assert "no classification head (tensor cls.output.weight)" in p.stderr + p.stdout


def test_a_head_of_the_wrong_width_names_the_tensor():
    g = SimpleNamespace(path="r.gguf", arch="qwen3", metadata={}, get=lambda k, d=None: d,
                        tensors={"cls.output.weight": SimpleNamespace(shape=(2, 63))})
    with pytest.raises(ModelFileError, match=r"'cls.output.weight' has shape \[2, 63\], "
                                             r"expected \[labels, 64\]"):
        _rank_head(g, SimpleNamespace(dim=64))


def test_prompt_layout_is_llama_servers(ranker):
    """format_prompt_rerank: the file's rerank prompt with its special tokens parsed; without
    one, BOS (where added), query, EOS (where added), document, EOS."""
    m = load_model(ranker.path)
    tok, head = m.tokenizer, m.rank_head
    assert head.template == tiny.RERANK_TEMPLATE and head.labels == ["yes", "no"]
    ids = rerank_tokens(tok, head, "q?", "some doc")
    start, end = tok.encode("<|im_start|>", add_special=False), tok.encode("<|im_end|>", add_special=False)
    assert len(start) == len(end) == 1  # the specials, not their characters
    assert ids == start + tok.encode("q?", add_special=False, parse_special=False) + end + \
        tok.encode("\nsome doc", add_special=False, parse_special=False) + end + \
        tok.encode("\n", add_special=False) + start
    bare = SimpleNamespace(template=None)
    plain = SimpleNamespace(bos_id=7, eos_id=9, add_bos=True, add_eos=True,
                            encode=lambda text, add_special, parse_special: [len(text)])
    assert rerank_tokens(plain, bare, "abc", "de") == [7, 3, 9, 2, 9]
    plain.add_bos = plain.add_eos = False
    assert rerank_tokens(plain, bare, "abc", "de") == [3, 2]
