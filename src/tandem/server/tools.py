"""Tool calls on /v1/chat/completions: OpenAI's `tools` and `tool_choice` in, `tool_calls` out.

The tools are rendered by the model's own chat template (its `tools` variable; Qwen2.5's and
Hermes' templates list them in the system turn). A template that never mentions tools gets
them as a system message in the same Hermes wording, as llama.cpp's generic handler does. The
model answers a call as

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

which is parsed into OpenAI's `tool_calls` (the text outside the calls stays the content).
tool_choice "auto" (the default) leaves the model free; "required", or a named function,
enforces such a call (several with parallel_tool_calls true; one by default, as llama-server)
with a grammar: the tag, the name and every key are then forced tokens, drafted for free under
speculation. "none" leaves the tools out.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .. import grammar
from .schemas import ApiError

if TYPE_CHECKING:
    from ..engine import Engine
    from .schemas import ChatBody

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_FENCE = re.compile(r"```(?:json|xml)?[ \t]*\n(.*?)\n?```", re.DOTALL)
_CALL = re.compile(re.escape(OPEN) + r"\s*(.*?)\s*(?:" + re.escape(CLOSE) + r"|$)", re.DOTALL)
_FALLBACK = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    "{tools}\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    "{{\"name\": <function-name>, \"arguments\": <args-json-object>}}\n</tool_call>")


@dataclass(slots=True)
class ToolPlan:
    """What a chat request's tools mean for its prompt and output."""

    tools: list[dict]  # the tools as the template gets them (empty: none rendered)
    grammar: str | None  # tool_choice "required" or a named function: the calls enforced
    parse: bool  # the answer's <tool_call> blocks become tool_calls

    @property
    def names(self) -> set[str]:
        return {t["function"]["name"] for t in self.tools}


NO_TOOLS = ToolPlan([], None, False)


def plan(engine: Engine, body: ChatBody, enforce: bool = True) -> ToolPlan:
    """Check `tools` and `tool_choice` and decide how they apply (400 naming the field);
    enforce False: without compiling the grammar (for rendering the prompt only)."""
    tools = body.tools or []
    choice = body.tool_choice if body.tool_choice is not None else "auto"
    if not tools:
        if choice not in ("auto", "none"):
            raise ApiError(400, "invalid request: tool_choice: a tool is required but no "
                                "tools were given")
        return NO_TOOLS
    by_name: dict[str, dict] = {}
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(t, dict) or t.get("type", "function") != "function" or \
                not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise ApiError(400, f"invalid request: tools[{i}]: expected {{\"type\": \"function\", "
                                "\"function\": {\"name\": string, \"parameters\": schema}}")
        params = fn.get("parameters", {"type": "object"})
        if not isinstance(params, dict):
            raise ApiError(400, f"invalid request: tools[{i}].function.parameters: expected a "
                                "JSON schema object")
        by_name[fn["name"]] = params
    if choice == "none":
        return NO_TOOLS
    if choice == "auto":
        return ToolPlan(tools, None, True)
    if choice == "required":
        names = list(by_name)
    elif isinstance(choice, dict) and isinstance(choice.get("function"), dict) and \
            choice["function"].get("name") in by_name:
        names = [choice["function"]["name"]]
    else:
        raise ApiError(400, "invalid request: tool_choice: expected \"none\", \"auto\", "
                            "\"required\" or {\"type\": \"function\", \"function\": {\"name\": "
                            f"one of {sorted(by_name)}}}, got {json.dumps(choice)[:80]}")
    if not enforce:
        return ToolPlan(tools, None, True)
    parallel = body.parallel_tool_calls is True  # llama-server's default: one call
    g = _calls_grammar(engine, {n: by_name[n] for n in names}, parallel and choice == "required")
    return ToolPlan(tools, g, True)


def calls_lark(schemas: dict[str, dict], several: bool, vocab: set[str]) -> str:
    """A Lark grammar (llguidance's) for one (or, with several, one or more) <tool_call> blocks
    naming one of the functions, with arguments valid for its parameters schema; the tags are
    the vocabulary's special tokens where it has them (Qwen's), else text."""
    one = [{"type": "object", "properties": {"name": {"const": name}, "arguments": params},
            "required": ["name", "arguments"], "additionalProperties": False}
           for name, params in schemas.items()]
    schema = {**(one[0] if len(one) == 1 else {"anyOf": one}), "x-guidance": grammar.JSON_OPTIONS}
    tag = {t: t if t in vocab else json.dumps(t) for t in (OPEN, CLOSE)}
    more = ' ("\\n" call)*' if several else ""  # several calls, one per line
    return (f"start: call{more}\n"
            f'call: {tag[OPEN]} "\\n" body "\\n" {tag[CLOSE]}\n'
            f"body: %json {json.dumps(schema)}\n")


