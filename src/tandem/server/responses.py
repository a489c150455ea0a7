"""OpenAI's Responses API as llama-server serves it: POST /v1/responses (and /responses), and
/v1/responses/input_tokens.

A request is turned into a chat request (ChatBody) and runs the chat path (oai.run_chat):
`instructions` becomes a system message first; `input` is a string (one user message) or a
list of items: messages (system, developer, user, assistant; content a string or
input_text / output_text / input_image parts), `function_call` items (an assistant's call,
merged into the assistant message before it) and `function_call_output` items (a tool
message, whose call_id must answer a function_call earlier in the input); `reasoning` items
are accepted and left out (the template renders no earlier thoughts). `tools` are the
Responses API's flat functions ({"type": "function", "name", "parameters"}; other tool types
are skipped, as llama-server does), `tool_choice` auto | none | required | {"type":
"function", "name"}, `max_output_tokens` the answer's limit, `text.format` its structure
(json_schema / json_object); the sampling fields and llama-server's extras
(timings_per_token, return_progress, speculative.*) pass through.

The answer is a `response` object: a `reasoning` item when the model thought, a `message`
item with the text (output_text), a `function_call` item per call; status "incomplete" with
incomplete_details when max_output_tokens cut it; usage in the Responses API's names; and
llama-server's `timings`. Streamed (`stream: true`), the events are typed (`event: <type>`,
the data's "type" the same, each with its sequence_number): response.created and
response.in_progress first (again with prompt_progress under return_progress), then per item
output_item.added, its deltas as they are generated (output_text.delta, reasoning_text.delta,
function_call_arguments.delta; with timings under timings_per_token), its .done events and
output_item.done, and last response.completed with the whole response (status "incomplete"
when cut, as in the plain answer) and the timings.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from fastapi import APIRouter, Request as HttpRequest
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .answer import CallArgs, CallEnd, CallStart, Text, Thinking
from .jobs import off_loop, read_body, sse_response, wait_results
from .oai import ChatRun, run_chat
from .prepare import chat_ids
from .schemas import ApiError, ChatBody, describe, json_object
from .state import ServerState
from .worker import Delta, Done, Progress

router = APIRouter()

# the Responses API's own fields (converted below) and chat fields it has no use for
_NOT_CHAT = ("input", "instructions", "tools", "tool_choice", "max_output_tokens", "text",
             "reasoning", "messages", "max_tokens", "max_completion_tokens", "n", "logprobs",
             "top_logprobs", "stream_options", "previous_response_id", "include", "store",
             "metadata", "truncation", "user", "background", "prompt", "conversation")


def _bad(where: str, what: str) -> ApiError:
    return ApiError(400, f"invalid request: {where}: {what}")


# ---- the request: Responses -> chat -------------------------------------------------------------


def to_chat(data: dict) -> dict:
    """A Responses request as an OpenAI chat request (the dict ChatBody reads); every
    problem is a 400 naming the Responses field."""
    if data.get("previous_response_id"):
        raise _bad("previous_response_id", "this server keeps no responses; send the whole "
                                           "conversation in input")
    if "input" not in data:
        raise _bad("input", "required (a string or a list of items)")
    chat = {k: v for k, v in data.items() if k not in _NOT_CHAT}
    messages: list[dict] = []
    if data.get("instructions") is not None:
        if not isinstance(data["instructions"], str):
            raise _bad("instructions", "expected a string")
        messages.append({"role": "system", "content": data["instructions"]})
    value = data["input"]
    if isinstance(value, str):
        messages.append({"role": "user", "content": value})
    elif isinstance(value, list):
        messages += input_messages(value)
    else:
        raise _bad("input", "expected a string or a list of items")
    if not messages:
        raise _bad("input", "no message to answer; give at least one")
    chat["messages"] = messages
    if data.get("tools") is not None:
        chat["tools"] = _tools(data["tools"])
    if data.get("tool_choice") is not None:
        chat["tool_choice"] = _tool_choice(data["tool_choice"])
    if data.get("max_output_tokens") is not None:
        limit = data["max_output_tokens"]
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise _bad("max_output_tokens", f"expected a positive integer, got "
                                            f"{json.dumps(limit)[:40]}")
        chat["max_tokens"] = limit
    fmt = (data.get("text") or {}).get("format") if isinstance(data.get("text"), dict) else None
    if fmt is not None:
        chat["response_format"] = _text_format(fmt)
    return chat


def input_messages(items: list) -> list[dict]:
    """The input items as chat messages: an assistant's text and calls in a row become one
    assistant message; a call's output a tool message."""
    messages: list[dict] = []
    calls: set[str] = set()
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise _bad(where, "expected an object (a message, function_call or "
                              "function_call_output item)")
        kind = item.get("type", "message" if "role" in item else None)
        last = messages[-1] if messages and messages[-1]["role"] == "assistant" else None
        if kind == "message":
            msg = _message(item, where)
            if msg["role"] == "assistant" and last is not None:
                last["content"] = (last.get("content") or "") + msg["content"]
            else:
                messages.append(msg)
        elif kind == "function_call":
            call = _call(item, where)
            calls.add(call["id"])
            if last is None:
                last = {"role": "assistant", "content": None}
                messages.append(last)
            last.setdefault("tool_calls", []).append(call)
        elif kind == "function_call_output":
            messages.append(_call_output(item, where, calls))
        elif kind == "reasoning":
            continue  # earlier thoughts: the templates render none
        else:
            raise _bad(where, f"unsupported item type {json.dumps(kind)[:40]}; expected "
                              "message, function_call, function_call_output or reasoning")
    return messages


