"""An assistant's answer, split as it streams into thinking, text and tool calls, for every
chat-shaped API (OpenAI chat, Anthropic Messages, OpenAI Responses).

    stream = AnswerStream(plan, thinking)     # plan: tools.ToolPlan; thinking: the prompt
    parts = stream.feed(piece)                #   ended inside a thought (<think>)
    parts += stream.finish()

Parts come in order: Thinking(text) and Text(text) pieces, and per tool call CallStart(index,
id, name) once its name is complete, CallArgs(index, delta) as its arguments are generated
(the deltas join to the arguments' JSON text), CallEnd(index, id, name, arguments) when the
call is closed. A call's text is read by a small JSON scanner in the model family's format
(tools.ToolFormat: Hermes/Qwen's <tool_call> tags, Mistral's [TOOL_CALLS] list or its newer
[TOOL_CALLS]name[ARGS]{...}, Llama 3.x's bare {"name", "parameters"} object), so arguments reach the client while they are generated.

Thinking is <think> ... </think> at the start of the answer (or from the start when the
template opened the thought), split out as llama-server's reasoning formats do (--reasoning-
format: auto and deepseek split it, deepseek-legacy also keeps it in the content, none leaves
it in the text). Text that may begin a marker (a tag, a code fence) is held back until
it is clear. A code fence holding {"name": a tool, "arguments": ...} (Qwen2.5-Coder answers so
as often as with the tag) is held to the end and parsed there, as is any call whose JSON turns
out invalid: what is not a call stays text.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field

from . import tools

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
FENCE = "```"


def opens_thought(prompt_tail: str) -> bool:
    """Whether a prompt ending so has the answer start inside a thought."""
    return prompt_tail.rstrip().endswith(THINK_OPEN)


@dataclass(slots=True)
class Text:
    text: str


@dataclass(slots=True)
class Thinking:
    text: str


@dataclass(slots=True)
class CallStart:
    index: int
    id: str
    name: str


@dataclass(slots=True)
class CallArgs:
    index: int
    delta: str


@dataclass(slots=True)
class CallEnd:
    index: int
    id: str
    name: str
    arguments: str


Part = Text | Thinking | CallStart | CallArgs | CallEnd


def call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


class _Scanner:
    """One tool call's JSON object, read character by character: its name once complete, its
    arguments' raw text as it comes. fail is set when the text is not such an object."""

    def __init__(self, fmt: tools.ToolFormat) -> None:
        self.fmt = fmt
        self.depth = 0
        self.in_str = self.esc = False
        self.expect = "open"  # open | key | colon | value | comma | done
        self.key = ""
        self.buf = ""  # the current key's or value's raw text
        self.in_value = False
        self.name: str | None = None
        self.args: str | None = None  # the arguments value's raw text, once complete
        self.args_live = ""  # ... while it comes
        self.fail = False

    @property
    def done(self) -> bool:
        return self.expect == "done"

    def feed(self, c: str) -> None:
        if self.fail or self.done:
            return
        if self.in_str:
            self.buf += c
            if self.esc:
                self.esc = False
            elif c == "\\":
                self.esc = True
            elif c == '"':
                self.in_str = False
                if not self.in_value:  # a key
                    self.key, self.expect = json.loads(self.buf), "colon"
                elif self.depth == 1:
                    self._end_value()
            self._live()
            return
        if self.in_value:
            self._in_value(c)
        elif c.isspace():
            pass
        elif self.expect == "open" and c == "{":
            self.depth, self.expect = 1, "key"
        elif self.expect == "key" and c == '"':
            self.in_str, self.buf = True, c
        elif self.expect == "colon" and c == ":":
            self.expect = "value"
        elif self.expect == "value":
            self.in_value, self.buf = True, ""
            self._in_value(c)
        elif self.expect == "comma" and c == ",":
            self.expect = "key"
        elif self.expect in ("comma", "key") and c == "}":
            self.depth, self.expect = 0, "done"
        else:
            self.fail = True

    def _in_value(self, c: str) -> None:
        if self.depth == 1 and c in ",}" and self.buf.strip():  # a scalar value ends
            self._end_value()
            self.feed(c)
            return
        self.buf += c
        if c == '"':
            self.in_str = True
        elif c in "{[":
            self.depth += 1
        elif c in "}]":
            self.depth -= 1
            if self.depth == 1:
                self._end_value()
            elif self.depth < 1:
                self.fail = True
        self._live()

    def _end_value(self) -> None:
        raw = self.buf.strip()
        self.in_value, self.expect = False, "comma"
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            self.fail = True
            return
        if self.key == "name" and isinstance(value, str):
            self.name = value
        elif self.key in self.fmt.args_keys and self.args is None:
            # arguments written as a JSON string holding the object: that text is the arguments
            self.args = value if isinstance(value, str) else raw

    def _live(self) -> None:
        if self.in_value and self.key in self.fmt.args_keys and self.args is None:
            self.args_live = self.buf.lstrip()


