"""OpenAI's Responses API (server/responses.py): POST /v1/responses through the official openai
package, plain and streamed, with function tools and a round trip of a call and its output.

What a user would notice: an answer that differs from the chat endpoint's for the same
conversation; streamed deltas that do not join to the final text; events the openai package
cannot assemble; a call's arguments that arrive only at the end; a call or its output that
never reaches the prompt; a bad request answered with anything but a 400 naming its field."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import httpx
import jsonschema
import pytest

from tests import tiny
from tests.servers import Server

openai = pytest.importorskip("openai")

# a template with a place for tools, the assistant's calls and the tools' outputs (Hermes')
TEMPLATE = (
    "{% if tools %}<|im_start|>system\n<tools>{% for t in tools %}\n{{ t | tojson }}{% endfor %}"
    "\n</tools><|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content or '' }}"
    "{% for c in m.tool_calls or [] %}<tool_call>\n"
    "{\"name\": \"{{ c.function.name }}\", \"arguments\": {{ c.function.arguments | tojson }}}"
    "\n</tool_call>{% endfor %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
TIME = {"type": "function", "name": "get_time", "description": "The time in a zone",
        "parameters": {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}},
                       "required": ["zone"], "additionalProperties": False}, "strict": True}
WEATHER = {"type": "function", "name": "get_weather",
           "parameters": {"type": "object", "properties": {"unit": {"enum": ["C", "F"]}},
                          "required": ["unit"], "additionalProperties": False}}
QUESTION = "What is the best book?"
CALLS = 200  # tokens enough for a whole call: the tiny vocabulary spells its tags in bytes


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    d: Path = tmp_path_factory.mktemp("responses")
    path = tiny.write_gguf(tiny.hf_model("qwen2", seed=3), d / "target.gguf", "qwen2")
    (d / "template.jinja").write_text(TEMPLATE)
    s = Server(["--model", str(path), "--ctx-size", "1024", "-t", "1",
                "--chat-template-file", str(d / "template.jinja")], d / "s.log")
    try:
        s.wait_ready(120)
        yield s
    finally:
        s.stop()


def _client(s: Server):
    return openai.OpenAI(base_url=f"{s.url}/v1", api_key="none", max_retries=0)


def _post(s: Server, path: str, body: dict) -> dict:
    r = httpx.post(f"{s.url}{path}", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def _events(s: Server, body: dict) -> list[tuple[str, dict]]:
    """A streamed response's (event name, data) pairs."""
    out, name = [], None
    with httpx.stream("POST", f"{s.url}/v1/responses", json={**body, "stream": True},
                      timeout=120) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                out.append((name, json.loads(line[6:])))
                name = None
    return out


# ---- answers -----------------------------------------------------------------------------------


def test_a_response_answers_as_the_chat_endpoint_does(srv):
    client = _client(srv)
    r = client.responses.create(model="x", instructions="Be brief.",
                                input=[{"role": "user", "content": QUESTION}],
                                max_output_tokens=12, temperature=0)
    chat = _post(srv, "/v1/chat/completions", {
        "messages": [{"role": "system", "content": "Be brief."},
                     {"role": "user", "content": QUESTION}], "max_tokens": 12,
        "temperature": 0})
    assert r.id.startswith("resp_") and r.object == "response"
    assert [o.type for o in r.output] == ["message"] and r.output[0].id.startswith("msg_")
    assert r.output_text and r.output_text == chat["choices"][0]["message"]["content"]
    assert chat["choices"][0]["finish_reason"] == "length"  # cut by the limit: incomplete
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert (r.usage.input_tokens, r.usage.output_tokens, r.usage.total_tokens) == \
        (chat["usage"]["prompt_tokens"], 12, chat["usage"]["prompt_tokens"] + 12)
    # a string input is one user message; llama-server's timings come along
    plain = _post(srv, "/responses", {"input": QUESTION, "max_output_tokens": 12,
                                      "temperature": 0})
    alone = _post(srv, "/v1/chat/completions", {
        "messages": [{"role": "user", "content": QUESTION}], "max_tokens": 12,
        "temperature": 0})
    assert plain["output"][0]["content"][0]["text"] == alone["choices"][0]["message"]["content"]
    assert plain["timings"]["predicted_n"] == plain["usage"]["output_tokens"] == 12
    assert plain["usage"]["input_tokens_details"]["cached_tokens"] == \
        plain["timings"]["cache_n"]


