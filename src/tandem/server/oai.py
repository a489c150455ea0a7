"""OpenAI-compatible endpoints: /v1/completions, /v1/chat/completions, /v1/models, and
llama-server's /apply-template (a chat's messages rendered as the prompt).

Each answer also carries llama-server's `timings` (with draft_n / draft_n_accepted when
speculating). Streams are OpenAI's SSE chunks ending with `data: [DONE]`; in a chat stream the
finish reason comes with an empty delta, then usage and timings in a chunk of their own with no
choices (unless stream_options.include_usage is false), as llama-server sends them.
"""

from __future__ import annotations

import time
import uuid

from fastapi import APIRouter, Request as HttpRequest

from .. import __version__
from .jobs import off_loop, read_body, sse_response, submit, wait_result
from .prepare import build_request, chat_ids, chat_text, n_predict_of, prompt_ids
from .results import probabilities
from .schemas import ChatBody, OaiCompletionBody, parse_body
from .state import ServerState
from .worker import Delta, Done

router = APIRouter()


def _state(http: HttpRequest) -> ServerState:
    return http.app.state.tandem


@router.get("/v1/models")
@router.get("/models")
async def models(http: HttpRequest):
    state = _state(http)
    engine, _ = state.ready()
    return {"object": "list", "data": [{
        "id": state.model_name, "object": "model", "created": state.created,
        "owned_by": "tandem",
        "meta": {"n_ctx": engine.cfg.ctx_size, "n_vocab": engine.target.args.vocab_size,
                 "speculative": ",".join(engine.spec.types), "draft": state.draft_path},
    }]}


@router.post("/v1/completions")
async def completions(http: HttpRequest):
    state = _state(http)
    engine, _ = state.ready()
    body: OaiCompletionBody = parse_body(await read_body(http, state), OaiCompletionBody)
    ids = await off_loop(prompt_ids, engine, body.prompt)
    n_probs = body.logprobs or 0
    req = build_request(engine, body, ids, n_predict_of(body.max_tokens, body.n_predict),
                        n_probs, state.settings.sampling)
    job = submit(state, req, body.stream)
    meta = _meta(state, "cmpl", "text_completion")
    if body.stream:
        return await sse_response(http, state, job, _text_chunks(state, meta, n_probs))
    r = await wait_result(http, state, job)
    choice = {"index": 0, "text": r["content"], "finish_reason": finish_reason(r),
              "logprobs": _legacy(r.get("completion_probabilities", [])) if n_probs else None}
    return {**meta, "choices": [choice], "usage": usage(r), "timings": r["timings"]}


@router.post("/apply-template")
async def apply_template(http: HttpRequest):
    """llama-server's POST /apply-template: a chat request's messages rendered by the model's
    template, as the prompt the chat endpoint would generate from ({"prompt": text})."""
    state = _state(http)
    engine, _ = state.ready()
    body: ChatBody = parse_body(await read_body(http, state), ChatBody)
    return {"prompt": await off_loop(chat_text, engine, body)}


@router.post("/v1/chat/completions")
@router.post("/chat/completions")
async def chat_completions(http: HttpRequest):
    state = _state(http)
    engine, _ = state.ready()
    body: ChatBody = parse_body(await read_body(http, state), ChatBody)
    ids = await off_loop(chat_ids, engine, body)
    n_probs = (body.top_logprobs or 1) if body.logprobs else 0
    n_predict = n_predict_of(body.max_completion_tokens, body.max_tokens, body.n_predict)
    job = submit(state, build_request(engine, body, ids, n_predict, n_probs,
                                      state.settings.sampling), body.stream)
    meta = _meta(state, "chatcmpl", "chat.completion")
    if body.stream:
        meta["object"] = "chat.completion.chunk"
        return await sse_response(http, state, job, _chat_chunks(state, meta, body))
    r = await wait_result(http, state, job)
    choice = {"index": 0, "message": {"role": "assistant", "content": r["content"]},
              "finish_reason": finish_reason(r),
              "logprobs": _chat_logprobs(r, body) if body.logprobs else None}
    return {**meta, "choices": [choice], "usage": usage(r), "timings": r["timings"]}


