"""Anthropic's Messages API (server/anthropic.py) through the official `anthropic` package and
raw HTTP, on a tiny model:

- SRV: a target and a draft with its weights (draft-simple: drafts are accepted, so `timings`
  carry draft_n), a template with a place for tools (Hermes'), an API key;
- VISION: a tiny Gemma 3 with a projector, for image blocks (started by the one test using it).

A random tiny model says nothing a test can expect, so what must come is forced: tool calls by
tool_choice any / tool (a grammar), thinking and text by llama.cpp's `grammar` field, which
passes through; greedy sampling makes a streamed answer comparable with the plain one.
"""

from __future__ import annotations

import base64
import io
import json
import time
from types import SimpleNamespace

import httpx
import jsonschema
import pytest
import torch

from tandem.server import anthropic as api
from tandem.server.oai import ChatRun
from tandem.server.schemas import ApiError
from tandem.server.tools import ToolPlan
from tandem.server.worker import Delta, Done
from tests import tiny, tiny_vision
from tests.servers import KEY, Server, same_weights_pair

anthropic = pytest.importorskip("anthropic")

HERMES = tiny.HERMES
WEATHER = {"name": "get_weather", "description": "Current weather in a city", "input_schema": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 8},
                                     "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"], "additionalProperties": False}}
TIME = {"name": "get_time", "input_schema": {
    "type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"],
    "additionalProperties": False}}
GREEDY = {"temperature": 0.0, "top_k": 1}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
# thinking, then text: forced (the tiny model never writes </think> by itself)
THOUGHT = {"grammar": 'root ::= "<think>I ponder.</think>Hello there"'}
TIMEOUT = 3  # seconds (--timeout): a request generating longer fails


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    d = tmp_path_factory.mktemp("anthropic")
    target, draft = same_weights_pair(d)
    (d / "hermes.jinja").write_text(HERMES)
    s = Server(["--model", str(target), "--model-draft", str(draft), "--ctx-size", "16384",
                "--spec-type", "draft-simple", "--spec-draft-n-max", "4", "--spec-draft-p-min",
                "0", "--chat-template-file", str(d / "hermes.jinja"), "--api-key", KEY,
                "--alias", "tiny", "--timeout", str(TIMEOUT), "-t", "1"], d / "s.log")
    try:
        s.wait_ready(120)
        yield s
    finally:
        s.stop()


@pytest.fixture(scope="module")
def client(srv):
    return anthropic.Anthropic(base_url=srv.url, api_key=KEY, max_retries=0)


def post(srv, path: str, body: dict, key: str = KEY) -> httpx.Response:
    return httpx.post(f"{srv.url}{path}", json=body, headers={"x-api-key": key}, timeout=120)


def sse(r: httpx.Response) -> list[tuple[str, dict]]:
    """(event name, data) of each event of an Anthropic stream."""
    out = []
    for chunk in r.text.split("\n\n"):
        lines = dict(line.split(": ", 1) for line in chunk.split("\n") if ": " in line)
        if "data" in lines:
            out.append((lines.get("event"), json.loads(lines["data"])))
    return out


def check_blocks(events: list[tuple[str, dict]]) -> list[dict]:
    """The blocks a stream built, checked: message_start first, message_stop last, each
    event named as its type, blocks at consecutive indices, one open at a time."""
    assert events[0][0] == "message_start" and events[-1][0] == "message_stop"
    assert events[-2][0] == "message_delta"
    blocks: list[dict] = []
    open_ = None
    for name, data in events:
        assert name == data["type"]
        if name == "content_block_start":
            assert open_ is None and data["index"] == len(blocks)
            open_ = data["index"]
            blocks.append(dict(data["content_block"], partial=""))
        elif name == "content_block_delta":
            assert data["index"] == open_
            d, b = data["delta"], blocks[open_]
            key = {"text_delta": "text", "thinking_delta": "thinking",
                   "input_json_delta": "partial_json", "signature_delta": "signature"}[d["type"]]
            b["partial" if key == "partial_json" else key] += d[key]
        elif name == "content_block_stop":
            assert data["index"] == open_
            open_ = None
    assert open_ is None
    return blocks