def _calls_grammar(engine: Engine, schemas: dict[str, dict], several: bool) -> str:
    g = grammar.from_lark(calls_lark(schemas, several, set(engine.tok.tokens)))
    try:
        grammar.check(engine.tok, engine.target.args.vocab_size, g, "tools")
    except grammar.GrammarError as e:
        raise ApiError(400, f"invalid request: {e}") from None
    return g


def render_messages(messages: list[dict], tools: list[dict], template: str | None) -> list[dict]:
    """Messages for the template: an assistant's tool_calls with their arguments as objects
    (templates write them with tojson); tools described in a system message when the template
    has no place for them."""
    out = []
    for m in messages:
        calls = m.get("tool_calls")
        if calls:
            m = {**m, "tool_calls": [_call_for_template(c) for c in calls]}
        out.append(m)
    if tools and "tools" not in (template or ""):
        text = _FALLBACK.format(tools="\n".join(json.dumps(t) for t in tools))
        if out and out[0]["role"] == "system":
            out[0] = {**out[0], "content": f"{out[0].get('content') or ''}\n\n{text}"}
        else:
            out.insert(0, {"role": "system", "content": text})
    return out


def _call_for_template(call: dict) -> dict:
    fn = dict(call.get("function") or {})
    args = fn.get("arguments")
    if isinstance(args, str):
        try:
            fn["arguments"] = json.loads(args)
        except json.JSONDecodeError:
            pass  # kept as the text the client sent
    return {**call, "function": fn}


def parse(text: str, names: set[str] | None = None) -> tuple[str | None, list[dict]]:
    """(content, tool_calls) of an answer: each <tool_call> block holding a JSON object with a
    "name" becomes an OpenAI tool call (arguments as a JSON string). Given the offered tools'
    `names`, a fenced ```json block holding {"name": one of them, "arguments": ...} counts too:
    Qwen2.5-Coder answers so as often as with the tag (llama.cpp's Hermes parser takes both).
    What is not a valid call stays in the content."""
    found = [(m, m.group(1), False) for m in _CALL.finditer(text)]
    if names:
        found += [(m, m.group(1), True) for m in _FENCE.finditer(text)
                  if not any(a.start() <= m.start() < a.end() for a, _, _ in found)]
    calls: list[dict] = []
    kept: list[str] = []
    at = 0
    for m, body, fenced in sorted(found, key=lambda f: f[0].start()):
        try:
            obj = json.loads(body)
        except json.JSONDecodeError:
            continue
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or \
                fenced and (obj["name"] not in names or not {"arguments", "parameters"} & set(obj)):
            continue
        args = obj.get("arguments", obj.get("parameters", {}))
        kept.append(text[at: m.start()])
        at = m.end()
        calls.append({"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                      "function": {"name": obj["name"],
                                   "arguments": args if isinstance(args, str)
                                   else json.dumps(args, ensure_ascii=False)}})
    kept.append(text[at:])
    content = "".join(kept).strip()
    return (content or None) if calls else text, calls


class StreamHold:
    """Streamed text with tools: content is passed on until a call may begin (a <tool_call>
    tag, or a code fence when the tools' names are known); from there it is held, and the
    calls are sent as tool_calls deltas when the answer ends (held text that holds no call is
    sent then as content)."""

    def __init__(self, names: set[str] | None = None) -> None:
        self.names = names
        self.marks = (OPEN, "```") if names else (OPEN,)
        self.text = ""
        self.sent = 0
        self.holding = False

    def feed(self, piece: str) -> str:
        self.text += piece
        if self.holding:
            return ""
        hits = [i for i in (self.text.find(m, self.sent) for m in self.marks) if i >= 0]
        if hits:
            self.holding = True
            out, self.sent = self.text[self.sent: min(hits)], min(hits)
            return out
        keep = max((n for m in self.marks for n in range(min(len(m) - 1, len(self.text)), 0, -1)
                    if self.text.endswith(m[:n])), default=0)
        out = self.text[self.sent: len(self.text) - keep]
        self.sent = len(self.text) - keep
        return out

    def finish(self) -> tuple[str, list[dict]]:
        """(content not yet sent, tool calls) once the answer is complete."""
        rest = self.text[self.sent:]
        content, calls = parse(rest, self.names)
        if not calls:
            return rest, []
        return content or "", calls


def message(text: str, plan_: ToolPlan) -> tuple[dict, bool]:
    """The assistant message for a finished answer, and whether it calls tools."""
    if not plan_.parse:
        return {"role": "assistant", "content": text}, False
    content, calls = parse(text, plan_.names)
    if not calls:
        return {"role": "assistant", "content": text}, False
    return {"role": "assistant", "content": content, "tool_calls": calls}, True