def test_a_streamed_response_is_typed_events_that_join_to_the_answer(srv):
    body = {"input": QUESTION, "max_output_tokens": 12, "temperature": 0}
    events = _events(srv, body)
    assert all(name == data["type"] for name, data in events)
    assert [d["sequence_number"] for _, d in events] == list(range(len(events)))
    types = [name for name, _ in events]
    n = types.count("response.output_text.delta")
    assert n >= 2, types
    assert types == ["response.created", "response.in_progress", "response.output_item.added",
                     "response.content_part.added", *["response.output_text.delta"] * n,
                     "response.output_text.done", "response.content_part.done",
                     "response.output_item.done", "response.completed"]
    msg = events[2][1]["item"]["id"]
    assert msg.startswith("msg_") and all(d.get("item_id", msg) == msg for _, d in events)
    text = "".join(d["delta"] for name, d in events if name == "response.output_text.delta")
    done = events[-1][1]
    plain = _post(srv, "/v1/responses", body)
    assert text == done["response"]["output"][0]["content"][0]["text"] == \
        plain["output"][0]["content"][0]["text"]
    assert done["response"]["status"] == "incomplete" and done["response"]["usage"] == \
        {**plain["usage"], "input_tokens_details": done["response"]["usage"][
            "input_tokens_details"]}
    assert events[0][1]["response"]["id"] == done["response"]["id"]
    # the openai package reads the same stream, by create(stream=True) and by stream()
    client = _client(srv)
    seen = "".join(e.delta for e in client.responses.create(model="x", stream=True, **body)
                   if e.type == "response.output_text.delta")
    with client.responses.stream(model="x", **body) as s:
        snapshots = [e.snapshot for e in s if e.type == "response.output_text.delta"]
        final = s.get_final_response()
    assert seen == snapshots[-1] == final.output_text == text


def test_progress_and_timings_per_token_ride_on_the_events(srv):
    events = _events(srv, {"input": "This is a test. " * 12, "max_output_tokens": 6,
                           "temperature": 0, "return_progress": True,
                           "timings_per_token": True, "cache_prompt": False})
    progress = [d["prompt_progress"] for _, d in events if "prompt_progress" in d]
    assert progress and all(name == "response.in_progress"
                            for name, d in events if "prompt_progress" in d)
    done = events[-1][1]
    assert progress[-1]["processed"] == progress[-1]["total"] == \
        done["response"]["usage"]["input_tokens"]
    predicted = [d["timings"]["predicted_n"] for name, d in events
                 if name == "response.output_text.delta"]
    assert len(predicted) >= 2 and predicted == sorted(predicted)
    assert done["type"] == "response.completed"
    assert done["timings"]["predicted_n"] == done["response"]["usage"]["output_tokens"] == 6


# ---- function tools ----------------------------------------------------------------------------


def test_a_required_call_streams_its_arguments_as_generated(srv):
    client = _client(srv)
    ask = dict(model="x", input="What time is it in Paris?", tools=[TIME, WEATHER],
               tool_choice="required", max_output_tokens=CALLS, temperature=0)
    with client.responses.stream(**ask) as s:
        events = list(s)
        final = s.get_final_response()
    assert final.status == "completed"
    [call] = [o for o in final.output if o.type == "function_call"]
    tool = {"get_time": TIME, "get_weather": WEATHER}[call.name]
    jsonschema.validate(json.loads(call.arguments), tool["parameters"])
    assert call.call_id.startswith("call_") and call.id.startswith("fc_")
    deltas = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    assert len(deltas) >= 3 and "".join(deltas) == call.arguments
    [args_done] = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert args_done.arguments == call.arguments
    # the same request unstreamed: the same call
    plain = client.responses.create(**ask)
    assert [(o.type, o.name, o.arguments) for o in plain.output] == \
        [("function_call", call.name, call.arguments)]
    # a named function, in the Responses API's flat shape
    named = client.responses.create(**{**ask, "tool_choice": {"type": "function",
                                                              "name": "get_weather"}})
    assert [o.name for o in named.output] == ["get_weather"]
    assert json.loads(named.output[0].arguments)["unit"] in ("C", "F")