# -- plain answers ------------------------------------------------------------------------------

def test_create_answers_in_anthropics_shape_and_counts_what_count_tokens_counts(srv, client):
    ask = dict(model="tiny", system="Be brief.", messages=[{"role": "user", "content": "Hi"}])
    msg = client.messages.create(max_tokens=8, **ask, extra_body={**GREEDY, "ignore_eos": True})
    assert isinstance(msg, anthropic.types.Message) and msg.id.startswith("msg_")
    assert msg.role == "assistant" and msg.model == "tiny"
    assert [b.type for b in msg.content] == ["text"] and msg.content[0].text
    assert msg.stop_reason == "max_tokens" and msg.stop_sequence is None
    assert msg.usage.output_tokens == 8
    counted = client.messages.count_tokens(**ask).input_tokens
    assert msg.usage.input_tokens + msg.usage.cache_read_input_tokens == counted
    # the same conversation through OpenAI's counter: the system prompt becomes its message
    openai_count = post(srv, "/v1/chat/completions/input_tokens", {"messages": [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]})
    assert openai_count.json()["input_tokens"] == counted
    ask.pop("system")
    assert client.messages.count_tokens(**ask).input_tokens < counted
    # asked again, the prompt is read from the slot's cache (but for its last token)
    again = client.messages.create(max_tokens=8, system="Be brief.", **ask,
                                   extra_body={**GREEDY, "ignore_eos": True})
    assert again.content[0].text == msg.content[0].text
    assert again.usage.cache_read_input_tokens == counted - 1 and again.usage.input_tokens == 1


def test_timings_only_when_asked_as_llama_server(srv):
    body = {"max_tokens": 12, "messages": ASK, "ignore_eos": True, **GREEDY}
    plain = post(srv, "/v1/messages", body).json()
    assert "timings" not in plain and plain["usage"]["output_tokens"] == 12
    timed = post(srv, "/v1/messages", {**body, "timings_per_token": True}).json()
    assert timed["timings"]["predicted_n"] == 12
    # the draft has the target's weights: greedy drafts are drafted and all accepted
    assert timed["timings"]["draft_n"] > 0
    assert timed["timings"]["draft_n_accepted"] == timed["timings"]["draft_n"]
    # per-request speculation passes through, as llama-server's speculative.* fields
    off = post(srv, "/v1/messages", {**body, "timings_per_token": True,
                                     "speculative.n_max": 0}).json()
    assert off["timings"].get("draft_n", 0) == 0
    assert off["content"] == timed["content"]


def test_stop_sequences_end_the_answer_where_they_begin(srv, client):
    ask = dict(model="tiny", max_tokens=16, messages=ASK,
               extra_body={**GREEDY, "ignore_eos": True})
    text = client.messages.create(**ask).content[0].text
    at = next(k for k in range(2, len(text) - 3)  # 3 characters found first at k
              if text[k:k + 3].isprintable() and "\ufffd" not in text[k:k + 3]
              and text.find(text[k:k + 3]) == k)
    stop = text[at:at + 3]
    msg = client.messages.create(**ask, stop_sequences=[stop, "never-said"])
    assert msg.stop_reason == "stop_sequence" and msg.stop_sequence == stop
    assert "".join(b.text for b in msg.content) == text[:at]


def test_thinking_comes_first_with_an_empty_signature(srv, client):
    ask = dict(model="tiny", max_tokens=80, messages=ASK, extra_body={**GREEDY, **THOUGHT},
               thinking={"type": "enabled", "budget_tokens": 1024})
    msg = client.messages.create(**ask)
    assert [b.type for b in msg.content] == ["thinking", "text"]
    assert msg.content[0].thinking == "I ponder." and msg.content[0].signature == ""
    assert msg.content[1].text == "Hello there" and msg.stop_reason == "end_turn"
    with client.messages.stream(**ask) as stream:
        kinds = [e.type for e in stream]
        final = stream.get_final_message()
    assert [b.model_dump() for b in final.content] == [b.model_dump() for b in msg.content]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert "thinking" in kinds and "signature" in kinds and "text" in kinds


