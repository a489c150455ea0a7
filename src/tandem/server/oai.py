"""OpenAI-compatible endpoints: /v1/completions, /v1/chat/completions, /v1/models, and
llama-server's /apply-template (a chat's messages rendered as the prompt).

Each answer also carries llama-server's `timings` (with draft_n / draft_n_accepted when
speculating). Streams are OpenAI's SSE chunks ending with `data: [DONE]`; in a chat stream the
finish reason comes with an empty delta, then usage and timings in a chunk of their own with no
choices (unless stream_options.include_usage is false), as llama-server sends them. A chat
stream asked for `return_tokens` (Tandem's) gives each content chunk, beside OpenAI's fields,
`tokens` (ids), `pieces` (the text each added) and `origins` (who proposed each: "target",
"draft" for the draft model, "eagle3" for an EAGLE-3 head, "suffix" or "ngram" for repetition,
"grammar" when forced).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

from fastapi import APIRouter, Request as HttpRequest

from ..media import prompt_text
from .. import __version__
from .jobs import off_loop, read_body, sse_response, submit, wait_results
from .prepare import (build_request, chat_ids, chat_text, constraints_of, n_predict_of,
                      prompt_list)
from . import answer, tools
from .results import probabilities
from .schemas import ApiError, ChatBody, OaiCompletionBody, parse_body
from .state import ServerState
from .worker import Delta, Done, Job, Progress

router = APIRouter()
# llama-server's shape, b<build>-<commit>: here the version, then the program
FINGERPRINT = f"b{__version__}-tandem"


def _state(http: HttpRequest) -> ServerState:
    return http.app.state.tandem


@router.get("/v1/models")
@router.get("/models")
async def models(http: HttpRequest):
    state = _state(http)
    if (before := state.asleep()) is not None:  # --sleep-idle-seconds: answered, not woken
        return before["models"]
    engine, _ = state.ready()
    return models_body(state, engine)


def models_body(state: ServerState, engine) -> dict:
    # llama-server's answer also carries Ollama's shape, with the model's capabilities
    caps = ["completion", "multimodal"] if engine.vision is not None else ["completion"]
    return {"models": [{"name": state.model_name, "model": state.model_name, "type": "model",
                        "capabilities": caps, "details": {"format": "gguf"}}],
            "object": "list", "data": [{
        "id": state.model_name, "object": "model", "created": state.created,
        "owned_by": "tandem", "aliases": state.aliases or [state.model_name], "tags": state.settings.tags,
        "meta": {"n_ctx": engine.cfg.ctx_size, "n_vocab": engine.target.args.vocab_size,
                 "speculative": ",".join(engine.spec.types), "draft": state.draft_path},
    }]}


@router.post("/v1/completions")
async def completions(http: HttpRequest):
    """OpenAI's legacy completions: one choice per prompt and per n (choice i*n + j is prompt
    i's j-th answer)."""
    state = _state(http)
    engine, _ = state.ready()
    body: OaiCompletionBody = parse_body(await read_body(http, state), OaiCompletionBody)
    prompts = await off_loop(prompt_list, engine, body.prompt)
    n_probs = body.logprobs or 0
    _one_stream(body, len(prompts) * body.n)
    shaped = await off_loop(constraints_of, engine, body)
    reqs = [build_request(engine, body, ids, n_predict_of(body.max_tokens, body.n_predict),
                          n_probs, state.settings.sampling, constraints=shaped)
            for ids in prompts for _ in range(body.n)]
    jobs = submit(state, reqs, body.stream)
    meta = _meta(state, "cmpl", "text_completion")
    if body.stream:
        return await sse_response(http, state, jobs[0], _text_chunks(state, meta, n_probs))
    results = await wait_results(http, state, jobs)
    choices = [{"index": i, "text": r["content"], "finish_reason": finish_reason(r),
                "logprobs": _legacy(r.get("completion_probabilities", [])) if n_probs else None}
               for i, r in enumerate(results)]
    return {**meta, "choices": choices, "usage": usage(results, body.n),
            "timings": results[0]["timings"]}


def _one_stream(body, n_answers: int) -> None:
    if body.stream and n_answers > 1:
        raise ApiError(400, f"stream: {n_answers} answers (several prompts or n > 1) can only "
                            "be returned without streaming; send one request per stream")