def test_a_call_and_its_output_go_back_into_the_prompt(srv):
    client = _client(srv)
    first = client.responses.create(model="x", input=QUESTION, tools=[TIME],
                                    tool_choice="required", max_output_tokens=CALLS,
                                    temperature=0)
    [call] = first.output
    history = [{"role": "user", "content": QUESTION},
               *[o.model_dump(exclude_none=True) for o in first.output],
               {"type": "function_call_output", "call_id": call.call_id, "output": "12:00"}]
    again = client.responses.create(model="x", input=history, tools=[TIME],
                                    max_output_tokens=8, temperature=0)
    assert again.output[-1].type == "message" and again.output_text
    # the prompt is the chat endpoint's for the same conversation: the call, then its output
    messages = [{"role": "user", "content": QUESTION},
                {"role": "assistant", "content": None, "tool_calls": [{
                    "id": call.call_id, "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments}}]},
                {"role": "tool", "tool_call_id": call.call_id, "content": "12:00"}]
    chat_tools = [{"type": "function", "function": {k: v for k, v in TIME.items()
                                                    if k != "type"}}]
    prompt = _post(srv, "/apply-template", {"messages": messages, "tools": chat_tools})["prompt"]
    assert "<tool_call>" in prompt and "12:00" in prompt and call.arguments in prompt
    count = _post(srv, "/v1/chat/completions/input_tokens",
                  {"messages": messages, "tools": chat_tools})["input_tokens"]
    assert again.usage.input_tokens == count
    assert _post(srv, "/v1/responses/input_tokens",
                 {"input": history, "tools": [TIME]})["input_tokens"] == count


# ---- refusals ----------------------------------------------------------------------------------


@pytest.mark.parametrize("body,where", [
    ({"input": [{"type": "function_call_output", "call_id": "call_1", "output": "x"}]},
     "input[0].call_id"),
    ({"input": [{"role": "user", "content": "hi"},
                {"type": "function_call", "call_id": "call_2", "name": "f", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "call_3", "output": "x"}]},
     "input[2].call_id"),
    ({"input": [{"role": "user", "content": "hi"}, {"type": "web_search_call"}]}, "input[1]"),
    ({"input": ["hi"]}, "input[0]"),
    ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
     "input[0].content[0]"),
    ({"input": [{"role": "tool", "content": "x"}]}, "input[0].role"),
    ({"input": 5}, "input"),
    ({}, "input"),
    ({"input": "hi", "previous_response_id": "resp_1"}, "previous_response_id"),
    ({"input": "hi", "tools": [{"type": "function"}]}, "tools[0].name"),
    ({"input": "hi", "tool_choice": {"type": "file_search"}}, "tool_choice"),
    ({"input": "hi", "tool_choice": "required"}, "tool_choice"),
    ({"input": "hi", "max_output_tokens": 0}, "max_output_tokens"),
    ({"input": "hi", "temperature": "hot"}, "temperature"),
    ({"input": "hi", "text": {"format": {"type": "json_schema"}}}, "text.format.schema"),
])
def test_bad_requests_are_400s_naming_the_field(srv, body, where):
    r = httpx.post(f"{srv.url}/v1/responses", json=body, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["code"] == 400
    assert f"{where}:" in err["message"], err["message"]


def test_the_openai_package_sees_the_refusal(srv):
    with pytest.raises(openai.BadRequestError, match=r"input\[1\]\.call_id"):
        _client(srv).responses.create(model="x", input=[
            {"role": "user", "content": "hi"},
            {"type": "function_call_output", "call_id": "call_9", "output": "x"}])


# ---- the conversion and the stream, without a model ------------------------------------------


def test_a_request_becomes_the_chat_request_it_means():
    from tandem.server.responses import to_chat

    chat = to_chat({
        "model": "m", "instructions": "Be kind.", "max_output_tokens": 30, "temperature": 0.5,
        "speculative.n_max": 4, "tools": [TIME, {"type": "web_search"}],
        "tool_choice": {"type": "function", "name": "get_time"},
        "text": {"format": {"type": "json_schema", "name": "t", "schema": {"type": "object"}}},
        "input": [
            {"role": "developer", "content": [{"type": "input_text", "text": "Rules."}]},
            {"type": "message", "role": "user", "content": [
                {"type": "input_text", "text": "Look: "},
                {"type": "input_image", "image_url": "data:image/png;base64,AAAA"}]},
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {"type": "message", "role": "assistant", "content": [
                {"type": "output_text", "text": "Let me see.", "annotations": []}]},
            {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "get_time",
             "arguments": "{\"zone\": \"UTC\"}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "12:00"},
            {"role": "user", "content": "Thanks."}]})
    assert chat == {
        "model": "m", "temperature": 0.5, "speculative.n_max": 4, "max_tokens": 30,
        "tools": [{"type": "function", "function": {k: v for k, v in TIME.items()
                                                    if k != "type"}}],
        "tool_choice": {"type": "function", "function": {"name": "get_time"}},
        "response_format": {"type": "json_schema",
                            "json_schema": {"name": "t", "schema": {"type": "object"}}},
        "messages": [
            {"role": "system", "content": "Be kind."},
            {"role": "developer", "content": [{"type": "text", "text": "Rules."}]},
            {"role": "user", "content": [
                {"type": "text", "text": "Look: "},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]},
            {"role": "assistant", "content": "Let me see.", "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": "get_time", "arguments": "{\"zone\": \"UTC\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "12:00"},
            {"role": "user", "content": "Thanks."}]}


def test_thinking_text_and_a_call_stream_as_items_in_order():
    """The parts of an answer as three items: reasoning, message, function_call, each opened,
    filled as its parts come and closed before the next, the whole in response.completed."""
    from tandem.server import responses, tools
    from tandem.server.oai import ChatRun
    from tandem.server.schemas import ChatBody
    from tandem.server.worker import Delta, Done

    plan = tools.ToolPlan([{"type": "function", "function": {"name": "f"}}], None, True)
    run = ChatRun([], plan, False, [])
    chat = ChatBody.model_validate({"messages": [{"role": "user", "content": "x"}]})
    state = SimpleNamespace(engine=SimpleNamespace(tok=SimpleNamespace(
        encode=lambda text, add_special: list(text))))
    events = responses._Events(state, {"id": "resp_1"}, chat, run)
    text = ('<think>Hmm, time.</think>\nLet me check.\n<tool_call>\n'
            '{"name": "f", "arguments": {"zone": "UTC"}}\n</tool_call>')
    out = []
    for i in range(0, len(text), 5):
        out += events.render(Delta(text[i:i + 5], [], [], [], []))
    out += events.render(Done({"stop_type": "eos", "tokens_evaluated": 3,
                               "tokens_predicted": 9, "timings": {"cache_n": 1}}))
    assert [d["sequence_number"] for _, d in out] == list(range(len(out)))
    added = [(d["output_index"], d["item"]["type"]) for n, d in out
             if n == "response.output_item.added"]
    closed = [(d["output_index"], d["item"]["type"]) for n, d in out
              if n == "response.output_item.done"]
    assert added == closed == [(0, "reasoning"), (1, "message"), (2, "function_call")]
    names = [n for n, _ in out]
    assert names.index("response.output_item.done") < names.index("response.content_part.added")

    def joined(kind: str, index: int) -> str:
        return "".join(d["delta"] for n, d in out if n == kind and d["output_index"] == index)

    assert joined("response.reasoning_text.delta", 0) == "Hmm, time."
    assert joined("response.output_text.delta", 1).strip() == "Let me check."
    assert joined("response.function_call_arguments.delta", 2) == '{"zone": "UTC"}'
    response = out[-1][1]["response"]
    assert out[-1][0] == "response.completed" and response["status"] == "completed"
    reasoning, message, call = response["output"]
    assert reasoning["content"][0]["text"] == "Hmm, time."
    assert message["content"][0]["text"].strip() == "Let me check."
    assert (call["name"], call["arguments"], call["status"]) == ("f", '{"zone": "UTC"}',
                                                                 "completed")
    assert response["usage"]["output_tokens_details"]["reasoning_tokens"] == len("Hmm, time.")


def test_any_json_in_any_field_is_a_request_or_a_400():
    """Random JSON values in each field the conversion reads, and in an input item's: a chat
    request or a 400 naming a field, never another exception (a 500)."""
    from hypothesis import HealthCheck, given, settings, strategies as st

    from tandem.server.responses import chat_body
    from tandem.server.schemas import ApiError

    value = st.recursive(
        st.none() | st.booleans() | st.integers(-3, 3) | st.text(max_size=6)
        | st.sampled_from(["message", "function_call", "function_call_output", "user",
                           "assistant", "input_text", "input_image", "function", "call_1"]),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
            st.sampled_from(["type", "role", "content", "text", "call_id", "name",
                             "arguments", "output", "image_url", "format", "function"]),
            inner, max_size=4), max_leaves=10)
    fields = ["input", "instructions", "tools", "tool_choice", "max_output_tokens", "text",
              "temperature", "stream"]

    @settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.dictionaries(st.sampled_from(fields), value, max_size=4),
           st.lists(value, max_size=3))
    def one(body, items):
        for data in (body, {**body, "input": items}):
            try:
                chat_body(data)
            except ApiError as e:
                assert e.status == 400 and ": " in e.message

    one()