# -- streams ------------------------------------------------------------------------------------

def test_stream_through_the_sdk_is_the_plain_answer(srv, client):
    ask = dict(model="tiny", max_tokens=10, messages=ASK,
               extra_body={**GREEDY, "ignore_eos": True})
    msg = client.messages.create(**ask)
    with client.messages.stream(**ask) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == final.content[0].text == msg.content[0].text
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 10
    assert final.usage.input_tokens + final.usage.cache_read_input_tokens == \
        msg.usage.input_tokens + msg.usage.cache_read_input_tokens


def test_raw_stream_events_usage_and_speculation_timings(srv):
    r = post(srv, "/v1/messages", {"max_tokens": 12, "stream": True, "messages": ASK,
                                   "ignore_eos": True, "return_progress": True, **GREEDY})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = sse(r)
    progress = [d for n, d in events if n == "prompt_progress"]
    assert progress and progress[-1]["prompt_progress"]["processed"] == \
        progress[-1]["prompt_progress"]["total"]
    events = [(n, d) for n, d in events if n != "prompt_progress"]
    blocks = check_blocks(events)
    assert [b["type"] for b in blocks] == ["text"] and blocks[0]["text"]
    start = events[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None
    assert start["usage"]["input_tokens"] > 0 and start["usage"]["output_tokens"] == 0
    delta = events[-2][1]
    assert delta["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}
    assert delta["usage"]["output_tokens"] == 12
    assert delta["timings"]["draft_n"] > 0 and "timings" not in events[-1][1]


def test_a_failure_mid_stream_is_an_anthropic_error_event(srv, client):
    long = {"max_tokens": 16000, "stream": True, "messages": ASK, "ignore_eos": True,
            "speculative.n_max": 0, **GREEDY}
    t0 = time.monotonic()
    events = sse(post(srv, "/v1/messages", long))
    assert TIMEOUT - 0.5 < time.monotonic() - t0 < 30
    assert [n for n, _ in events[:3]] == ["message_start", "content_block_start",
                                          "content_block_delta"]  # it was generating
    name, data = events[-1]
    assert name == "error" and data["type"] == "error"
    assert data["error"]["type"] == "timeout_error" and "--timeout" in data["error"]["message"]
    with pytest.raises(anthropic.APIStatusError) as e:  # the SDK raises it
        with client.messages.stream(model="tiny", max_tokens=16000, messages=ASK,
                                    extra_body={**GREEDY, "ignore_eos": True,
                                                "speculative.n_max": 0}) as stream:
            stream.until_done()
    assert "timeout_error" in str(e.value)


# -- tools --------------------------------------------------------------------------------------

def test_forced_tool_use_streams_its_input_and_round_trips(srv, client):
    ask = dict(model="tiny", max_tokens=200, messages=ASK, tools=[WEATHER, TIME])
    msg = client.messages.create(**ask, tool_choice={"type": "any"}, extra_body=GREEDY)
    assert msg.stop_reason == "tool_use"
    (call,) = [b for b in msg.content if b.type == "tool_use"]
    assert call.id and call.name in ("get_weather", "get_time")
    schema = {"get_weather": WEATHER, "get_time": TIME}[call.name]["input_schema"]
    jsonschema.validate(call.input, schema)
    # streamed: the arguments come as input_json_delta pieces while they are generated
    r = post(srv, "/v1/messages", {**ask, **GREEDY, "tool_choice": {"type": "any"},
                                   "stream": True})
    blocks = check_blocks(sse(r))
    tool = blocks[-1]
    assert tool["type"] == "tool_use" and tool["name"] == call.name and tool["input"] == {}
    assert json.loads(tool["partial"]) == call.input
    pieces = [d for n, d in sse(r) if d.get("delta", {}).get("type") == "input_json_delta"]
    assert len(pieces) > 3
    # the call and its result go back; the result is in the prompt
    turn = [{"role": "assistant", "content": [b.model_dump() for b in msg.content]}]

    def result(text: str) -> list[dict]:
        return [*ASK, *turn, {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": call.id, "content": text}]}]

    answer = client.messages.create(**{**ask, "max_tokens": 4, "messages": result("18 C")},
                                    extra_body=GREEDY)
    assert answer.type == "message" and answer.usage.output_tokens > 0
    short, long = (client.messages.count_tokens(model="tiny", tools=[WEATHER, TIME],
                                                messages=result(t)).input_tokens
                   for t in ("18 C", "18 C, sunny, and a light wind from the west"))
    assert long > short


def test_named_tool_and_tool_choice_none(srv, client):
    ask = dict(model="tiny", max_tokens=120, messages=ASK, tools=[WEATHER, TIME])
    msg = client.messages.create(**ask, tool_choice={"type": "tool", "name": "get_time"},
                                 extra_body=GREEDY)
    assert [(b.type, b.name) for b in msg.content] == [("tool_use", "get_time")]
    assert msg.content[0].input["zone"] in ("UTC", "CET")
    # none: the tools are left out of the prompt
    count = {c: client.messages.count_tokens(model="tiny", messages=ASK, tools=[WEATHER, TIME],
                                             tool_choice={"type": c}).input_tokens
             for c in ("none", "auto")}
    plain = client.messages.count_tokens(model="tiny", messages=ASK).input_tokens
    assert count["none"] == plain < count["auto"]


def _run(text: str) -> tuple[api._Events, ChatRun]:
    tools = [{"type": "function", "function": {"name": n, "parameters": {"type": "object"}}}
             for n in ("f", "g")]
    run = ChatRun([], ToolPlan(tools, None, True), False, [1, 2, 3, 4, 5])
    body = api.MessagesBody.model_validate({"max_tokens": 9, "messages": ASK})
    return api._Events({"id": "msg_x", "type": "message"}, run, body), run


def test_stream_blocks_of_thinking_text_and_two_calls_match_the_plain_answer():
    text = ('<think>Which tool?</think>Let me look.\n<tool_call>\n{"name": "f", "arguments": '
            '{"a": [1, 2], "b": "x"}}\n</tool_call>\n<tool_call>\n{"name": "g", "arguments": '
            '{}}\n</tool_call>')
    render, run = _run(text)
    result = {"content": text, "stop_type": "eos", "stopping_word": "", "tokens_evaluated": 5,
              "tokens_predicted": 40, "timings": {"cache_n": 2, "draft_n": 7}}
    events = [e for c in text
              for e in render(Delta(c, [0], ["target"], [c], [], {"cache_n": 2}))]
    events += render(Done(result))
    blocks = check_blocks(events)
    assert [b["type"] for b in blocks] == ["thinking", "text", "tool_use", "tool_use"]
    plain = api.message({}, run, result, False)
    assert [b["type"] for b in plain["content"]] == [b["type"] for b in blocks]
    assert blocks[0]["thinking"] == plain["content"][0]["thinking"] == "Which tool?"
    assert blocks[1]["text"] == plain["content"][1]["text"] == "Let me look."
    for streamed, whole in zip(blocks[2:], plain["content"][2:]):
        assert json.loads(streamed["partial"] or "{}") == whole["input"]
        assert streamed["name"] == whole["name"] and streamed["id"].startswith("call_")
    assert plain["content"][2]["input"] == {"a": [1, 2], "b": "x"}
    assert plain["stop_reason"] == events[-2][1]["delta"]["stop_reason"] == "tool_use"
    assert events[0][1]["message"]["usage"] == {"input_tokens": 3, "cache_read_input_tokens": 2,
                                                "output_tokens": 0}
    assert events[-2][1]["timings"]["draft_n"] == 7


# -- the conversion -----------------------------------------------------------------------------

def _chat(body: dict, vision: bool = False):
    engine = SimpleNamespace(vision=object() if vision else None)
    return api.to_chat(engine, api.MessagesBody.model_validate({"max_tokens": 5, **body}))


def test_conversion_to_the_openai_chat_body():
    chat = _chat({
        "system": [{"type": "text", "text": "A. "}, {"type": "text", "text": "B."}],
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "hmm", "signature": "s"},
                {"type": "redacted_thinking", "data": "xx"},
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "t1", "name": "f", "input": {"a": "é"}}]},
            {"role": "user", "content": [
                {"type": "text", "text": "Here:"},
                {"type": "tool_result", "tool_use_id": "t1", "is_error": True,
                 "content": [{"type": "text", "text": "no "}, {"type": "text", "text": "city"}]}]}],
        "tools": [{"name": "f", "description": "d", "input_schema": {"type": "object"}}],
        "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
        "stop_sequences": ["END"], "thinking": {"type": "disabled"}, "top_k": 7,
        "metadata": {"user_id": "u"}, "speculative.n_max": 3})
    roles = [m.role for m in chat.messages]
    assert roles == ["system", "user", "assistant", "tool", "user"]
    assert chat.messages[0].content == "A. B."
    assistant = chat.messages[2]
    assert assistant.content == "Checking." and assistant.reasoning_content == "hmm"
    assert assistant.tool_calls == [{"id": "t1", "type": "function", "function": {
        "name": "f", "arguments": '{"a": "é"}'}}]
    assert chat.messages[3].tool_call_id == "t1" and chat.messages[3].content == "no city"
    assert chat.messages[4].text() == "Here:"
    assert chat.tools == [{"type": "function", "function": {
        "name": "f", "parameters": {"type": "object"}, "description": "d"}}]
    assert chat.tool_choice == "required" and chat.parallel_tool_calls is False
    assert chat.stop == ["END"] and chat.top_k == 7 and chat.max_tokens == 5
    assert chat.chat_template_kwargs == {"enable_thinking": False}
    assert chat.speculative == {"speculative.n_max": 3}
    named = _chat({"messages": ASK, "tools": [{"name": "f"}],
                   "tool_choice": {"type": "tool", "name": "f"}})
    assert named.tool_choice == {"type": "function", "function": {"name": "f"}}
    # Claude Code's billing header: its per-request stamp made constant for the prompt cache
    cc = _chat({"messages": ASK, "system": "x-anthropic-billing-header: cc_version=2; "
                                          "cch=a5145;You are Claude Code."})
    assert cc.messages[0].content == \
        "x-anthropic-billing-header: cc_version=2; cch=fffff;You are Claude Code."


