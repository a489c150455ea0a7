"""Tool calls on the chat-shaped APIs: OpenAI's `tools` and `tool_choice` in, calls out.

The tools are rendered by the model's own chat template (its `tools` variable; Qwen2.5's and
Hermes' templates list them in the system turn). A template that never mentions tools gets
them as a system message in Hermes' wording, as llama.cpp's generic handler does. Each family
answers a call in its own format (ToolFormat, from the template): Hermes/Qwen

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

Mistral `[TOOL_CALLS][{"name": ..., "arguments": ...}]`, Llama 3.x a bare
`{"name": ..., "parameters": ...}`. answer.py reads calls back as they stream.

tool_choice "auto" (the default) leaves the model free to answer or call, under a lazy
grammar: free text until the format's marker, from there a valid call to one of the tools, so
a call that starts always parses. The free text is the model's own (the grammar reads
characters: it only keeps out bytes that are not valid UTF-8). "required", or a named function, enforces a call from the
first token (several with parallel_tool_calls true; one by default, as llama-server). Under
either grammar the tag, the name and every key are forced tokens, drafted for free under
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


@dataclass(frozen=True, slots=True)
class ToolFormat:
    """How a model family writes a call: the marker it opens with ("" : the answer is one bare
    JSON object), the one that closes it, the key its arguments go under, whether the calls
    come as a JSON list."""

    name: str
    open: str
    close: str
    args_key: str = "arguments"
    array: bool = False
    args: str = ""  # the name is plain text up to this marker, the arguments' object follows

    @property
    def args_keys(self) -> tuple[str, ...]:
        return (self.args_key, "arguments", "parameters")


HERMES = ToolFormat("hermes", OPEN, CLOSE)  # Qwen2.5/3, Hermes, and any template without one
MISTRAL = ToolFormat("mistral", "[TOOL_CALLS]", "", array=True)  # Mistral 7B v0.3, Nemo
MISTRAL_ARGS = ToolFormat("mistral-args", "[TOOL_CALLS]", "", args="[ARGS]")  # Small 3.2, Devstral
LLAMA3 = ToolFormat("llama3", "", "", args_key="parameters")  # Llama 3.1-3.3's JSON calls


def format_of(template: str | None) -> ToolFormat:
    """The call format a chat template teaches its model (Hermes' when it teaches none: the
    tools are then described in Hermes' words, _FALLBACK)."""
    t = template or ""
    if "[TOOL_CALLS]" in t and "[ARGS]" in t:
        return MISTRAL_ARGS
    if "[TOOL_CALLS]" in t:
        return MISTRAL
    if OPEN in t:
        return HERMES
    if "Environment: ipython" in t and "<function=" not in t:  # not Functionary v3.1's
        return LLAMA3
    return HERMES


@dataclass(slots=True)
class ToolPlan:
    """What a chat request's tools mean for its prompt and output."""

    tools: list[dict]  # the tools as the template gets them (empty: none rendered)
    grammar: str | None  # a call must come (required, a named function) or, once started
    # (auto: the lazy grammar, free text until the format's marker), must be valid
    parse: bool  # the answer's calls become tool_calls
    format: ToolFormat = HERMES

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
    by_name = _schemas(tools)
    if choice == "none":
        return NO_TOOLS
    fmt = format_of(engine.tok.chat_template)
    if choice in ("auto", "required"):
        names = list(by_name)
    elif isinstance(choice, dict) and isinstance(choice.get("function"), dict) and \
            choice["function"].get("name") in by_name:
        names = [choice["function"]["name"]]
    else:
        raise ApiError(400, "invalid request: tool_choice: expected \"none\", \"auto\", "
                            "\"required\" or {\"type\": \"function\", \"function\": {\"name\": "
                            f"one of {sorted(by_name)}}}, got {json.dumps(choice)[:80]}")
    if not enforce:
        return ToolPlan(tools, None, True, fmt)
    # llama-server's default is one call; several where parallel_tool_calls is true
    several = body.parallel_tool_calls is True or choice == "auto"
    g = _calls_grammar(engine, {n: by_name[n] for n in names}, several, fmt,
                       lazy=choice == "auto")
    return ToolPlan(tools, g, True, fmt)


def _schemas(tools: list) -> dict[str, dict]:
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
    return by_name


def calls_lark(schemas: dict[str, dict], several: bool, vocab: set[str] | dict[str, int],
               fmt: ToolFormat = HERMES, lazy: bool = False) -> str:
    """A Lark grammar (llguidance's) for one (or, with several, one or more) calls in the
    format, each naming one of the functions with arguments valid for its parameters schema;
    markers are the vocabulary's special tokens where it has them (Qwen's <tool_call>,
    Mistral's [TOOL_CALLS]), else text. lazy: free text first (any text without the marker),
    the calls only once the model writes the marker (tool_choice auto), as llama.cpp's lazy
    grammars; a format with no marker (Llama 3.x) then allows either one call or an answer
    that does not start with '{'."""
    one = [{"type": "object", "properties": {"name": {"const": name}, fmt.args_key: params},
            "required": ["name", fmt.args_key], "additionalProperties": False}
           for name, params in schemas.items()]
    schema = {**(one[0] if len(one) == 1 else {"anyOf": one}), "x-guidance": grammar.JSON_OPTIONS}
    tag = {t: _token(t, vocab) for t in (fmt.open, fmt.close, fmt.args) if t}
    lines = [f"body: %json {json.dumps(schema)}"]
    if fmt.args:  # name[ARGS]{arguments}: one alternative per tool
        lines = ["body: " + " | ".join(
            f"{json.dumps(name)} {tag[fmt.args]} %json "
            f"{json.dumps({**params, 'x-guidance': grammar.JSON_OPTIONS})}"
            for name, params in schemas.items())]
        rest = "body"
    elif fmt.array:
        rest = '"[" body ("," " " body)* "]"' if several else '"[" body "]"'
    elif fmt.open:
        rest = f'"\\n" body "\\n" {tag[fmt.close]}'
    else:
        rest = "body"
    lines.append(f"rest: {rest}")
    many = several and not fmt.array  # a list holds its calls; tags come one after another
    if fmt.args:
        start_many = ' (call)*'
    else:
        start_many = ' ("\\n" call)*'

    repeat = ("*" if many else "?") if lazy else ""
    if not fmt.open:  # Llama 3.x: the answer is the call, or (lazy) text not starting with '{'
        start = 'start: rest | TEXT\nTEXT: /(?s:.*)/ & ~/\\s*\\{(?s:.*)/' if lazy else \
            "start: rest"
    elif fmt.open in vocab and not tag[fmt.open].startswith('"'):  # a special token: free
        # text can never hold it
        start = f"start: TEXT (call TEXT){repeat}\nTEXT: /(?s:.*)/" if lazy else \
            "start: call" + (start_many if many else "")
        lines.append(f"call: {tag[fmt.open]} rest")
    elif lazy:  # a text marker: text up to its first occurrence is one lexeme, then the call
        m = _regex_escape(fmt.open)
        more = "+" if many else ""
        start = (f"start: TEXT | (OPENED rest){more} TEXT\n"
                 f"TEXT: /(?s:.*)/ & ~/(?s:.*){m}(?s:.*)/\n"
                 f"OPENED: /(?s:.*){m}/ & ~/(?s:.*){m}(?s:.+)/")
    else:
        start = "start: call" + (start_many if many else "")
        lines.append(f"call: {tag[fmt.open]} rest")
    return "\n".join([start] + lines) + "\n"


def _token(text: str, vocab: set[str] | dict[str, int]) -> str:
    """A marker in the grammar: the special token where the vocabulary has it (<tool_call> by
    name, [TOOL_CALLS] by its id), else its text."""
    if text not in vocab:
        return json.dumps(text)
    if text.startswith("<") and text.endswith(">"):
        return text
    return f"<[{vocab[text]}]>" if isinstance(vocab, dict) else json.dumps(text)


def _regex_escape(text: str) -> str:
    return "".join("\\" + c if c in ".^$*+?()[]{}|\\/" else c for c in text)


def _calls_grammar(engine: Engine, schemas: dict[str, dict], several: bool,
                   fmt: ToolFormat = HERMES, lazy: bool = False) -> str:
    g = grammar.from_lark(calls_lark(schemas, several, engine.tok.ids, fmt, lazy))
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