def finish_reason(result: dict) -> str:
    return "length" if result["stop_type"] == "limit" else "stop"


def usage(result: dict) -> dict:
    p, c = result["tokens_evaluated"], result["tokens_predicted"]
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}


def _meta(state: ServerState, prefix: str, obj: str) -> dict:
    return {"id": f"{prefix}-{uuid.uuid4().hex}", "object": obj, "created": int(time.time()),
            "model": state.model_name, "system_fingerprint": f"tandem-{__version__}"}


def _text_chunks(state: ServerState, meta: dict, n_probs: int):
    offset = 0

    def render(event: Delta | Done) -> list[dict | str]:
        nonlocal offset
        if isinstance(event, Delta):
            if not (event.text or n_probs and event.logprobs):
                return []
            lp = None
            if n_probs:
                lp = _legacy(probabilities(state.engine, event.logprobs), offset)
                offset += sum(len(t) for t in lp["tokens"])
            return [{**meta, "choices": [{"index": 0, "text": event.text, "logprobs": lp,
                                          "finish_reason": None}]}]
        r = event.result
        return [{**meta, "choices": [{"index": 0, "text": "", "logprobs": None,
                                      "finish_reason": finish_reason(r)}],
                 "usage": usage(r), "timings": r["timings"]}, "[DONE]"]

    return render


def _chat_chunks(state: ServerState, meta: dict, body: ChatBody):
    """OpenAI's chat stream as llama-server sends it: a first chunk naming the role (content
    null), a chunk per piece of text, the finish-reason chunk (empty delta), then, unless
    stream_options.include_usage is false, a chunk with no choices carrying usage and
    timings, and [DONE]."""
    started = False
    include_usage = (body.stream_options or {}).get("include_usage", True) is not False

    def render(event: Delta | Done) -> list[dict | str]:
        nonlocal started
        out: list[dict | str] = []
        if not started:  # OpenAI's first chunk names the role
            started = True
            out.append(_chat_chunk(meta, {"role": "assistant", "content": None}))
        if isinstance(event, Delta):
            if event.text or body.logprobs and event.logprobs:
                lp = None
                if body.logprobs:
                    lp = {"content": _chat_entries(probabilities(state.engine, event.logprobs),
                                                   body)}
                out.append(_chat_chunk(meta, {"content": event.text}, logprobs=lp))
            return out
        r = event.result
        out.append(_chat_chunk(meta, {}, finish_reason(r)))
        if include_usage:
            out.append({**meta, "choices": [], "usage": usage(r), "timings": r["timings"]})
        out.append("[DONE]")
        return out

    return render


def _chat_chunk(meta: dict, delta: dict, finish: str | None = None, logprobs=None) -> dict:
    return {**meta, "choices": [{"index": 0, "delta": delta, "logprobs": logprobs,
                                 "finish_reason": finish}]}


def _chat_logprobs(result: dict, body: ChatBody) -> dict:
    return {"content": _chat_entries(result.get("completion_probabilities", []), body)}


def _chat_entries(probs: list[dict], body: ChatBody) -> list[dict]:
    """llama.cpp's completion_probabilities -> OpenAI chat logprobs entries."""
    n_top = body.top_logprobs or 0

    def entry(p: dict) -> dict:
        return {"token": p["token"], "logprob": p["logprob"], "bytes": p["bytes"]}

    return [{**entry(p), "top_logprobs": [entry(t) for t in p["top_logprobs"][:n_top]]}
            for p in probs]


def _legacy(probs: list[dict], start: int = 0) -> dict:
    """OpenAI's legacy completions logprobs: parallel lists, top_logprobs as {token: logprob},
    text_offset the character offset of each token in the completion."""
    offsets, at = [], start
    for p in probs:
        offsets.append(at)
        at += len(p["token"])
    return {
        "tokens": [p["token"] for p in probs],
        "token_logprobs": [p["logprob"] for p in probs],
        "top_logprobs": [{t["token"]: t["logprob"] for t in p["top_logprobs"]} for p in probs],
        "text_offset": offsets,
    }