def test_image_blocks_become_image_parts_only_with_a_projector():
    png = base64.b64encode(b"\x89PNG...").decode()
    body = {"messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": png}},
        {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}},
        {"type": "text", "text": "What?"}]}]}
    parts = _chat(body, vision=True).messages[0].content
    assert [p.type for p in parts] == ["image_url", "image_url", "text"]
    assert parts[0].url == f"data:image/png;base64,{png}"
    assert parts[1].url == "https://example.com/a.png"
    with pytest.raises(ApiError) as e:
        _chat(body)
    assert e.value.status == 400 and "messages[0].content[0]: image input is not supported" in \
        e.value.message


@pytest.mark.parametrize("body, status, words", [
    ({"messages": ASK}, 400, "max_tokens: field required"),
    ({"max_tokens": 0, "messages": ASK}, 400, "max_tokens"),
    ({"max_tokens": 5, "messages": []}, 400, "messages: empty"),
    ({"max_tokens": 5, "messages": [*ASK, {"role": "assistant", "content": "ok"}, {
        "role": "user", "content": [{"type": "tool_result", "tool_use_id": "nope"}]}]},
     400, "messages[2].content[0].tool_use_id"),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "a"}, {"type": "tool_use", "id": "1", "name": "f",
                                       "input": {}}]}]},
     400, "messages[0].content[1]: a tool_use block belongs in an assistant message"),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "document"}]}]},
     400, "messages[0].content[0]: unknown block type \"document\""),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                     "data": "AAAA"}}]}]},
     400, "messages[0].content[0]: image input is not supported"),
    ({"max_tokens": 5, "messages": ASK, "tools": [WEATHER],
      "tool_choice": {"type": "tool", "name": "nope"}}, 400, "tool_choice.name"),
    ({"max_tokens": 5, "messages": ASK, "tools": [{"type": "web_search_20250305",
                                                    "name": "web_search"}]}, 400, "tools[0].type"),
    ({"max_tokens": 5, "messages": ASK, "temperature": "hot"}, 400, "temperature"),
])
def test_bad_requests_are_anthropic_errors_naming_the_field(srv, body, status, words):
    r = post(srv, "/v1/messages", body)
    assert r.status_code == status, r.text
    err = r.json()
    assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error"
    assert words in err["error"]["message"], err


