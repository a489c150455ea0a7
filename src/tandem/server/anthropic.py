"""Anthropic's Messages API, as llama-server serves it: POST /v1/messages (an answer, or
Anthropic's typed SSE stream) and POST /v1/messages/count_tokens ({"input_tokens": n}).

A request is checked here (strictly, every 400 naming the field as `messages[2].content[0]`)
and converted to Tandem's OpenAI chat body, then runs the chat path (oai.run_chat):

    system (string or text blocks)      -> a system message (blocks joined)
    user text / image blocks            -> a user message (images only with --mmproj)
    user tool_result blocks             -> a `tool` message each (before the user's text),
                                           answering a tool_use of an earlier message
    assistant text / tool_use blocks    -> an assistant message with OpenAI tool_calls
    assistant thinking blocks           -> its reasoning_content (the template keeps or drops
                                           it); redacted_thinking is dropped
    tools [{name, description, input_schema}], tool_choice auto | any | tool | none,
    stop_sequences, thinking (enabled / disabled: the template's enable_thinking), metadata
    (ignored); llama-server's and Tandem's sampling fields (top_k, min_p, seed,
    speculative.*, grammar, ...) pass through.

The answer is Anthropic's message: content blocks thinking (signature ""), text, tool_use
(input an object); stop_reason end_turn | max_tokens | stop_sequence | tool_use; usage
input_tokens (less those read from the cache), cache_read_input_tokens, output_tokens. A
stream is message_start, per block content_block_start / _delta (text_delta,
thinking_delta, input_json_delta as a call's arguments are generated) / _stop with
consecutive indices, message_delta (stop_reason, usage, and llama-server's `timings`, with
draft_n / draft_n_accepted when speculating), message_stop; a failure mid-stream is an
`error` event. As llama-server, the plain answer carries no `timings` unless
timings_per_token asks (then each content_block_delta has them too). Errors on these paths
are Anthropic's {"type": "error", "error": {"type", "message"}} (app.py), with the "code" every
Tandem error carries.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Request as HttpRequest
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from .answer import CallArgs, CallEnd, CallStart, Text, Thinking
from .images import NO_VISION
from .jobs import off_loop, read_body, sse_response, wait_results
from .oai import ChatRun, run_chat
from .prepare import chat_ids
from .schemas import ApiError, ChatBody, SamplingFields, describe, parse_body
from .state import ServerState
from .worker import Delta, Done, Progress

router = APIRouter()
PREFIX = "/v1/messages"

# Anthropic's error types by HTTP status
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error",
               403: "permission_error", 404: "not_found_error", 405: "invalid_request_error",
               408: "timeout_error", 413: "request_too_large", 429: "rate_limit_error",
               503: "overloaded_error", 529: "overloaded_error"}


def is_anthropic(path: str) -> bool:
    return path == PREFIX or path.startswith(PREFIX + "/")


def error_body(e: ApiError) -> dict:
    """An error in Anthropic's shape (with the status as "code", as every Tandem error)."""
    return {"type": "error", "error": {"type": ERROR_TYPES.get(e.status, "api_error"),
                                       "message": e.message, "code": e.status}}


# -- the request --------------------------------------------------------------------------------

class _Block(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)


class ImageSource(_Block):
    type: Literal["base64", "url"]
    media_type: str | None = None
    data: str | None = None
    url: str | None = None


class TextBlock(_Block):
    type: Literal["text"]
    text: str


class ImageBlock(_Block):
    type: Literal["image"]
    source: ImageSource


class ToolUseBlock(_Block):
    type: Literal["tool_use"]
    id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    input: dict[str, Any]


def _text_blocks(v: Any) -> Any:
    """A string where blocks may go: one text block."""
    return [{"type": "text", "text": v}] if isinstance(v, str) else v


class ToolResultBlock(_Block):
    type: Literal["tool_result"]
    tool_use_id: str
    content: list[Annotated[TextBlock | ImageBlock, Field(discriminator="type")]] = []
    is_error: bool = False  # accepted; the result's text says what went wrong

    _blocks = field_validator("content", mode="before")(_text_blocks)


class ThinkingBlock(_Block):
    type: Literal["thinking"]
    thinking: str
    signature: str | None = None


