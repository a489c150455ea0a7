"""An answer split as it streams (server/answer.py) and the tool-call grammars (server/tools.py):
whatever pieces the text arrives in, the client sees the same text, thinking and calls as the
whole answer gives, each call's arguments as deltas that join to them, and under tool_choice
auto a started call can only be completed validly while free text stays free."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from tandem import grammar
from tandem.config import EngineConfig, SamplingParams, SpecConfig
from tandem.engine import Engine, Request
from tandem.server import answer, tools

NAMES = ["get_weather", "run_tests", "edit"]
PLAN = {fmt.name: tools.ToolPlan([{"type": "function", "function": {"name": n}} for n in NAMES],
                                 None, True, fmt)
        for fmt in (tools.HERMES, tools.MISTRAL, tools.MISTRAL_ARGS, tools.LLAMA3)}

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                max_size=3),
    max_leaves=8)
args_objects = st.dictionaries(st.text(min_size=1, max_size=8), json_values, max_size=4)
prose = st.text(alphabet="abc XYZ.,:!?'\"\n<>`[]{}/_-é日", max_size=40).filter(
    lambda t: not any(m in t for m in ("<tool_call>", "```", "<think>", "[TOOL_CALLS]")))


def _write(fmt: tools.ToolFormat, calls: list[tuple[str, dict]]) -> str:
    key = fmt.args_key
    objs = [json.dumps({"name": n, key: a}, ensure_ascii=False) for n, a in calls]
    if fmt is tools.MISTRAL:
        return "[TOOL_CALLS][" + ", ".join(objs) + "]"
    if fmt is tools.MISTRAL_ARGS:
        return "".join(f"[TOOL_CALLS]{n}[ARGS]{json.dumps(a, ensure_ascii=False)}"
                       for n, a in calls)
    if fmt is tools.LLAMA3:
        return objs[0]
    return "\n".join(f"<tool_call>\n{o}\n</tool_call>" for o in objs)


def _no_ids(a: answer.Answer) -> tuple:
    return a.content, a.reasoning, [c["function"] for c in a.calls], a.cut


def _stream(text: str, plan: tools.ToolPlan, cuts: list[int], thinking: bool = False):
    s = answer.AnswerStream(plan, thinking)
    at, parts = 0, []
    for c in sorted(set(cuts)) + [len(text)]:
        parts += s.feed(text[at:c])
        at = c
    parts += s.finish()
    return parts, s.answer()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fmt=st.sampled_from(["hermes", "mistral", "mistral-args", "llama3"]), text=prose,
       calls=st.lists(st.tuples(st.sampled_from(NAMES), args_objects), min_size=1, max_size=3),
       cuts=st.lists(st.integers(0, 400), max_size=30))
def test_any_chunking_gives_the_whole_answers_text_and_calls(fmt, text, calls, cuts):
    plan = PLAN[fmt]
    text = text.strip() if fmt != "llama3" else ""  # a Llama 3.x call is the whole answer
    calls = calls[:1] if fmt == "llama3" else calls
    whole = (text + "\n" if text else "") + _write(plan.format, calls)
    parts, got = _stream(whole, plan, [c % (len(whole) + 1) for c in cuts])
    assert _no_ids(got) == _no_ids(answer.of(whole, plan))
    sent = "".join(p.text for p in parts if isinstance(p, answer.Text))
    assert sent.strip() == text and (got.content or "") == text
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in got.calls] \
        == calls
    for i, call in enumerate(got.calls):
        deltas = "".join(p.delta for p in parts if isinstance(p, answer.CallArgs) and p.index == i)
        assert deltas == call["function"]["arguments"]
        start = next(p for p in parts if isinstance(p, answer.CallStart) and p.index == i)
        assert (start.id, start.name) == (call["id"], call["function"]["name"])
    assert got.finish_reason("eos") == "tool_calls"


@settings(max_examples=60, deadline=None)
@given(text=prose, cuts=st.lists(st.integers(0, 60), max_size=10))
def test_text_that_only_looks_like_a_call_start_is_sent_as_it_was(text, cuts):
    """Held-back pieces ('<tool', '`', a '{' that names no tool) all come out as text."""
    for plan in PLAN.values():
        parts, got = _stream(text, plan, cuts)
        assert "".join(p.text for p in parts if isinstance(p, answer.Text)) == text
        assert got.calls == [] and got.finish_reason("eos") == "stop"


def test_thinking_is_split_from_the_answer():
    got = answer.of("<think>\nweigh it\n</think>\n\nYes.", tools.NO_TOOLS)
    assert (got.reasoning, got.content) == ("\nweigh it\n", "Yes.")
    # the template opened the thought: the answer starts inside it
    assert answer.opens_thought("<|im_start|>assistant\n<think>\n")
    got = answer.of("still weighing</think>Done", tools.NO_TOOLS, thinking=True)
    assert (got.reasoning, got.content) == ("still weighing", "Done")
    # the blank lines after a thought are dropped whether or not they come with its end
    for cut in range(len("<think>a</think>\n\nHi") + 1):
        parts, got = _stream("<think>a</think>\n\nHi", tools.NO_TOOLS, [cut])
        assert "".join(p.text for p in parts if isinstance(p, answer.Text)) == "Hi" == \
            got.content, cut
    parts, _ = _stream("<think>ab</think>cd", tools.NO_TOOLS, [1, 3, 8, 9, 12])
    kinds = [type(p).__name__ for p in parts]
    assert kinds == sorted(kinds, key=lambda k: k != "Thinking") and len(kinds) > 2
    assert "".join(p.text for p in parts if isinstance(p, answer.Thinking)) == "ab"
    assert "".join(p.text for p in parts if isinstance(p, answer.Text)) == "cd"
    assert answer.of("no <think> here", tools.NO_TOOLS).reasoning is None
    # --reasoning-format none leaves the thought in the text; deepseek-legacy puts it in both
    text = "<think>w</think>Yes."
    assert answer.of(text, tools.NO_TOOLS, reasoning_format="none") == \
        answer.Answer(text, None, [])
    assert answer.of(text, tools.NO_TOOLS, reasoning_format="deepseek-legacy") == \
        answer.Answer(text, "w", [])


def test_a_fenced_call_and_a_cut_call():
    plan = PLAN["hermes"]
    got = answer.of('Sure:\n```json\n{"name": "edit", "arguments": {"a": 2}}\n```', plan)
    assert got.content == "Sure:" and got.calls[0]["function"]["arguments"] == '{"a": 2}'
    code = "```python\nprint(1)\n```"
    assert answer.of(code, plan) == answer.Answer(code, None, [])
    cut = answer.of('<tool_call>\n{"name": "edit", "arguments": {"a": [1, 2', plan)
    assert cut.cut and cut.calls[0]["function"]["arguments"] == '{"a": [1, 2'
    assert cut.finish_reason("limit") == "length"
    broken = "x <tool_call> {broken"
    assert answer.of(broken, plan) == answer.Answer(broken, None, [])


def test_a_code_block_streams_as_soon_as_it_cannot_be_a_call():
    """With tools offered, a fence is held only while it may still open {"name": a tool}."""
    plan = PLAN["hermes"]
    for head in ("```python\n", "```json\n{\"a\"", '```json\n{"name": "average"',
                 "```\n[1, 2"):
        s = answer.AnswerStream(plan)
        parts = s.feed("Here:\n" + head)
        assert "".join(p.text for p in parts) == "Here:\n" + head
        more = s.feed(" more\n```\nDone <tool")
        assert "".join(p.text for p in more) == " more\n```\nDone ", head
    s = answer.AnswerStream(plan)  # undecided: '```js' may still be '```json'
    assert "".join(p.text for p in s.feed("A\n```js")) == "A\n"
    s = answer.AnswerStream(plan)
    assert "".join(p.text for p in s.feed('Sure:\n```json\n{"name": "edit", ')) == "Sure:\n"
    parts = s.feed('"arguments": {"a": 1}}\n```\nand then')
    assert [type(p).__name__ for p in parts] == ["CallStart", "CallArgs", "CallEnd", "Text"]
    assert s.answer().calls[0]["function"]["arguments"] == '{"a": 1}'


def test_format_follows_the_template():
    assert tools.format_of("{{ '<tool_call>' }}") is tools.HERMES
    assert tools.format_of("[AVAILABLE_TOOLS] ... [TOOL_CALLS]") is tools.MISTRAL
    assert tools.format_of("[TOOL_CALLS]' + name + '[ARGS]") is tools.MISTRAL_ARGS
    assert tools.format_of('{{- "Environment: ipython\\n" }}') is tools.LLAMA3
    assert tools.format_of(None) is tools.HERMES  # tools described in Hermes' words


# ---- the lazy grammar of tool_choice auto ------------------------------------------------------

SCHEMAS = {"edit": {"type": "object", "properties": {"path": {"type": "string"}},
                    "required": ["path"]}}


@pytest.mark.parametrize("fmt", [tools.HERMES, tools.MISTRAL, tools.MISTRAL_ARGS])
def test_a_started_call_must_complete_and_free_text_may_end(models, fmt):
    """The tiny vocabulary has no <tool_call> token: the marker is text, as for SmolLM2/Gemma."""
    engine = Engine(models[0], None, EngineConfig(ctx_size=256), SpecConfig(types=["none"]))
    tok, n = engine.tok, engine.target.args.vocab_size
    g = grammar.from_lark(tools.calls_lark(SCHEMAS, True, set(tok.tokens), fmt, lazy=True))
    eos = tok.eos_id
    free = grammar.Guide(tok, n, g)
    free.advance(tok.encode("The quick fox <tool", add_special=False))
    assert free.allowed()[eos]  # free text (even one that began like the marker) may end
    guide = grammar.Guide(tok, n, g)
    guide.advance(tok.encode("Let me look.\n" + fmt.open, add_special=False))
    assert not guide.allowed()[eos]  # once the marker is written, the call must come
    forced = tok.decode(guide.forced(40))
    call = '{"name": "edit", "arguments": {"path": "'
    if fmt.args:
        call = 'edit[ARGS]{"path": "'
    assert forced == {"hermes": "\n", "mistral": "["}.get(fmt.name, "") + call, forced
    rest = _write(fmt, [("edit", {"path": "a.py"})])[len(fmt.open):]
    ids = tok.encode(rest, add_special=False)
    assert guide.valid(ids) == len(ids)
    guide.advance(ids)
    assert guide.allowed()[eos]
    bad = grammar.Guide(tok, n, g)
    bad.advance(tok.encode("x" + fmt.open, add_special=False))
    wrong = tok.encode({"hermes": '\n{"name": "rm", "arguments": {}}', "mistral": '[{"name": "rm"',
                        "mistral-args": "rm[ARGS]{}"}[fmt.name], add_special=False)
    assert bad.valid(wrong) < len(wrong)  # a tool that was not offered cannot be named


def test_free_text_under_the_lazy_grammar_is_the_models_own(models):
    """tool_choice auto never changes an answer that calls nothing, with or without
    speculation (greedy). The grammar reads characters, so free text must be valid UTF-8: the
    random tiny model's stray bytes are kept out of both runs (a real model's text is)."""
    engine = Engine(models[0], None, EngineConfig(ctx_size=64), SpecConfig())
    tok, n = engine.tok, engine.target.args.vocab_size
    g = grammar.from_lark(tools.calls_lark(SCHEMAS, True, set(tok.tokens), tools.HERMES,
                                           lazy=True))
    stray = {t: float("-inf") for t in range(n)
             if t not in tok.eog_ids and not tok.token_to_piece(t, special=True).isascii()}
    outs = []
    for types, draft in ((["none"], None), (["suffix"], None), (["draft-simple"], models[1]),
                         (["auto"], models[2])):
        engine = Engine(models[0], draft, EngineConfig(ctx_size=512), SpecConfig(types=types))
        ids = engine.tok.encode("def add(a, b):", add_special=False)
        sp = SamplingParams(temperature=0.0, n_predict=60)
        plain = engine.generate(Request(ids, sp, logit_bias=stray)).output
        lazy = engine.generate(Request(ids, sp, grammar=g, logit_bias=stray)).output
        assert lazy == plain, types
        outs.append(lazy)
    assert all(o == outs[0] for o in outs) and len(outs[0]) > 10