def test_errors_keys_and_paths_in_anthropics_shape(srv, client):
    bad = anthropic.Anthropic(base_url=srv.url, api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as e:
        bad.messages.create(model="tiny", max_tokens=4, messages=ASK)
    assert e.value.body["error"]["type"] == "authentication_error"
    r = httpx.post(f"{srv.url}/v1/messages/count_tokens", json={"messages": ASK})
    assert r.status_code == 401 and r.json()["type"] == "error"
    # the key as a bearer token works too, as on every endpoint
    r = httpx.post(f"{srv.url}/v1/messages/count_tokens", json={"messages": ASK},
                   headers={"Authorization": f"Bearer {KEY}"})
    assert r.status_code == 200 and r.json()["input_tokens"] > 0
    with pytest.raises(anthropic.NotFoundError):
        client.get("/v1/messages/batches", cast_to=object)
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(model="tiny", max_tokens=4, messages=[
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "x"}]}])
    assert "messages[0].content[0].tool_use_id" in e.value.message
    # OpenAI's endpoints keep OpenAI's shape
    r = post(srv, "/v1/chat/completions", {"messages": []})
    assert r.status_code == 400 and "type" not in r.json() and r.json()["error"]["code"] == 400
    assert api.error_body(ApiError(503, "busy"))["error"]["type"] == "overloaded_error"