class RedactedThinkingBlock(_Block):
    type: Literal["redacted_thinking"]
    data: str | None = None


Block = Annotated[TextBlock | ImageBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock
                  | RedactedThinkingBlock, Field(discriminator="type")]
BLOCK_TYPES = ("text", "image", "tool_use", "tool_result", "thinking", "redacted_thinking")
USER_BLOCKS = ("text", "image", "tool_result")
ASSISTANT_BLOCKS = ("text", "tool_use", "thinking", "redacted_thinking")


class Message(_Block):
    role: Literal["user", "assistant"]
    content: list[Block]

    _blocks = field_validator("content", mode="before")(_text_blocks)


class Tool(_Block):
    name: str = Field(min_length=1)
    description: str | None = None
    input_schema: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})
    type: str | None = None  # "custom" or none: a client tool; Anthropic's server tools are not


class ToolChoice(_Block):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class ThinkingConfig(_Block):
    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = Field(None, ge=0)  # accepted; the thought is not cut


class CountBody(SamplingFields):
    """POST /v1/messages/count_tokens (and the fields of POST /v1/messages)."""

    model: str | None = None
    messages: list[Message] = Field(min_length=1)
    system: list[TextBlock] | None = None
    max_tokens: int | None = Field(None, ge=1)
    stop_sequences: list[str] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: ThinkingConfig | None = None
    metadata: dict[str, Any] | None = None
    chat_template_kwargs: dict[str, Any] = Field(default_factory=dict)

    _system = field_validator("system", mode="before")(_text_blocks)


class MessagesBody(CountBody):
    """POST /v1/messages: max_tokens is required, as Anthropic has it."""

    max_tokens: int = Field(ge=1)


def parse(raw: bytes, model: type[CountBody]) -> CountBody:
    """JSON bytes -> a checked body; a 400 naming the field, Anthropic's way
    (messages[2].content[0].tool_use_id)."""
    return parse_body(raw, model, _describe)


def _where(loc: tuple) -> str:
    out = ""
    for i, part in enumerate(loc):
        if isinstance(part, int):
            out += f"[{part}]"
        elif i and isinstance(loc[i - 1], int) and part in BLOCK_TYPES:
            continue  # the union's tag pydantic puts in the location
        else:
            out += f".{part}" if out else str(part)
    return out


def _describe(e: ValidationError) -> str:
    err = e.errors()[0]
    where = _where(err["loc"]) or "body"
    kind = err["type"]
    if kind == "union_tag_invalid":
        tag = json.dumps(err["ctx"].get("tag"))[:40]
        expected = err["ctx"].get("expected_tags", "")
        return f"invalid request: {where}: unknown block type {tag}; expected one of {expected}"
    if kind == "union_tag_not_found":
        return f"invalid request: {where}: a content block needs a \"type\""
    if kind == "missing":
        return f"invalid request: {where}: field required"
    if kind == "too_short" and where == "messages":
        return "invalid request: messages: empty; give at least one message"
    if kind == "model_attributes_type" and isinstance(err["loc"][-1], int):
        return (f"invalid request: {where}: expected a content block ({{\"type\": ...}}), got "
                f"{json.dumps(err['input'], default=str)[:60]}")
    if where.endswith(".content") and kind == "list_type":
        return (f"invalid request: {where}: expected a string or a list of content blocks, got "
                f"{json.dumps(err['input'], default=str)[:60]}")
    if len(err["loc"]) == 1:  # a top-level field: schemas' wording (and its hints)
        return describe(e)
    shown = json.dumps(err.get("input"), default=str)[:80]
    return f"invalid request: {where}: {err['msg']}, got {shown}"


# -- Anthropic -> OpenAI chat -------------------------------------------------------------------

_CCH = re.compile(r"^(x-anthropic-billing-header:.*?\bcch=)[0-9a-fA-F]{5};")


def _system_text(text: str) -> str:
    """Claude Code's system prompt opens with a billing header whose cch= stamp changes with
    every request; as llama-server, it is made constant so the prompt cache reaches past it."""
    return _CCH.sub(r"\1fffff;", text, count=1)