_ROLES = ("system", "developer", "user", "assistant")


def _message(item: dict, where: str) -> dict:
    role = item.get("role")
    if role not in _ROLES:
        raise _bad(f"{where}.role", f"expected one of {', '.join(_ROLES)}, got "
                                    f"{json.dumps(role)[:40]}")
    content = item.get("content")
    if isinstance(content, str):
        return {"role": role, "content": content}
    if not isinstance(content, list):
        raise _bad(f"{where}.content", "expected a string or a list of content parts")
    parts = [_part(p, role, f"{where}.content[{j}]") for j, p in enumerate(content)]
    if role == "assistant":  # the template renders an assistant's text
        return {"role": role, "content": "".join(p["text"] for p in parts)}
    return {"role": role, "content": parts}


def _part(part: Any, role: str, where: str) -> dict:
    kind = part.get("type") if isinstance(part, dict) else None
    if kind in ("input_text", "output_text") and isinstance(part.get("text"), str):
        return {"type": "text", "text": part["text"]}
    if kind == "refusal" and role == "assistant" and isinstance(part.get("refusal"), str):
        return {"type": "text", "text": part["refusal"]}
    if kind == "input_image" and role != "assistant":
        url = part.get("image_url")
        if not isinstance(url, str):
            what = "file_id images are not supported (no stored files); " \
                if part.get("file_id") else ""
            raise _bad(where, f"{what}an input_image needs image_url (a data: URI or a URL)")
        return {"type": "image_url", "image_url": {"url": url}}
    if kind == "input_file":
        raise _bad(where, "input_file is not supported")
    allowed = "output_text or refusal" if role == "assistant" else \
        "input_text or input_image"
    raise _bad(where, f"expected a content part of type {allowed} with its text, got "
                      f"{json.dumps(part)[:60]}")


def _call(item: dict, where: str) -> dict:
    for field in ("call_id", "name"):
        if not isinstance(item.get(field), str) or not item[field]:
            raise _bad(f"{where}.{field}", "expected a non-empty string")
    args = item.get("arguments", "{}")
    if isinstance(args, dict):
        args = json.dumps(args, ensure_ascii=False)
    if not isinstance(args, str):
        raise _bad(f"{where}.arguments", "expected the arguments as a JSON string")
    return {"id": item["call_id"], "type": "function",
            "function": {"name": item["name"], "arguments": args}}


def _call_output(item: dict, where: str, calls: set[str]) -> dict:
    call_id = item.get("call_id")
    if not isinstance(call_id, str) or call_id not in calls:
        raise _bad(f"{where}.call_id", f"{json.dumps(call_id)[:60]} answers no function_call "
                                       "earlier in input; send the call before its output")
    out = item.get("output")
    if isinstance(out, list):
        parts = [_part(p, "tool", f"{where}.output[{j}]") for j, p in enumerate(out)]
        if any(p["type"] != "text" for p in parts):
            raise _bad(f"{where}.output", "a function's output may hold text only")
        out = "".join(p["text"] for p in parts)
    if not isinstance(out, str):
        raise _bad(f"{where}.output", "expected a string or a list of input_text parts")
    return {"role": "tool", "tool_call_id": call_id, "content": out}


