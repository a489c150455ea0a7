"""Structured output (issue 23): grammars and JSON schemas on every row the target scores, the
tokens a grammar forces drafted for free, logit biases, and OpenAI tool calls.

What a user would notice: an answer that does not parse or match the schema; a different
answer with speculation than without; a sampled answer whose distribution is not the masked
target's; a tool call that the openai package cannot read back."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import jsonschema
import pytest
import scipy.stats
import torch

from tandem import grammar
from tandem.config import EngineConfig, SamplingParams, SpecConfig
from tandem.engine import Engine, Request
from tests import tiny
from tests.servers import GREEDY, Server

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "ok": {"type": "boolean"},
        "n": {"type": "integer", "minimum": 0, "maximum": 99},
        "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 3},
    },
    "required": ["name", "ok", "n", "tags"],
    "additionalProperties": False,
}
PROMPT = "Summarize the following document"


def _engine(models, types, draft=None):
    target = models[0]
    return Engine(target, draft, EngineConfig(ctx_size=512), SpecConfig(types=types))


def _run(engine, g, temp=0.0, seed=0, n=80, **kw):
    ids = engine.tok.encode(PROMPT, add_special=False)
    sp = SamplingParams(temperature=temp, seed=seed, n_predict=n, top_k=0, top_p=1.0, min_p=0.0)
    return engine.generate(Request(ids, sp, grammar=g, **kw))


# ---- the engine --------------------------------------------------------------------------------


@pytest.mark.parametrize("types,draft", [(["none"], None), (["auto"], 2), (["draft-simple"], 2)])
def test_sampled_schema_answers_always_parse_and_validate(models, types, draft):
    engine = _engine(models, types, None if draft is None else models[draft])
    g = grammar.from_json_schema(SCHEMA)
    for seed in range(8):
        seq = _run(engine, g, temp=1.0, seed=seed)
        assert seq.stop_type == "eos", (seed, seq.text)
        jsonschema.validate(json.loads(seq.text), SCHEMA)


@pytest.mark.parametrize("make", [
    lambda: grammar.from_json_schema(SCHEMA),
    lambda: grammar.from_gbnf('root ::= "{" item ("," item)* "}"\nitem ::= [a-z]{1,4} "=" [0-9]+'),
], ids=["schema", "gbnf"])
def test_constrained_greedy_output_is_the_same_with_every_proposer(models, make):
    """Each verified row is masked as one-token decoding masks its row, so speculation never
    changes a constrained greedy answer, whoever drafts (a draft that agrees with the target,
    one that mostly does not, copies, forced tokens)."""
    g = make()
    want = _run(_engine(models, ["none"]), g).output
    assert want
    for types, draft in ((["ngram-simple"], None), (["suffix"], None), (["auto"], 1),
                         (["draft-simple"], 1), (["draft-simple"], 2), (["auto"], 2)):
        seq = _run(_engine(models, types, None if draft is None else models[draft]), g)
        assert seq.output == want, (types, draft)


def test_forced_tokens_are_drafted_so_a_pass_yields_several(models):
    """Under a schema the keys, quotes and separators are forced: drafted with confidence 1
    and verified with the rest, so the answer takes fewer target passes than tokens."""
    engine = _engine(models, ["ngram-simple"])
    passes = 0
    step = engine.step

    def counted():
        nonlocal passes
        passes += 1
        return step()

    engine.step = counted
    seq = _run(engine, grammar.from_json_schema(SCHEMA))
    assert seq.stats.n_forced >= 8 and seq.stats.n_accepted >= seq.stats.n_forced // 2
    assert passes < len(seq.output) - 5, (passes, len(seq.output))
    assert seq.timings()["draft_n_forced"] == seq.stats.n_forced
    assert "grammar" in seq.origins  # forced tokens are reported as the grammar's
    alone = _run(_engine(models, ["none"]), grammar.from_json_schema(SCHEMA))
    assert alone.stats.n_forced == 0 and alone.output == seq.output


def test_sampled_constrained_answers_have_the_masked_targets_distribution(models):
    """The first letter under `[a-h] "xyz"`, drawn 1500 times with a draft model that mostly
    disagrees (its q masked as the target's p), against the target's masked distribution."""
    engine = _engine(models, ["draft-simple"], models[2])
    g = grammar.from_gbnf('root ::= [a-h] "xyz"')
    letters = "abcdefgh"
    ids = [engine.tok.encode(c, add_special=False)[0] for c in letters]
    # the reference: the target's row 0 under the grammar, probabilities after the sampler
    ref = _run(_engine(models, ["none"]), g, temp=1.0, seed=1, n=1, n_probs=300,
               post_sampling=True).logprobs[0]
    p = dict(ref.top)
    expected = torch.tensor([float(torch.tensor(p.get(t, -1e9)).exp()) for t in ids])
    assert abs(float(expected.sum()) - 1) < 1e-4 and (expected > 0.005).all()
    counts = torch.zeros(len(ids))
    n = 1500
    for seed in range(n):
        seq = _run(engine, g, temp=1.0, seed=seed, n=6)
        assert seq.text[1:] == "xyz" and seq.text[0] in letters, seq.text
        counts[letters.index(seq.text[0])] += 1
    pvalue = scipy.stats.chisquare(counts.numpy(), (expected * n).numpy()).pvalue
    assert pvalue > 1e-3, (counts.tolist(), (expected * n).tolist())
    assert engine.speculation.draft_history is not None


def test_lookahead_never_changes_what_the_grammar_allows(models):
    """Drafts are looked at ahead (masks of every row, the draft model's next token, forced
    tokens, how much of a draft is valid) many times between the tokens actually emitted; the
    mask after the emitted tokens must still be what consuming them once gives. (llguidance's
    rollback got this wrong on the real pair: a '\"}' token refused after a string.)"""
    import random

    from llguidance import LLMatcher

    tok, vocab = models[0].tokenizer, models[0].args.vocab_size
    g = grammar.from_json_schema(SCHEMA)
    engine = _engine(models, ["none"])
    rng = random.Random(0)
    for seed in range(6):
        out = _run(engine, g, temp=1.0, seed=seed).output
        guide = grammar.Guide(tok, vocab, g)
        at = 0
        while at < len(out):
            for _ in range(3):  # lookahead of every kind, as a step of speculation does
                ahead = out[at: at + rng.randint(1, 6)]
                guide.forced(8)
                guide.valid(ahead + [rng.randrange(vocab)])
                guide.row_masks(ahead)
                guide.allowed(ahead[:-1])
            n = rng.randint(1, 4)
            guide.advance(out[at: at + n])
            at += n
            fresh = LLMatcher(grammar.lltokenizer(tok, vocab), g, log_level=0)
            fresh.consume_tokens(out[:at])
            assert torch.equal(guide._mask(), grammar._mask_of(fresh, vocab)), (seed, at)


def test_logit_bias_bans_and_favours_tokens(models):
    engine = _engine(models, ["ngram-simple"])
    plain = _run(engine, None, n=16).output
    banned = plain[0]
    seq = _run(engine, None, n=16, logit_bias={banned: float("-inf")})
    assert banned not in seq.output
    favoured = _run(engine, None, n=4, logit_bias={42: 100.0}).output
    assert favoured[0] == 42


def test_ignore_eos_with_a_grammar_still_ends_with_the_grammar(models):
    engine = _engine(models, ["ngram-simple"])
    ids = engine.tok.encode(PROMPT, add_special=False)
    seq = engine.generate(Request(ids, SamplingParams(temperature=0, n_predict=40,
                                                      ignore_eos=True),
                                  grammar=grammar.from_gbnf('root ::= "ab"')))
    assert seq.text == "ab" and seq.stop_type == "eos"


def test_bad_grammars_and_schemas_name_the_problem(models):
    tok, vocab = models[0].tokenizer, models[0].args.vocab_size
    with pytest.raises(grammar.GrammarError, match="grammar: not a valid GBNF"):
        grammar.from_gbnf("root ::= this is (not valid")
    with pytest.raises(grammar.GrammarError, match="json_schema: Invalid type"):
        grammar.check(tok, vocab, grammar.from_json_schema({"type": "hiccup"}), "json_schema")
    with pytest.raises(grammar.GrammarError, match="json_schema: expected a JSON schema"):
        grammar.from_json_schema(123)


# ---- the server --------------------------------------------------------------------------------

HERMES = tiny.HERMES
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 8},
        "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["city", "unit"],
        "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "properties": {
        "zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"], "additionalProperties": False}}}


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    d: Path = tmp_path_factory.mktemp("structured")
    path = tiny.write_gguf(tiny.hf_model("qwen2", seed=3), d / "target.gguf", "qwen2")
    (d / "hermes.jinja").write_text(HERMES)
    s = Server(["--model", str(path), "--ctx-size", "1024", "-t", "1", "--spec-type",
                "ngram-simple", "--chat-template-file", str(d / "hermes.jinja")], d / "s.log")
    try:
        s.wait_ready(120)
        yield s
    finally:
        s.stop()


def _post(s: Server, path: str, body: dict) -> dict:
    r = httpx.post(f"{s.url}{path}", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def test_completion_json_schema_answers_match_it_and_report_forced_drafts(srv):
    for seed in range(4):
        r = _post(srv, "/completion", {"prompt": PROMPT, "n_predict": 80, "json_schema": SCHEMA,
                                       "temperature": 1.0, "seed": seed})
        jsonschema.validate(json.loads(r["content"]), SCHEMA)
        assert r["stop_type"] == "eos" and r["generation_settings"]["grammar"]
        assert r["timings"]["draft_n_forced"] > 0


def test_completion_gbnf_grammar(srv):
    r = _post(srv, "/completion", {"prompt": PROMPT, "n_predict": 8,
                                   "grammar": 'root ::= "a"{5,5}', **GREEDY})
    assert r["content"] == "aaaaa"


@pytest.mark.parametrize("fmt", [
    {"type": "json_object"},
    {"type": "json_object", "schema": SCHEMA},
    {"type": "json_schema", "json_schema": {"name": "x", "strict": True, "schema": SCHEMA}},
])
def test_chat_response_format_gives_json(srv, fmt):
    r = _post(srv, "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "Give JSON"}], "max_tokens": 120,
        "response_format": fmt, **GREEDY})
    obj = json.loads(r["choices"][0]["message"]["content"])
    assert isinstance(obj, dict)
    if "schema" in fmt or "json_schema" in fmt:
        jsonschema.validate(obj, SCHEMA)


def test_logit_bias_in_llama_and_openai_shapes(srv):
    body = {"prompt": PROMPT, "n_predict": 12, **GREEDY}
    plain = _post(srv, "/completion", {**body, "return_tokens": True})["tokens"]
    for bias in ([[plain[0], False]], [[plain[0], -100]], {str(plain[0]): -100}):
        r = _post(srv, "/completion", {**body, "return_tokens": True, "logit_bias": bias})
        assert plain[0] not in r["tokens"]
    piece = _post(srv, "/detokenize", {"tokens": [plain[0]]})["content"]
    r = _post(srv, "/completion", {**body, "return_tokens": True, "logit_bias": [[piece, False]]})
    assert r["tokens"][0] != plain[0]
    settings = _post(srv, "/completion", {**body, "logit_bias": [[plain[0], -3.5]]})
    assert {"token": plain[0], "bias": -3.5} in settings["generation_settings"]["logit_bias"]


def _client(s: Server):
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=f"{s.url}/v1", api_key="none", max_retries=0)


def test_required_tool_call_round_trips_with_the_openai_package(srv):
    client = _client(srv)
    msgs = [{"role": "user", "content": "What is the weather in Paris?"}]
    r = client.chat.completions.create(model="x", messages=msgs, tools=[WEATHER, TIME],
                                       tool_choice="required", max_tokens=120, temperature=0)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
    for call in choice.message.tool_calls:
        assert call.type == "function" and call.id
        args = json.loads(call.function.arguments)
        schema = {"get_weather": WEATHER, "get_time": TIME}[call.function.name]
        jsonschema.validate(args, schema["function"]["parameters"])
    # the call and its result go back; the template renders both, the model answers
    call = choice.message.tool_calls[0]
    msgs += [choice.message.model_dump(exclude_none=True),
             {"role": "tool", "tool_call_id": call.id, "content": "18 degrees, sunny"}]
    again = client.chat.completions.create(model="x", messages=msgs, tools=[WEATHER, TIME],
                                           max_tokens=8, temperature=0)
    assert again.choices[0].message.content is not None
    prompt = _post(srv, "/apply-template", {"messages": msgs, "tools": [WEATHER]})["prompt"]
    assert '"name": "get_weather"' in prompt and "<tools>" in prompt


def test_named_tool_choice_and_streamed_tool_call_deltas(srv):
    client = _client(srv)
    msgs = [{"role": "user", "content": "Time?"}]
    named = {"type": "function", "function": {"name": "get_time"}}
    r = client.chat.completions.create(model="x", messages=msgs, tools=[WEATHER, TIME],
                                       tool_choice=named, max_tokens=60, temperature=0)
    calls = r.choices[0].message.tool_calls
    assert [c.function.name for c in calls] == ["get_time"]
    stream = client.chat.completions.create(model="x", messages=msgs, tools=[WEATHER, TIME],
                                            tool_choice=named, max_tokens=60, temperature=0,
                                            stream=True)
    deltas, finish = [], None
    for chunk in stream:
        for c in chunk.choices:
            deltas += c.delta.tool_calls or []
            finish = c.finish_reason or finish
    assert finish == "tool_calls"
    # the call's id and name come first, then its arguments as they are generated
    assert deltas[0].id and deltas[0].function.name == "get_time" and len(deltas) > 2
    assert all(d.index == 0 and d.function.name is None for d in deltas[1:])
    assert "".join(d.function.arguments for d in deltas) == calls[0].function.arguments


def test_tool_choice_none_and_bad_tool_fields(srv):
    r = _post(srv, "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "hi"}], "tools": [WEATHER],
        "tool_choice": "none", "max_tokens": 4, **GREEDY})
    assert "tool_calls" not in r["choices"][0]["message"]
    for body, message in (
            ({"tools": [WEATHER], "tool_choice": {"type": "function",
                                                  "function": {"name": "nope"}}}, "tool_choice"),
            ({"tools": [{"type": "function"}]}, "tools[0]"),
            ({"tool_choice": "required"}, "no tools were given")):
        r = httpx.post(f"{srv.url}/v1/chat/completions", timeout=30, json={
            "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **body})
        assert r.status_code == 400 and message in r.json()["error"]["message"], r.text


def test_tool_calls_are_parsed_from_free_text():
    from tandem.server import answer, tools
    from tandem.server.tools import parse

    text = ('Let me check.\n<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>\n'
            '<tool_call>\n{"name": "g", "arguments": {}}\n</tool_call>')
    content, calls = parse(text)
    assert content == "Let me check."
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == \
        [("f", {"a": 1}), ("g", {})]
    assert parse("no calls <tool_call> {broken")[1] == []
    fenced = 'Sure:\n```json\n{"name": "f", "arguments": {"a": 2}}\n```'
    assert parse(fenced)[1] == [] and parse(fenced, {"g"})[1] == []  # only offered tools
    content, calls = parse(fenced, {"f"})
    assert content == "Sure:" and json.loads(calls[0]["function"]["arguments"]) == {"a": 2}
    code = "```python\nprint(1)\n```"
    assert parse(code, {"f"}) == (code, [])
    plan = tools.ToolPlan([{"type": "function", "function": {"name": "f"}}], None, True)
    stream = answer.AnswerStream(plan)
    assert "".join(p.text for p in stream.feed(code) + stream.finish()) == code
    stream = answer.AnswerStream(tools.ToolPlan([], None, True))
    parts = [p for piece in re.findall(r".{1,3}", text, re.DOTALL) for p in stream.feed(piece)]
    parts += stream.finish()
    sent = "".join(p.text for p in parts if isinstance(p, answer.Text))
    streamed = stream.answer().calls
    assert sent == "Let me check.\n" and [c["function"]["name"] for c in streamed] == ["f", "g"]
    # arguments reach the client while they are generated, piece by piece, and join exactly
    args = [p for p in parts if isinstance(p, answer.CallArgs) and p.index == 0]
    assert len(args) > 3 and "".join(p.delta for p in args) == '{"a": 1}'
    starts = [parts.index(p) for p in parts if isinstance(p, answer.CallStart)]
    assert parts.index(args[0]) > starts[0] and parts.index(args[-1]) < starts[1]