def to_chat(engine, body: CountBody) -> ChatBody:
    """The Anthropic request as Tandem's OpenAI chat body (every 400 naming Anthropic's field)."""
    messages: list[dict] = []
    if body.system:
        messages.append({"role": "system",
                         "content": "".join(_system_text(b.text) for b in body.system)})
    calls: set[str] = set()
    vision = getattr(engine, "vision", None) is not None
    for i, m in enumerate(body.messages):
        where = f"messages[{i}]"
        allowed = USER_BLOCKS if m.role == "user" else ASSISTANT_BLOCKS
        for j, b in enumerate(m.content):
            if b.type not in allowed:
                other = "an assistant" if m.role == "user" else "a user"
                raise ApiError(400, f"invalid request: {where}.content[{j}]: a {b.type} block "
                                    f"belongs in {other} message")
        if m.role == "user":
            messages += _user(m, where, calls, vision)
        else:
            messages.append(_assistant(m, calls))
    data: dict[str, Any] = {k: getattr(body, k) for k in SamplingFields.model_fields
                            if k in body.model_fields_set}
    if body.stop_sequences is not None:
        data["stop"] = body.stop_sequences
    data.update(model=body.model, messages=messages, max_tokens=body.max_tokens,
                chat_template_kwargs=dict(body.chat_template_kwargs))
    if body.thinking is not None:
        data["chat_template_kwargs"].setdefault("enable_thinking",
                                                body.thinking.type != "disabled")
    data.update(_tools(body))
    try:
        return ChatBody.model_validate(data)
    except ValidationError as e:
        raise ApiError(400, describe(e)) from None


def _user(m: Message, where: str, calls: set[str], vision: bool) -> list[dict]:
    """A user message's tool results (a `tool` message each, first), then its text and images."""
    tools, parts = [], []
    for j, b in enumerate(m.content):
        at = f"{where}.content[{j}]"
        if isinstance(b, TextBlock):
            parts.append({"type": "text", "text": b.text})
        elif isinstance(b, ImageBlock):
            parts.append(_image(b, at, vision))
        elif isinstance(b, ToolResultBlock):
            if b.tool_use_id not in calls:
                raise ApiError(400, f"invalid request: {at}.tool_use_id: "
                                    f"{json.dumps(b.tool_use_id)[:60]} answers no tool_use block "
                                    "of an earlier assistant message")
            inner = [{"type": "text", "text": c.text} if isinstance(c, TextBlock)
                     else _image(c, f"{at}.content[{k}]", vision)
                     for k, c in enumerate(b.content)]
            text_only = all(p["type"] == "text" for p in inner)
            tools.append({"role": "tool", "tool_call_id": b.tool_use_id,
                          "content": "".join(p["text"] for p in inner) if text_only else inner})
    if parts or not tools:
        tools.append({"role": "user", "content": parts})
    return tools


def _image(b: ImageBlock, at: str, vision: bool) -> dict:
    if not vision:
        raise ApiError(400, f"invalid request: {at}: {NO_VISION}")
    src = b.source
    if src.type == "base64":
        if not src.data:
            raise ApiError(400, f"invalid request: {at}.source.data: the image's base64 data "
                                "is required")
        url = f"data:{src.media_type or 'image/jpeg'};base64,{src.data}"
    else:
        if not src.url:
            raise ApiError(400, f"invalid request: {at}.source.url: the image's URL is required")
        url = src.url
    return {"type": "image_url", "image_url": {"url": url}}


def _assistant(m: Message, calls: set[str]) -> dict:
    text, thought, tool_calls = [], [], []
    for b in m.content:
        if isinstance(b, TextBlock):
            text.append(b.text)
        elif isinstance(b, ThinkingBlock):
            thought.append(b.thinking)
        elif isinstance(b, ToolUseBlock):
            calls.add(b.id)
            tool_calls.append({"id": b.id, "type": "function", "function": {
                "name": b.name, "arguments": json.dumps(b.input, ensure_ascii=False)}})
    out: dict[str, Any] = {"role": "assistant", "content": "".join(text)}
    if thought:  # the template shows it where it keeps earlier thoughts (Qwen3's), or not
        out["reasoning_content"] = "".join(thought)
    if tool_calls:
        out["tool_calls"] = tool_calls
    return out