@dataclass
class Answer:
    """A finished answer: its thinking, its text, its tool calls (OpenAI's shape)."""

    content: str | None
    reasoning: str | None
    calls: list[dict] = field(default_factory=list)
    cut: bool = False  # the last call was cut off (its arguments incomplete)

    def finish_reason(self, stop_type: str) -> str:
        """OpenAI's finish reason: tool_calls when the answer's calls are complete."""
        if self.calls and not self.cut:
            return "tool_calls"
        return "length" if stop_type == "limit" else "stop"

    def message(self) -> dict:
        """OpenAI's assistant message (llama-server's reasoning_content when it thought)."""
        out: dict = {"role": "assistant", "content": self.content}
        if self.reasoning is not None:
            out["reasoning_content"] = self.reasoning
        if self.calls:
            out["tool_calls"] = self.calls
        return out


class AnswerStream:
    """The answer's parts as its text arrives (see the module's docstring)."""

    def __init__(self, plan: tools.ToolPlan, thinking: bool = False,
                 reasoning_format: str = "auto") -> None:
        self.plan = plan
        self.fmt = plan.format
        self.text = ""  # everything fed
        self.at = 0  # text[:at] has been turned into parts
        self.mode = "think?"  # think? | think | text | call | after | held
        self.legacy = reasoning_format == "deepseek-legacy"  # the thought in the content too
        if reasoning_format == "none":  # the thought stays in the text
            self.mode = "text"
        elif thinking:
            self.mode = "think"
        self.scan: _Scanner | None = None
        self.call_at = 0  # where the current call's marker began
        self.sent_args = 0
        self.current: CallStart | None = None
        self.text_parts: list[str] = []
        self.think_parts: list[str] = []
        self.calls: list[dict] = []
        self.finished = False
        self.cut = False  # the answer ended inside a call
        self.after_thought = False  # a thought just closed: blank lines are skipped

    # -- feeding ------------------------------------------------------------------------------

    def feed(self, piece: str) -> list[Part]:
        self.text += piece
        out: list[Part] = []
        while self._step(out):
            pass
        return out

    def finish(self) -> list[Part]:
        out: list[Part] = []
        self.finished = True
        while self._step(out):
            pass
        rest = self.text[self.at:]
        self.at = len(self.text)
        if self.mode == "think":
            self._emit(out, Thinking(rest))
        elif self.mode == "call" and self.current is not None:
            # the answer ended inside a call (a length limit): what came of it is sent
            self._close_call(out, self.scan.args_live)
            self.cut = True
        elif self.mode in ("call", "held", "fence"):
            self._held(out, self.text[self.call_at:])
        elif rest:
            self._emit(out, Text(rest))
        return out

    def answer(self) -> Answer:
        content = "".join(self.text_parts)
        reasoning = "".join(self.think_parts) if self.think_parts or self.mode == "think" \
            else None
        if self.calls:
            content = content.strip()
        if self.legacy and reasoning is not None:
            content = f"{THINK_OPEN}{reasoning}{THINK_CLOSE}{content}"
        return Answer(content or (None if self.calls else content), reasoning, self.calls,
                      self.cut)

    # -- the states ---------------------------------------------------------------------------

    def _step(self, out: list[Part]) -> bool:
        """Turn what can be decided of the text into parts; True if it should run again."""
        rest = self.text[self.at:]
        if self.mode == "think?":
            lead = rest.lstrip()
            if lead.startswith(THINK_OPEN):
                self.at += len(rest) - len(lead) + len(THINK_OPEN)
                self.mode = "think"
                return True
            if THINK_OPEN.startswith(lead) and not self.finished and (lead or not rest):
                return False  # it may still open a thought
            self.mode = "text"
            return True
        if self.mode == "think":
            i = rest.find(THINK_CLOSE)
            if i >= 0:
                self._emit(out, Thinking(rest[:i]))
                self.at += i + len(THINK_CLOSE)
                self.mode, self.after_thought = "text", True
                return True
            keep = 0 if self.finished else _partial(rest, (THINK_CLOSE,))
            self._emit(out, Thinking(rest[:len(rest) - keep]))
            self.at += len(rest) - keep
            return False
        if self.mode == "text":
            return self._text(rest, out)
        if self.mode == "call":
            return self._call(out)
        if self.mode == "after":
            return self._after(rest, out)
        if self.mode == "fence":
            return self._fence(out)
        if self.mode == "code":
            return self._code(rest, out)
        return False  # held: decided at finish

    def _fence(self, out: list[Part]) -> bool:
        """A code block that may hold a call: held while it may, sent as text (streamed on)
        as soon as it cannot, parsed once it closes if it does."""
        held = self.text[self.call_at:]
        verdict = _fence_verdict(held, self.plan.names)
        if verdict is None:
            return False  # not decided yet (at the end: finish parses what is held)
        if verdict == "text":
            self._emit(out, Text(FENCE))
            self.at, self.mode = self.call_at + len(FENCE), "code"
            return True
        end = held.find(FENCE, len(FENCE))
        if end < 0:
            return False
        self._held(out, held[:end + len(FENCE)])
        self.at, self.mode = self.call_at + end + len(FENCE), "text"
        return True

    def _code(self, rest: str, out: list[Part]) -> bool:
        """Inside a code block that is not a call: text, up to and with its closing fence."""
        end = rest.find(FENCE)
        if end >= 0:
            self._emit(out, Text(rest[:end + len(FENCE)]))
            self.at += end + len(FENCE)
            self.mode = "text"
            return True
        keep = 0 if self.finished else _partial(rest, (FENCE,))
        self._emit(out, Text(rest[:len(rest) - keep]))
        self.at += len(rest) - keep
        return False

    def _markers(self) -> tuple[str, ...]:
        if not self.plan.parse:
            return ()
        marks = (self.fmt.open,) if self.fmt.open else ()
        return marks + ((FENCE,) if self.plan.names else ())

    def _text(self, rest: str, out: list[Part]) -> bool:
        if self.after_thought:  # the blank lines after a thought are not the answer's
            lead = rest.lstrip("\r\n")
            self.at += len(rest) - len(lead)
            if not lead and not self.finished:
                return False
            self.after_thought, rest = False, lead
        marks = self._markers()
        if self.plan.parse and not self.fmt.open and not self.text_parts and \
                rest.lstrip().startswith("{"):  # Llama 3.x: a call is the whole answer
            self._begin_call(len(rest) - len(rest.lstrip()), 0, out)
            return True
        if self.calls and not rest.strip():  # blanks between or after calls are not text
            if self.finished:
                self.at = len(self.text)
            return False
        hits = [(i, m) for m in marks if (i := rest.find(m)) >= 0]
        if hits:
            i, m = min(hits)
            self._emit(out, Text(rest[:i] if rest[:i].strip() or not self.calls else ""))
            if m == FENCE:  # a code block: a call only if it opens {"name": a tool's
                self.call_at = self.at = self.at + i
                self.mode = "fence"
                return True
            self._begin_call(i, len(m), out)
            return True
        if self.plan.parse and not self.fmt.open and not self.text_parts and not rest.strip() \
                and not self.finished:
            return False  # nothing but blanks yet: a bare call may still start
        keep = 0 if self.finished else _partial(rest, marks)
        if self.calls and not rest[:len(rest) - keep].strip():
            return False  # blanks after a call: text only if text follows
        self._emit(out, Text(rest[:len(rest) - keep]))
        self.at += len(rest) - keep
        return False

    def _begin_call(self, i: int, marker: int, out: list[Part]) -> None:
        self.call_at = self.at + i
        self.at += i + marker
        self.mode = "call"
        self.scan = _Scanner(self.fmt)
        self.current, self.sent_args = None, 0

    def _call(self, out: list[Part]) -> bool:
        scan = self.scan
        while self.fmt.array and scan.expect == "open" and self.at < len(self.text) and \
                self.text[self.at] in " \t\r\n[,":  # Mistral's list: its '[', the ','s
            self.at += 1
        if self.fmt.args and scan.expect == "open" and not self._args_name(scan):
            return False
        while self.at < len(self.text) and not scan.done and not scan.fail:
            scan.feed(self.text[self.at])
            self.at += 1
            if self.fmt.args and scan.args is not None:
                scan.feed("}")  # name[ARGS]{...}: the object read is closed here
            if self.current is None and scan.name is not None:
                if not self.fmt.open and scan.name not in self.plan.names:
                    scan.fail = True  # a bare object naming no tool is an answer, not a call
                    break
                self.current = CallStart(len(self.calls), call_id(), scan.name)
                out.append(self.current)
            self._send_args(out)
        if scan.fail:
            if self.current is not None:  # already announced: it is sent as it is
                self._close_call(out, scan.args_live)
                self.mode = "after"
                return True
            self.mode = "held"
            self.at = len(self.text)
            return False
        if not scan.done:
            return False
        if self.current is None or scan.args is None:  # an object with no name or arguments
            self.mode, self.at = "held", len(self.text)
            return False
        self._close_call(out, scan.args)
        self.mode = "after"
        return True

    def _args_name(self, scan: _Scanner) -> bool:
        """Mistral's name[ARGS]: the name read as text up to the marker, handed to the scanner
        as the object's "name"; False while the marker has not come."""
        rest = self.text[self.at:]
        i = rest.find(self.fmt.args)
        if i < 0:
            if self.finished or len(rest) > 200 or "\n" in rest:
                scan.fail = True  # not a name
                return True
            return False
        for c in '{"name": ' + json.dumps(rest[:i].strip()) + ', "arguments": ':
            scan.feed(c)
        self.at += i + len(self.fmt.args)
        return True

    def _send_args(self, out: list[Part]) -> None:
        scan = self.scan
        if self.current is None or scan.args_live.startswith('"'):
            return  # arguments written as a string are sent decoded, at the end
        live = scan.args_live if scan.args is None else scan.args
        if len(live) > self.sent_args:
            out.append(CallArgs(self.current.index, live[self.sent_args:]))
            self.sent_args = len(live)

    def _close_call(self, out: list[Part], arguments: str) -> None:
        c = self.current
        if len(arguments) > self.sent_args:  # what the deltas have not sent yet
            out.append(CallArgs(c.index, arguments[self.sent_args:]))
        out.append(CallEnd(c.index, c.id, c.name, arguments))
        self.calls.append({"id": c.id, "type": "function",
                           "function": {"name": c.name, "arguments": arguments}})
        self.current = None

    def _after(self, rest: str, out: list[Part]) -> bool:
        """After a call: its close tag, then text or the next call."""
        lead = rest.lstrip()
        skipped = len(rest) - len(lead)
        close = self.fmt.close
        if not lead and not self.finished:
            return False  # what follows the call is not here yet
        if close and lead.startswith(close):
            self.at += skipped + len(close)
            return True
        if close and close.startswith(lead) and not self.finished:
            return False
        if self.fmt.array:
            if lead.startswith(","):
                self._begin_call(skipped, 0, out)
                return True
            if lead.startswith("]"):
                self.at += skipped + 1
                return True
        self.mode = "text"
        return bool(rest)

    def _held(self, out: list[Part], held: str) -> None:
        """Text held since a fence or an invalid call: its calls, if any, and the rest."""
        content, calls = tools.parse(held, self.plan.names)
        if not calls:
            self._emit(out, Text(held))
            return
        if content:
            self._emit(out, Text(content))
        for c in calls:
            fn = c["function"]
            i = len(self.calls)
            out += [CallStart(i, c["id"], fn["name"]), CallArgs(i, fn["arguments"]),
                    CallEnd(i, c["id"], fn["name"], fn["arguments"])]
            self.calls.append(c)

    def _emit(self, out: list[Part], part: Text | Thinking) -> None:
        if not part.text:
            return
        (self.text_parts if isinstance(part, Text) else self.think_parts).append(part.text)
        out.append(part)