def _tools(tools: Any) -> list[dict]:
    """The flat function tools as chat's {"type": "function", "function": {...}} (chat's
    shape is taken as it is); other tool types are skipped, as llama-server does."""
    if not isinstance(tools, list):
        raise _bad("tools", "expected a list of tools")
    out = []
    for i, t in enumerate(tools):
        if not isinstance(t, dict):
            raise _bad(f"tools[{i}]", "expected an object")
        if t.get("type", "function") != "function":
            continue  # web_search, file_search...: nothing here runs them
        if isinstance(t.get("function"), dict):
            out.append(t)
            continue
        if not isinstance(t.get("name"), str) or not t["name"]:
            raise _bad(f"tools[{i}].name", "expected the function's name "
                                           "({\"type\": \"function\", \"name\", \"parameters\"})")
        fn = {k: v for k, v in t.items() if k != "type" and v is not None}
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(choice: Any) -> str | dict:
    if choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function":
        fn = choice.get("function")
        name = choice.get("name", fn.get("name") if isinstance(fn, dict) else None)
        if isinstance(name, str):
            return {"type": "function", "function": {"name": name}}
    raise _bad("tool_choice", "expected \"auto\", \"none\", \"required\" or {\"type\": "
                              f"\"function\", \"name\": ...}}, got {json.dumps(choice)[:80]}")


def _text_format(fmt: Any) -> dict:
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "json_schema":
        if not isinstance(fmt.get("schema"), dict):
            raise _bad("text.format.schema", "expected a JSON schema")
        return {"type": "json_schema", "json_schema": {"name": fmt.get("name", "answer"),
                                                       "schema": fmt["schema"]}}
    if kind in ("text", "json_object"):
        return {"type": kind}
    raise _bad("text.format", "expected type text, json_object or json_schema, got "
                              f"{json.dumps(fmt)[:60]}")


class ResponsesBody(BaseModel):
    """The request's top-level fields, type-checked before to_chat reads the items (also the
    body /openapi.json describes); the sampling and llama-server's fields are ChatBody's."""

    model_config = ConfigDict(extra="allow", strict=True)
    model: str | None = None
    input: str | list[Any]  # the items: to_chat checks each, naming input[i]
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    parallel_tool_calls: bool | None = None
    stream: bool = False
    text: dict[str, Any] | None = None
    previous_response_id: str | None = None


def chat_body(data: dict) -> ChatBody:
    try:
        ResponsesBody.model_validate(data)
    except ValidationError as e:
        raise ApiError(400, describe(e)) from None
    try:
        return ChatBody.model_validate(to_chat(data))
    except ValidationError as e:
        raise ApiError(400, describe(e).replace("max_tokens", "max_output_tokens")) from None


# ---- the answer -------------------------------------------------------------------------------


def _new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def _meta(state: ServerState, data: dict, chat: ChatBody) -> dict:
    """The response's fields that do not depend on the answer: its id and the request echoed,
    as OpenAI's response object has them."""
    return {"id": _new_id("resp"), "object": "response", "created_at": int(time.time()),
            "model": state.model_name, "instructions": data.get("instructions"),
            "max_output_tokens": data.get("max_output_tokens"),
            "parallel_tool_calls": chat.parallel_tool_calls is True,
            "previous_response_id": None, "reasoning": {"effort": None, "summary": None},
            "store": False, "temperature": data.get("temperature"),
            "text": {"format": {"type": "text"}} if not isinstance(data.get("text"), dict)
            else data["text"], "tool_choice": data.get("tool_choice", "auto"),
            "tools": data.get("tools") or [], "top_p": data.get("top_p"),
            "truncation": "disabled", "metadata": data.get("metadata") or {}, "user": None}


def _response(meta: dict, output: list[dict], result: dict | None = None,
              reasoning_tokens: int = 0) -> dict:
    """The response object: in progress (no result yet), or finished with its usage."""
    if result is None:
        return {**meta, "status": "in_progress", "error": None, "incomplete_details": None,
                "output": output, "usage": None}
    cut = result["stop_type"] == "limit"
    p, c = result["tokens_evaluated"], result["tokens_predicted"]
    usage = {"input_tokens": p,
             "input_tokens_details": {"cached_tokens": result["timings"].get("cache_n", 0)},
             "output_tokens": c, "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
             "total_tokens": p + c}
    if cut and output:  # the item the limit cut short
        output = [*output[:-1], {**output[-1], "status": "incomplete"}]
    return {**meta, "status": "incomplete" if cut else "completed",
            "completed_at": None if cut else int(time.time()), "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
            "output": output, "usage": usage}