def _tools(body: CountBody) -> dict:
    out: dict[str, Any] = {}
    if body.tools is not None:
        funcs = []
        for i, t in enumerate(body.tools):
            if t.type not in (None, "custom"):
                raise ApiError(400, f"invalid request: tools[{i}].type: {json.dumps(t.type)[:40]}"
                                    " is one of Anthropic's server tools, which this server "
                                    "does not run; give client tools {name, description, "
                                    "input_schema}")
            fn = {"name": t.name, "parameters": t.input_schema}
            if t.description is not None:
                fn["description"] = t.description
            funcs.append({"type": "function", "function": fn})
        out["tools"] = funcs
    choice = body.tool_choice
    if choice is None:
        return out
    names = [t.name for t in body.tools or []]
    if choice.type == "tool":
        if choice.name not in names:
            raise ApiError(400, f"invalid request: tool_choice.name: {json.dumps(choice.name)}"
                                f" is none of the tools ({', '.join(names) or 'none given'})")
        out["tool_choice"] = {"type": "function", "function": {"name": choice.name}}
    else:
        out["tool_choice"] = {"any": "required"}.get(choice.type, choice.type)
    if choice.disable_parallel_tool_use is not None:
        out["parallel_tool_calls"] = not choice.disable_parallel_tool_use
    return out


# -- the answer ---------------------------------------------------------------------------------