def _fence_verdict(held: str, names: set[str]) -> str | None:
    """Whether a code block (held, from its opening fence) is a call: "call" once it opens
    {"name": "<one of the tools>", "text" once it cannot, None while undecided."""
    line, nl, body = held[len(FENCE):].partition("\n")
    lang = line.strip()
    if not nl:
        return None if any(k.startswith(lang) for k in ("json", "xml")) else "text"
    if lang not in ("", "json", "xml"):
        return "text"
    rest = body.lstrip()
    for expect in ("{", '"name"', ":", '"'):
        if len(rest) < len(expect):
            return None if expect.startswith(rest) else "text"
        if not rest.startswith(expect):
            return "text"
        rest = rest[len(expect):].lstrip() if expect != '"' else rest[len(expect):]
    name, quote, _ = rest.partition('"')
    if not quote:
        return None if any(n.startswith(name) for n in names) else "text"
    return "call" if name in names else "text"


def _partial(text: str, marks: tuple[str, ...]) -> int:
    """How many characters at the end of text could begin one of the marks."""
    return max((n for m in marks for n in range(min(len(m) - 1, len(text)), 0, -1)
                if text.endswith(m[:n])), default=0)


def of(text: str, plan: tools.ToolPlan, thinking: bool = False,
       reasoning_format: str = "auto") -> Answer:
    """A finished answer's parts, as the stream would have given them."""
    s = AnswerStream(plan, thinking, reasoning_format)
    s.feed(text)
    s.finish()
    return s.answer()