@router.post("/apply-template")
async def apply_template(http: HttpRequest):
    """llama-server's POST /apply-template: a chat request's messages rendered by the model's
    template, as the prompt the chat endpoint would generate from ({"prompt": text})."""
    state = _state(http)
    engine, _ = state.ready()
    body: ChatBody = parse_body(await read_body(http, state), ChatBody)
    return {"prompt": await off_loop(chat_text, engine, body, state.settings.reasoning)}


@router.post("/chat/completions/input_tokens")
@router.post("/v1/chat/completions/input_tokens")
async def chat_input_tokens(http: HttpRequest):
    """How many tokens a chat request's prompt has (its messages rendered by the template)."""
    state = _state(http)
    engine, _ = state.ready()
    body: ChatBody = parse_body(await read_body(http, state), ChatBody)
    return {"input_tokens": len(await off_loop(chat_ids, engine, body,
                                               state.settings.reasoning,
                                               state.settings.media_path))}


@dataclass(slots=True)
class ChatRun:
    """A chat request submitted: its jobs (one per answer), how its tools apply, whether its
    answer opens inside a thought (the template ended the prompt with <think>), its prompt."""

    jobs: list[Job]
    plan: tools.ToolPlan
    thinking: bool
    ids: list[int]
    reasoning_format: str = "auto"  # --reasoning-format, or the request's

    def answer(self, text: str) -> answer.Answer:
        """A finished answer split into thinking, content and tool calls."""
        return answer.of(text, self.plan, self.thinking, self.reasoning_format)

    def stream(self) -> answer.AnswerStream:
        return answer.AnswerStream(self.plan, self.thinking, self.reasoning_format)


async def run_chat(state: ServerState, body: ChatBody) -> ChatRun:
    """Everything a chat-shaped request (OpenAI chat, Anthropic Messages, OpenAI Responses)
    does before it waits: the prompt rendered, the tools planned (a grammar where a call must
    come or may start), the constraints checked, the jobs queued."""
    engine, _ = state.ready()
    ids = await off_loop(chat_ids, engine, body, state.settings.reasoning,
                         state.settings.media_path)
    n_probs = (body.top_logprobs or 1) if body.logprobs else 0
    n_predict = n_predict_of(body.max_completion_tokens, body.max_tokens, body.n_predict)
    _one_stream(body, body.n)
    calls = await off_loop(tools.plan, engine, body)
    shaped = await off_loop(constraints_of, engine, body)
    if calls.grammar is not None:  # a call must come (required, a named function) or may start
        shaped = (calls.grammar, shaped[1])
    reqs = [build_request(engine, body, ids, n_predict, n_probs, state.settings.sampling,
                          constraints=shaped) for _ in range(body.n)]
    jobs = submit(state, reqs, body.stream, body.return_progress)
    thinking = answer.opens_thought(engine.tok.decode(ids[-4:]) if ids else "")
    return ChatRun(jobs, calls, thinking, ids,
                   body.reasoning_format or state.settings.reasoning_format)


@router.post("/v1/chat/completions")
@router.post("/chat/completions")
async def chat_completions(http: HttpRequest):
    state = _state(http)
    engine, _ = state.ready()
    body: ChatBody = parse_body(await read_body(http, state), ChatBody)
    run = await run_chat(state, body)
    meta = _meta(state, "chatcmpl", "chat.completion")
    if body.stream:
        meta["object"] = "chat.completion.chunk"
        return await sse_response(http, state, run.jobs[0], _chat_chunks(state, meta, body, run))
    results = await wait_results(http, state, run.jobs)
    choices = []
    for i, r in enumerate(results):
        ans = run.answer(r["content"])
        choices.append({"index": i, "message": ans.message(),
                        "finish_reason": ans.finish_reason(r["stop_type"]),
                        "logprobs": _chat_logprobs(r, body) if body.logprobs else None})
    out = {**meta, "choices": choices, "usage": usage(results, body.n),
           "timings": results[0]["timings"]}
    if body.verbose or state.settings.verbose:  # llama-server's debugging view
        out["__verbose"] = {**results[0], "prompt": prompt_text(engine.tok, run.ids)}
    return out


def finish_reason(result: dict) -> str:
    return "length" if result["stop_type"] == "limit" else "stop"


