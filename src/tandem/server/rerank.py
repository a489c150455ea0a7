"""Reranking, as llama-server serves it (with --reranking: --embedding and --pooling rank).

    POST /rerank, /reranking, /v1/rerank, /v1/reranking
        {"query", "documents": [text, ...], "top_n"?}  Jina's form: {"model", "object": "list",
            "usage", "results": [{"index", "relevance_score"}]}, most relevant first
        {"query", "texts": [...], "top_n"?, "return_text"?}  TEI's form: [{"index", "score"
            (, "text")}], most relevant first

Each document is scored alone: the model's "rerank" prompt from the GGUF (its {query} and
{document} replaced; Qwen3-Reranker's asks for "yes" or "no"), else BOS (where the model adds
one), the query, EOS (where it adds one), the document, EOS; then the last token's final-normed
hidden state through the file's classification head (`cls.output`, models/loader.RankHead),
softmaxed for qwen3, and the first label's value is the score. A model without that head
cannot rank: `tandem serve --reranking` refuses it at start.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request as HttpRequest

from .embeddings import check_fits
from .jobs import off_loop, read_body
from .schemas import ApiError, _Body, parse_body
from .state import ServerState

router = APIRouter()


class RerankBody(_Body):
    query: Any = None
    documents: Any = None
    texts: Any = None
    top_n: Any = None
    return_text: bool = False
    model: str | None = None


def rerank_tokens(tok, head, query: str, document: str) -> list[int]:
    """llama-server's format_prompt_rerank: the model's rerank prompt, else the pair joined by
    the tokenizer's BOS/EOS."""
    if head.template is not None:
        text = head.template.replace("{query}", query).replace("{document}", document)
        return tok.encode(text, add_special=False, parse_special=True)
    ids = [tok.bos_id] if tok.add_bos else []
    ids += tok.encode(query, add_special=False, parse_special=False)
    if tok.add_eos:
        ids.append(tok.eos_id)
    ids += tok.encode(document, add_special=False, parse_special=False)
    if tok.add_eos:
        ids.append(tok.eos_id)
    return ids


def _documents(body: RerankBody) -> list[str]:
    given = body.documents if body.documents is not None else body.texts
    if not isinstance(given, list) or not given or \
            not all(isinstance(d, str) for d in given):
        raise ApiError(400, "\"documents\" must be a non-empty string array")
    return given


@router.post("/rerank")
@router.post("/reranking")
@router.post("/v1/rerank")
@router.post("/v1/reranking")
async def rerank(http: HttpRequest):
    state: ServerState = http.app.state.tandem
    engine, worker = state.ready()
    if not state.settings.embeddings or state.settings.pooling != "rank":
        raise ApiError(501, "This server does not support reranking. Start it with "
                            "`--reranking`")
    body: RerankBody = parse_body(await read_body(http, state), RerankBody)
    if body.query is None:
        raise ApiError(400, "\"query\" must be provided")
    if not isinstance(body.query, str):
        raise ApiError(400, "\"query\" must be a string")
    docs = _documents(body)
    top_n = len(docs) if body.top_n is None else body.top_n
    if isinstance(top_n, bool) or not isinstance(top_n, int):
        raise ApiError(400, f"\"top_n\" must be an integer, got {body.top_n!r}")
    tei = body.texts is not None  # llama-server: "texts" present means TEI's form
    head = engine.target.rank_head
    prompts = await off_loop(
        lambda: [rerank_tokens(engine.tok, head, body.query, d) for d in docs])
    check_fits(engine, prompts, "document", "last")  # (its prompt: query and document)

    def run() -> list[float]:
        scores = []
        for ids in prompts:
            scores.append(head.score(engine.embed(ids, "last")))
            state.metrics.embedded(len(ids))
        return scores

    scores = await asyncio.wrap_future(worker.call(run))
    label = "score" if tei else "relevance_score"
    results = []
    for i, s in enumerate(scores):
        item: dict[str, Any] = {"index": i, label: s}
        if tei and body.return_text:
            item["text"] = docs[i]
        results.append(item)
    results.sort(key=lambda r: -r[label])  # stable: equal scores keep the documents' order
    results = results[:max(top_n, 0)]
    if tei:
        return results
    n = sum(len(ids) for ids in prompts)
    return {"model": body.model or state.model_name, "object": "list",
            "usage": {"prompt_tokens": n, "total_tokens": n}, "results": results}
