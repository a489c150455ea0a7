"""Embeddings from the target's hidden states, as llama-server serves them (with --embedding).

    POST /v1/embeddings     OpenAI's: {"input": text | ids | [several]} -> {"data": [{"embedding"}]}
                            (encoding_format "base64": little-endian float32, base64)
    POST /embedding(s)      llama.cpp's: {"content" or "input"} -> [{"index", "embedding"}]
                            (with --pooling none: one vector per token)

The vector is the final-normed hidden state pooled over the input (--pooling: last, the token
that has read the whole input in a causal model, by default; mean; cls; none), then normalized
by embd_normalize (2: Euclidean, the default; -1: none; 0: max-abs scaled to int16's range;
p > 0: the p-norm), as llama.cpp's common_embd_normalize. Pooled "last", an input may fill a
slot's context (read in chunks of --batch-size, as llama-server reads it); pooled otherwise it
must fit one pass (--batch-size tokens), as llama-server's "input is too large to process".
"""

from __future__ import annotations

import asyncio
import base64
import struct
from typing import Any

from fastapi import APIRouter, Request as HttpRequest
from pydantic import Field

from ..embedding import longest
from .jobs import off_loop, read_body
from .prepare import prompt_list
from .schemas import ApiError, _Body, parse_body
from .state import ServerState

router = APIRouter()


class EmbeddingBody(_Body):
    input: Any = None
    content: Any = None
    model: str | None = None
    encoding_format: str = Field("float", pattern="^(float|base64)$")
    embd_normalize: int = 2


def normalize(vec: list[float], norm: int) -> list[float]:
    if norm < 0:
        return vec
    if norm == 0:
        top = max((abs(v) for v in vec), default=0.0)
        scale = 32760.0 / top if top > 0 else 0.0
    elif norm == 2:
        total = sum(v * v for v in vec) ** 0.5
        scale = 1.0 / total if total > 0 else 0.0
    else:
        total = sum(abs(v) ** norm for v in vec) ** (1.0 / norm)
        scale = 1.0 / total if total > 0 else 0.0
    return [v * scale for v in vec]


async def _embed(http: HttpRequest, oai: bool) -> tuple[ServerState, EmbeddingBody, list]:
    state: ServerState = http.app.state.tandem
    engine, worker = state.ready()
    if not state.settings.embeddings:
        raise ApiError(501, "this server does not serve embeddings: start it with --embedding")
    body: EmbeddingBody = parse_body(await read_body(http, state), EmbeddingBody)
    given = body.input if body.input is not None else body.content
    if given is None:
        raise ApiError(400, "\"input\" (or \"content\") is required")
    if given == []:
        raise ApiError(400, "input: an empty list; give text, token ids or a list of them")
    pooling = state.settings.pooling
    if pooling == "rank":
        raise ApiError(400, "this server ranks (--reranking, pooling rank): use POST /rerank, "
                            "or start it with another --pooling for embeddings")
    if oai and pooling == "none":
        raise ApiError(400, "pooling type 'none' is not OpenAI compatible: use /embeddings, or "
                            "start the server with another --pooling")
    prompts = await off_loop(_prompts, engine, given)
    check_fits(engine, prompts, "input", pooling)
    vocab = engine.tok.vocab_size
    bad = next((t for ids in prompts for t in ids if not 0 <= t < vocab), None)
    if bad is not None:
        raise ApiError(400, f"input: token id {bad} is outside the vocabulary (0..{vocab - 1})")

    def run() -> list:
        out = []
        for ids in prompts:
            h = engine.embed(ids, pooling)
            state.metrics.embedded(len(ids))
            rows = h.tolist()
            out.append([normalize(r, body.embd_normalize) for r in rows] if pooling == "none"
                       else normalize(rows, body.embd_normalize))
        return out

    vectors = await asyncio.wrap_future(worker.call(run))
    return state, body, list(zip(prompts, vectors))


def check_fits(engine, prompts: list[list[int]], what: str, pooling: str) -> None:
    """Each input within what Engine.embed reads (embedding.longest), with llama-server's
    errors: pooled "last", a slot's context (read in chunks); else one pass."""
    most = longest(engine.cfg, pooling)
    for i, ids in enumerate(prompts):
        if len(ids) <= most:
            continue
        if pooling == "last":
            raise ApiError(400, f"{what} {i} has {len(ids)} tokens but the context holds "
                                f"{most} per slot; shorten it or start the server with a larger "
                                "--ctx-size", "exceed_context_size_error",
                           n_prompt_tokens=len(ids), n_ctx=most)
        raise ApiError(400, f"{what} {i} ({len(ids)} tokens) is too large to process. "
                            f"increase the physical batch size (current batch size: {most})")


def _prompts(engine, given) -> list[list[int]]:
    """prompt_list, except that an empty text is the BOS token alone where the model has one
    (llama-server embeds it rather than failing)."""
    if given == "" and engine.tok.bos_id is not None:
        return [[engine.tok.bos_id]]
    return prompt_list(engine, given)


@router.post("/v1/embeddings")
async def oai_embeddings(http: HttpRequest):
    state, body, items = await _embed(http, oai=True)
    data = []
    for i, (_, vec) in enumerate(items):
        emb: Any = vec
        if body.encoding_format == "base64":
            emb = base64.b64encode(struct.pack(f"<{len(vec)}f", *vec)).decode()
        data.append({"object": "embedding", "index": i, "embedding": emb})
    n = sum(len(ids) for ids, _ in items)
    return {"object": "list", "data": data, "model": body.model or state.model_name,
            "usage": {"prompt_tokens": n, "total_tokens": n}}


@router.post("/embedding")
@router.post("/embeddings")
async def embeddings(http: HttpRequest):
    state, _, items = await _embed(http, oai=False)
    pooled = state.settings.pooling != "none"
    return [{"index": i, "embedding": [vec] if pooled else vec}
            for i, (_, vec) in enumerate(items)]