def _reasoning_item(id_: str, text: str | None, status: str) -> dict:
    content = [] if text is None else [{"type": "reasoning_text", "text": text}]
    return {"id": id_, "type": "reasoning", "summary": [], "content": content,
            "encrypted_content": None, "status": status}


def _text_part(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _message_item(id_: str, text: str | None, status: str) -> dict:
    return {"id": id_, "type": "message", "role": "assistant", "status": status,
            "content": [] if text is None else [_text_part(text)]}


def _call_item(call_id: str, name: str, arguments: str, status: str) -> dict:
    return {"id": "fc_" + call_id.removeprefix("call_"), "type": "function_call",
            "call_id": call_id, "name": name, "arguments": arguments, "status": status}


def _output(run: ChatRun, text: str) -> tuple[list[dict], str | None]:
    """A finished answer's output items (reasoning, message, calls) and its reasoning."""
    ans = run.answer(text)
    out = []
    if ans.reasoning:
        out.append(_reasoning_item(_new_id("rs"), ans.reasoning, "completed"))
    if ans.content or not ans.calls:
        out.append(_message_item(_new_id("msg"), ans.content or "", "completed"))
    out += [_call_item(c["id"], c["function"]["name"], c["function"]["arguments"], "completed")
            for c in ans.calls]
    return out, ans.reasoning


def _count(state: ServerState, text: str | None) -> int:
    return len(state.engine.tok.encode(text, add_special=False)) if text else 0


@router.post("/v1/responses")
@router.post("/responses")
async def responses(http: HttpRequest):
    state: ServerState = http.app.state.tandem
    state.ready()
    data = json_object(await read_body(http, state))
    chat = chat_body(data)
    run = await run_chat(state, chat)
    meta = _meta(state, data, chat)
    if chat.stream:
        events = _Events(state, meta, chat, run)
        return await sse_response(http, state, run.jobs[0], events.render, failed=events.error)
    result = (await wait_results(http, state, run.jobs))[0]
    output, reasoning = _output(run, result["content"])
    return {**_response(meta, output, result, _count(state, reasoning)),
            "timings": result["timings"]}


@router.post("/v1/responses/input_tokens")
@router.post("/responses/input_tokens")
async def input_tokens(http: HttpRequest):
    """How many tokens the request's prompt has (its input rendered by the template)."""
    state: ServerState = http.app.state.tandem
    engine, _ = state.ready()
    chat = chat_body(json_object(await read_body(http, state)))
    ids = await off_loop(chat_ids, engine, chat, state.settings.reasoning,
                         state.settings.media_path)
    return {"object": "response.input_tokens", "input_tokens": len(ids)}


# ---- the stream -------------------------------------------------------------------------------


class _Events:
    """The typed events of one streamed response: each output item opened when its first
    part comes (a change of kind closes the one before), its deltas as they come."""

    def __init__(self, state: ServerState, meta: dict, chat: ChatBody, run: ChatRun) -> None:
        self.state, self.meta, self.chat = state, meta, chat
        self.parts = run.stream()
        self.seq = 0
        self.output: list[dict] = []
        self.open: int | None = None  # the index of the item still receiving parts
        self.started = False
        self.cut = False  # the limit ended the answer: the item open then is incomplete

    def event(self, type_: str, **fields: Any) -> tuple[str, dict]:
        data = {"type": type_, "sequence_number": self.seq, **fields}
        self.seq += 1
        return type_, data

    def render(self, event: Delta | Progress | Done) -> list[tuple[str, dict]]:
        out = []
        if not self.started:
            self.started = True
            out += [self.event(t, response=_response(self.meta, []))
                    for t in ("response.created", "response.in_progress")]
            if isinstance(event, Progress):
                out[-1][1]["prompt_progress"] = event.as_dict()
                return out
        if isinstance(event, Progress):
            return [self.event("response.in_progress", response=_response(self.meta, []),
                               prompt_progress=event.as_dict())]
        if isinstance(event, Delta):
            added = [e for p in self.parts.feed(event.text) for e in self._part(p)]
            if added and self.chat.timings_per_token and event.timings is not None:
                added[-1][1]["timings"] = event.timings
            return out + added
        return out + self._finish(event.result)

    def _finish(self, result: dict) -> list[tuple[str, dict]]:
        self.cut = result["stop_type"] == "limit"
        out = [e for p in self.parts.finish() for e in self._part(p)]
        out += self._close()
        if not self.output:  # an empty answer is an empty message, as without streaming
            out += self._start("message") + self._close()
        reasoning = "".join(i["content"][0]["text"] for i in self.output
                            if i["type"] == "reasoning" and i["content"])
        response = _response(self.meta, self.output, result, _count(self.state, reasoning))
        return out + [self.event("response.completed", response=response,
                                 timings=result["timings"])]

    def error(self, e: ApiError) -> tuple[str, dict]:
        """A failure mid-stream: OpenAI's error event, with the error object too (the openai
        package raises it)."""
        return self.event("error", code=e.type, message=e.message, param=None,
                          error=e.body()["error"])

    def _part(self, p) -> list[tuple[str, dict]]:
        if isinstance(p, (Text, Thinking)):
            if not p.text:
                return []
            kind = "message" if isinstance(p, Text) else "reasoning"
            out = [] if self._current(kind) else self._start(kind)
            item, at = self.output[self.open], self.open
            item["content"][0]["text"] += p.text
            name = "output_text" if kind == "message" else "reasoning_text"
            more = {"logprobs": []} if kind == "message" else {}
            return out + [self.event(f"response.{name}.delta", item_id=item["id"],
                                     output_index=at, content_index=0, delta=p.text, **more)]
        if isinstance(p, CallStart):
            out = self._close()
            self.output.append(_call_item(p.id, p.name, "", "in_progress"))
            self.open = len(self.output) - 1
            return out + [self.event("response.output_item.added", output_index=self.open,
                                     item=dict(self.output[-1]))]
        if isinstance(p, CallArgs) and self._current("function_call"):
            item = self.output[self.open]
            item["arguments"] += p.delta
            return [self.event("response.function_call_arguments.delta", item_id=item["id"],
                               output_index=self.open, delta=p.delta)]
        if isinstance(p, CallEnd):  # a call whose start was not seen comes whole
            out = [] if self._current("function_call") else \
                self._part(CallStart(p.index, p.id, p.name))
            self.output[self.open]["arguments"] = p.arguments
            return out + self._close()
        return []

    def _current(self, kind: str) -> bool:
        return self.open is not None and self.output[self.open]["type"] == kind

    def _start(self, kind: str) -> list[tuple[str, dict]]:
        out = self._close()
        if kind == "message":
            item = _message_item(_new_id("msg"), None, "in_progress")
        else:
            item = _reasoning_item(_new_id("rs"), None, "in_progress")
        self.output.append(item)
        self.open = at = len(self.output) - 1
        out.append(self.event("response.output_item.added", output_index=at,
                              item=json.loads(json.dumps(item))))
        if kind == "message":
            out.append(self.event("response.content_part.added", item_id=item["id"],
                                  output_index=at, content_index=0, part=_text_part("")))
            item["content"].append(_text_part(""))
        else:
            item["content"].append({"type": "reasoning_text", "text": ""})
        return out

    def _close(self) -> list[tuple[str, dict]]:
        """The open item's .done events."""
        if self.open is None:
            return []
        at, item = self.open, self.output[self.open]
        self.open = None
        item["status"] = "incomplete" if self.cut else "completed"
        ids = {"item_id": item["id"], "output_index": at}
        out = []
        if item["type"] == "message":
            part = item["content"][0]
            out += [self.event("response.output_text.done", **ids, content_index=0,
                               text=part["text"], logprobs=[]),
                    self.event("response.content_part.done", **ids, content_index=0,
                               part=dict(part))]
        elif item["type"] == "reasoning":
            out.append(self.event("response.reasoning_text.done", **ids, content_index=0,
                                  text=item["content"][0]["text"]))
        else:
            out.append(self.event("response.function_call_arguments.done", **ids,
                                  name=item["name"], arguments=item["arguments"]))
        return out + [self.event("response.output_item.done", output_index=at,
                                 item=json.loads(json.dumps(item)))]