def usage(results: dict | list[dict], n: int = 1) -> dict:
    """OpenAI's usage: each prompt's tokens once (n answers share one), every answer's."""
    results = results if isinstance(results, list) else [results]
    p = sum(r["tokens_evaluated"] for r in results[::n])
    c = sum(r["tokens_predicted"] for r in results)
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}


def _meta(state: ServerState, prefix: str, obj: str) -> dict:
    return {"id": f"{prefix}-{uuid.uuid4().hex}", "object": obj, "created": int(time.time()),
            "model": state.model_name, "system_fingerprint": FINGERPRINT}


def _text_chunks(state: ServerState, meta: dict, n_probs: int):
    offset = 0

    def render(event: Delta | Progress | Done) -> list[dict | str]:
        nonlocal offset
        if isinstance(event, Progress):
            return []
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


def _chat_chunks(state: ServerState, meta: dict, body: ChatBody, run: ChatRun):
    """OpenAI's chat stream as llama-server sends it: a first chunk naming the role (content
    null), a chunk per piece of text (reasoning_content for a thought), the finish-reason
    chunk (empty delta), then, unless stream_options.include_usage is false, a chunk with no
    choices carrying usage and timings, and [DONE]. A tool call comes as OpenAI's tool_calls
    deltas while it is generated: its index, id and name once the name is complete, then its
    arguments piece by piece; the finish reason is then "tool_calls"."""
    started = False
    parts = run.stream()
    include_usage = (body.stream_options or {}).get("include_usage", True) is not False

    def render(event: Delta | Progress | Done) -> list[dict | str]:
        nonlocal started
        out: list[dict | str] = []
        if isinstance(event, Progress):  # llama-server: a role chunk carrying the progress
            started = True
            role = _chat_chunk(meta, {"role": "assistant", "content": None})
            return [{**role, "prompt_progress": event.as_dict()}]
        if not started:  # OpenAI's first chunk names the role
            started = True
            out.append(_chat_chunk(meta, {"role": "assistant", "content": None}))
        if isinstance(event, Delta):
            deltas = [_part_delta(p) for p in parts.feed(event.text)
                      if not isinstance(p, answer.CallEnd)]
            extra = body.logprobs and event.logprobs or body.return_tokens and event.tokens
            if extra or body.timings_per_token and event.timings is not None:
                deltas = deltas or [{"content": ""}]
            for i, delta in enumerate(deltas):
                out.append(_chat_chunk(meta, delta))
                if i == len(deltas) - 1:
                    _token_fields(out[-1], state, body, event)
            return out
        r = event.result
        out += [_chat_chunk(meta, _part_delta(p)) for p in parts.finish()
                if not isinstance(p, answer.CallEnd)]
        out.append(_chat_chunk(meta, {}, parts.answer().finish_reason(r["stop_type"])))
        if include_usage:
            out.append({**meta, "choices": [], "usage": usage(r), "timings": r["timings"]})
        out.append("[DONE]")
        return out

    return render


def _part_delta(part: answer.Part) -> dict:
    """One part of the answer as a chat delta."""
    if isinstance(part, answer.Text):
        return {"content": part.text}
    if isinstance(part, answer.Thinking):
        return {"reasoning_content": part.text}
    if isinstance(part, answer.CallStart):
        return {"tool_calls": [{"index": part.index, "id": part.id, "type": "function",
                                "function": {"name": part.name, "arguments": ""}}]}
    if isinstance(part, answer.CallArgs):
        return {"tool_calls": [{"index": part.index, "function": {"arguments": part.delta}}]}
    raise TypeError(f"no chat delta for {part!r}")  # CallEnd: nothing more to send


def _token_fields(chunk: dict, state: ServerState, body: ChatBody, event: Delta) -> None:
    """The fields a chunk carries beside its delta when asked: logprobs, timings, and
    Tandem's tokens, pieces and origins."""
    if body.logprobs:
        chunk["choices"][0]["logprobs"] = {"content": _chat_entries(
            probabilities(state.engine, event.logprobs), body)}
    if body.timings_per_token and event.timings is not None:
        chunk["timings"] = event.timings
    if body.return_tokens:  # Tandem's: each token, its text and its proposer
        chunk.update(tokens=event.tokens, pieces=event.pieces, origins=event.origins)


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