# -- images -------------------------------------------------------------------------------------

def _png(seed: int) -> str:
    from PIL import Image

    g = torch.Generator().manual_seed(seed)
    pixels = torch.randint(0, 256, (24, 40, 3), generator=g, dtype=torch.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels.numpy()).save(out, "PNG")
    return base64.b64encode(out.getvalue()).decode()


@pytest.fixture(scope="module")
def vision(tmp_path_factory):
    d = tmp_path_factory.mktemp("anthropic-vision")
    model, mmproj = tiny_vision.write_pair(d)
    s = Server(["--model", str(model), "--mmproj", str(mmproj), "--ctx-size", "512", "-t", "1"],
               d / "vision.log")
    try:
        s.wait_ready(120)
        yield s
    finally:
        s.stop()


def test_image_blocks_reach_a_model_with_a_projector(vision):
    client = anthropic.Anthropic(base_url=vision.url, api_key="none", max_retries=0)
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": _png(1)}}
    text = {"type": "text", "text": "What is this?"}
    with_image = [{"role": "user", "content": [image, text]}]
    msg = client.messages.create(model="x", max_tokens=4, messages=with_image,
                                 extra_body=GREEDY)
    assert msg.type == "message" and msg.usage.output_tokens > 0
    n_image = client.messages.count_tokens(model="x", messages=with_image).input_tokens
    n_text = client.messages.count_tokens(model="x", messages=[
        {"role": "user", "content": [text]}]).input_tokens
    assert n_image > n_text + 8  # the image's positions
    assert msg.usage.input_tokens + msg.usage.cache_read_input_tokens == n_image
    # an image a tool returned goes into the prompt the same way
    turn = [{"role": "user", "content": "Look."}, {"role": "assistant", "content": [
        {"type": "tool_use", "id": "c1", "name": "shot", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "c1",
                                      "content": [image, text]}]}]
    again = client.messages.create(model="x", max_tokens=2, messages=turn, extra_body=GREEDY)
    assert again.usage.input_tokens + again.usage.cache_read_input_tokens > n_image