def _stop(result: dict, called: bool) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence) of a finished answer."""
    if result["stop_type"] == "limit":
        return "max_tokens", None
    if called:
        return "tool_use", None
    if result["stop_type"] == "word" and result.get("stopping_word"):
        return "stop_sequence", result["stopping_word"]
    return "end_turn", None


def _usage(n_prompt: int, cached: int, output: int) -> dict:
    return {"input_tokens": n_prompt - cached, "cache_read_input_tokens": cached,
            "output_tokens": output}


def _result_usage(result: dict) -> dict:
    return _usage(result["tokens_evaluated"], result["timings"].get("cache_n", 0),
                  result["tokens_predicted"])


def _input(arguments: str) -> dict:
    try:
        value = json.loads(arguments)
    except json.JSONDecodeError:
        return {}  # cut short (max_tokens): llama-server's empty input
    return value if isinstance(value, dict) else {}


def message(meta: dict, run: ChatRun, result: dict, with_timings: bool) -> dict:
    """The non-streamed answer: thinking, text, then each tool_use block."""
    ans = run.answer(result["content"])
    content: list[dict] = []
    if ans.reasoning:
        content.append({"type": "thinking", "thinking": ans.reasoning, "signature": ""})
    if ans.content:
        content.append({"type": "text", "text": ans.content})
    for c in ans.calls:
        fn = c["function"]
        content.append({"type": "tool_use", "id": c["id"], "name": fn["name"],
                        "input": _input(fn["arguments"])})
    reason, sequence = _stop(result, bool(ans.calls))
    out = {**meta, "content": content, "stop_reason": reason, "stop_sequence": sequence,
           "usage": _result_usage(result)}
    if with_timings:
        out["timings"] = result["timings"]
    return out


class _Events:
    """Anthropic's stream of one answer: the render sse_response calls per worker event."""

    def __init__(self, meta: dict, run: ChatRun, body: CountBody) -> None:
        self.meta, self.run, self.body = meta, run, body
        self.parts = run.stream()
        self.started = False
        self.index = -1  # the current block's
        self.open: str | None = None  # its kind: thinking | text | tool_use
        self.blank = ""  # the text's trailing whitespace, held (dropped before a call)
        self.called = False

    def __call__(self, event: Delta | Progress | Done) -> list[tuple[str, dict]]:
        out: list[tuple[str, dict]] = []
        if not self.started:
            self.started = True
            out.append(self._start(event))
        if isinstance(event, Progress):
            if self.body.return_progress:  # llama-server's, as an event Anthropic's SDK skips
                out.append(("prompt_progress", {"type": "prompt_progress",
                                                "prompt_progress": event.as_dict()}))
            return out
        if isinstance(event, Delta):
            self._parts(self.parts.feed(event.text), out)
            if self.body.timings_per_token and event.timings is not None:
                for _, data in out:
                    if data["type"] == "content_block_delta":
                        data["timings"] = event.timings
            return out
        result = event.result
        self._parts(self.parts.finish(), out)
        if self.blank and not self.called:
            self._delta(out, "text", {"type": "text_delta", "text": self.blank})
        self._close(out)
        reason, sequence = _stop(result, self.called)
        out.append(("message_delta", {
            "type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence},
            "usage": _result_usage(result), "timings": result["timings"]}))
        out.append(("message_stop", {"type": "message_stop"}))
        return out

    def _start(self, event: Delta | Progress | Done) -> tuple[str, dict]:
        if isinstance(event, Progress):
            cached = event.cache
        else:
            timings = event.timings if isinstance(event, Delta) else event.result["timings"]
            cached = (timings or {}).get("cache_n", 0)
        return ("message_start", {"type": "message_start", "message": {
            **self.meta, "content": [], "stop_reason": None, "stop_sequence": None,
            "usage": _usage(len(self.run.ids), cached, 0)}})

    def _parts(self, parts: list, out: list) -> None:
        for p in parts:
            if isinstance(p, Thinking):
                self._delta(out, "thinking", {"type": "thinking_delta", "thinking": p.text})
            elif isinstance(p, Text):  # trailing blanks wait: a call may follow
                text = self.blank + p.text
                kept = text.rstrip()
                self.blank = text[len(kept):]
                if kept:
                    self._delta(out, "text", {"type": "text_delta", "text": kept})
            elif isinstance(p, CallStart):
                self.blank, self.called = "", True
                self._begin(out, "tool_use", {"type": "tool_use", "id": p.id, "name": p.name,
                                              "input": {}})
            elif isinstance(p, CallArgs) and self.open == "tool_use" and p.delta:
                out.append(self._block_delta({"type": "input_json_delta",
                                              "partial_json": p.delta}))
            elif isinstance(p, CallEnd):
                self._close(out)

    def _delta(self, out: list, kind: str, delta: dict) -> None:
        if self.open != kind:
            self._begin(out, kind, {"type": "text", "text": ""} if kind == "text" else
                        {"type": "thinking", "thinking": "", "signature": ""})
        out.append(self._block_delta(delta))

    def _block_delta(self, delta: dict) -> tuple[str, dict]:
        return ("content_block_delta", {"type": "content_block_delta", "index": self.index,
                                        "delta": delta})

    def _begin(self, out: list, kind: str, block: dict) -> None:
        self._close(out)
        self.index += 1
        self.open = kind
        out.append(("content_block_start", {"type": "content_block_start", "index": self.index,
                                            "content_block": block}))

    def _close(self, out: list) -> None:
        if self.open is None:
            return
        if self.open == "thinking":  # Anthropic's thinking block ends with its signature
            out.append(self._block_delta({"type": "signature_delta", "signature": ""}))
        out.append(("content_block_stop", {"type": "content_block_stop", "index": self.index}))
        self.open = None


# -- the routes ---------------------------------------------------------------------------------

def _state(http: HttpRequest) -> ServerState:
    return http.app.state.tandem


@router.post(PREFIX)
async def messages(http: HttpRequest):
    state = _state(http)
    engine, _ = state.ready()
    body = parse(await read_body(http, state), MessagesBody)
    run = await run_chat(state, await off_loop(to_chat, engine, body))
    meta = {"id": f"msg_{uuid.uuid4().hex[:24]}", "type": "message", "role": "assistant",
            "model": state.model_name}
    if body.stream:
        return await sse_response(http, state, run.jobs[0], _Events(meta, run, body),
                                  failed=lambda e: ("error", error_body(e)))
    result = (await wait_results(http, state, run.jobs))[0]
    return message(meta, run, result, body.timings_per_token)


@router.post(PREFIX + "/count_tokens")
async def count_tokens(http: HttpRequest):
    state = _state(http)
    engine, _ = state.ready()
    body = parse(await read_body(http, state), CountBody)
    chat = await off_loop(to_chat, engine, body)
    ids = await off_loop(chat_ids, engine, chat, state.settings.reasoning,
                         state.settings.media_path)
    return {"input_tokens": len(ids)}
