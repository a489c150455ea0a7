"""`tandem serve` as a real process on 127.0.0.1, with tiny GGUF models written by the test.

Two servers start once for the module:
- A: target + draft (the same weights, so greedy drafts are accepted), draft-simple, 2 slots,
  an API key;
- B: target alone, ngram-simple, 1 slot, a queue of 1 and a 4-second --timeout;
and, once those are up, a third that cannot load its model and must exit.

Both run with one torch thread (-t 1): tiny models gain nothing from more, and a shared
2-core machine makes spinning OpenMP threads twenty times slower.

The real tier starts llama-server's two documented command lines with the default pair.
"""

from __future__ import annotations

import concurrent.futures
import json
import re
import subprocess
import time

import httpx
import pytest

from tests.servers import AUTH, GREEDY, KEY, SERVE, Server, free_port, same_weights_pair

PROMPTS = [
    "def add(a, b):",
    "The quick brown fox",
    "Once upon a time there was",
    "import os\nimport sys\n",
    "for i in range(10):",
    "Summarize the following document",
]


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    d = tmp_path_factory.mktemp("server")
    target, draft = same_weights_pair(d)
    a = Server(["--model", str(target), "--model-draft", str(draft), "--ctx-size", "512",
                "--parallel", "2", "--spec-type", "draft-simple", "--spec-draft-n-max", "4",
                "--spec-draft-p-min", "0", "--api-key", KEY, "--alias", "tiny", "-t", "1",
                "--metrics"],
               d / "a.log")
    b = Server(["--model", str(target), "--ctx-size", "8192", "--parallel", "1",
                "--spec-type", "ngram-simple", "--queue-size", "1", "--timeout", "4", "-t", "1",
                "--metrics"],
               d / "b.log")
    started = [a, b]
    try:
        with concurrent.futures.ThreadPoolExecutor(2) as pool:  # both load at once
            list(pool.map(lambda s: s.wait_ready(120), (a, b)))
        # a third one that cannot load its model; it fails while the tests run
        (d / "broken.gguf").write_bytes(b"this is not a GGUF file")
        started.append(Server(["--model", str(d / "broken.gguf")], d / "broken.log"))
        yield started
    finally:
        for s in started:
            s.stop()


@pytest.fixture(scope="module")
def srv(servers) -> Server:
    return servers[0]


@pytest.fixture(scope="module")
def srv_b(servers) -> Server:
    return servers[1]


# server A wants the key; server B has none and ignores the header
def post(server: Server, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, headers=AUTH, timeout=60)


def get(server: Server, path: str) -> httpx.Response:
    return httpx.get(f"{server.url}{path}", headers=AUTH, timeout=30)


def complete(server: Server, prompt, n: int = 16, **extra) -> dict:
    """A greedy /completion, its token ids asked for (return_tokens)."""
    r = post(server, "/completion", {"prompt": prompt, "n_predict": n, "cache_prompt": False,
                                     "return_tokens": True, **GREEDY, **extra})
    assert r.status_code == 200, r.text
    return r.json()


def stream_events(server: Server, path: str, body: dict) -> list:
    """The `data:` payloads of an SSE answer, JSON-decoded ("[DONE]" kept as is)."""
    out = []
    with httpx.stream("POST", f"{server.url}{path}", json=body, headers=AUTH,
                      timeout=60) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("data: "):
                data = line[len("data: "):]
                out.append(data if data == "[DONE]" else json.loads(data))
    return out


def metrics(server: Server) -> dict[str, float]:
    """GET /metrics read by prometheus_client's own parser (so the text is valid Prometheus),
    with llama-server's names: a TYPE line for every series, counters named with _total."""
    from prometheus_client.parser import text_string_to_metric_families

    r = get(server, "/metrics")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain")
    assert int(r.headers["process-start-time-unix"]) > 0
    list(text_string_to_metric_families(r.text))  # raises on text Prometheus cannot read
    types = dict(line.split(" ")[2:4] for line in r.text.splitlines()
                 if line.startswith("# TYPE "))
    values = {}
    for line in r.text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            assert name.split("{")[0] in types, f"{name} has no TYPE line of its own"
            values[name] = float(value)
    return values


# -- startup, health, props ------------------------------------------------------------------

def test_health_is_503_while_loading_then_ok(srv, srv_b):
    for s in (srv, srv_b):
        statuses = [code for code, _ in s.health_seen]
        assert statuses[-1] == 200 and s.health_seen[-1][1] == {"status": "ok"}
        loading = [body for code, body in s.health_seen if code == 503]
        assert loading, f"the server answered only after loading: {s.health_seen}"
        assert loading[0]["error"]["message"] == "Loading model"


def test_startup_log_says_what_runs(srv, srv_b):
    log_a, log_b = srv.log(), srv_b.log()
    assert "spec type: draft-simple" in log_a
    assert "compatible: gpt2 vocabulary" in log_a
    assert "memory plan" in log_a and "fits: yes" in log_a
    assert "speculation: ON: draft-simple with draft.gguf" in log_a
    assert "speculation: ON: ngram-simple" in log_b


def test_bad_flags_fail_before_listening(tmp_path):
    t0 = time.monotonic()
    for args, message in ((["--model", str(tmp_path / "missing.gguf")], "no such file"),
                          (["--spec-type", "eagle"], "unknown spec type 'eagle'"),
                          (["--temp", "hot"], "--temp: invalid float value"),
                          (["--top-p", "2"], "top_p must be between 0 and 1")):
        r = subprocess.run([*SERVE, *args, "--port", str(free_port())], capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 2 and message in r.stderr, r.stderr
    assert time.monotonic() - t0 < 30  # no model was loaded


def test_default_pair_and_api_key_from_the_environment(monkeypatch):
    """Flags only (nothing is loaded): no --model and no --model-draft serves the default pair."""
    import argparse

    from tandem.server import cli

    monkeypatch.setenv("TANDEM_API_KEY", "from-env")

    def settings(*argv: str):
        p = argparse.ArgumentParser()
        cli.add_arguments(p)
        args = p.parse_args(list(argv))
        return cli._settings(args), args

    s, args = settings()
    assert (s.model, s.model_draft, args.spec_types) == ("default", "default-draft", None)
    assert s.spec.types == ["suffix", "draft-simple"] and s.spec.adaptive  # auto
    assert s.api_key == "from-env" and s.max_queue == 4
    s, _ = settings("--spec-type", "none", "-np", "3", "--api-key", "flag")
    assert (s.model, s.model_draft, s.api_key, s.max_queue) == ("default", None, "flag", 12)
    assert s.engine.n_parallel == 3 and not s.spec.enabled


def test_llama_server_flags_have_their_meaning(tmp_path):
    """llama-server's sampling flags are the server's defaults for what a request does not
    send; --no-slots turns /slots off; -ub caps a pass with -b; -fa and --no-jinja are accepted
    and said to have no effect. Flags only (nothing is loaded)."""
    import argparse

    from tandem.server import cli

    p = argparse.ArgumentParser()
    cli.add_arguments(p)
    a = p.parse_args(["--spec-type", "none", "--temp", "0", "--seed", "7", "-n", "32",
                      "--stop", "\n\n", "--no-slots", "-b", "2048", "-ub", "256", "-fa",
                      "--no-jinja", "--no-context-shift"])
    s = cli._settings(a)
    assert (s.sampling.temperature, s.sampling.seed, s.sampling.n_predict) == (0.0, 7, 32)
    assert s.sampling.stop == ["\n\n"] and s.sampling.top_k == 40  # the rest: llama.cpp's
    assert not s.slots_endpoint and s.engine.batch_size == 256
    assert not s.engine.context_shift  # --no-context-shift, llama-server's default
    assert cli._settings(p.parse_args(["--context-shift"])).engine.context_shift


def test_server_sampling_flags_are_request_defaults():
    """What a request does not send comes from the server's flags (here --temp 0 --seed 7
    -n 32 --stop END); what it sends wins."""
    from tandem.config import SamplingParams
    from tandem.server.prepare import n_predict_of, sampling_of
    from tandem.server.schemas import CompletionBody

    server = SamplingParams(temperature=0.0, seed=7, n_predict=32, stop=["END"])
    body = CompletionBody.model_validate({"prompt": "x"})
    got = sampling_of(body, n_predict_of(body.n_predict), server)
    assert (got.temperature, got.seed, got.n_predict, got.stop) == (0.0, 7, 32, ["END"])
    body = CompletionBody.model_validate({"prompt": "x", "temperature": 0.5, "n_predict": 4,
                                          "stop": []})
    got = sampling_of(body, n_predict_of(body.n_predict), server)
    assert (got.temperature, got.seed, got.n_predict, got.stop) == (0.5, 7, 4, [])


def test_props_models_slots(srv):
    p = get(srv, "/props").json()
    assert p["total_slots"] == 2
    assert p["model_path"].endswith("target.gguf")
    assert p["draft_model_path"].endswith("draft.gguf")
    assert p["speculative"]["type"] == "draft-simple" and p["speculative"]["n_max"] == 4
    assert p["default_generation_settings"]["n_ctx"] == 256
    assert "<|im_start|>" in p["chat_template"]
    models = get(srv, "/v1/models").json()
    assert [m["id"] for m in models["data"]] == ["tiny"]
    slots = get(srv, "/slots").json()
    assert [s["id"] for s in slots] == [0, 1]
    assert all(s["n_ctx"] == 256 and s["speculative"] for s in slots)


# -- /completion -----------------------------------------------------------------------------

def test_benchmark_request_reports_draft_stats(srv):
    """What scripts/speculative-benchmark.py sends; identical draft weights accept greedily."""
    r = complete(srv, PROMPTS[0], n=24, seed=42, stream=False)
    t = r["timings"]
    assert r["tokens_predicted"] == t["predicted_n"] == 24
    assert r["stop_type"] == "limit" and r["truncated"] is False
    assert t["draft_n"] > 0 and t["draft_n_accepted"] == t["draft_n"]
    assert t["prompt_n"] == r["tokens_evaluated"] > 0
    assert t["predicted_ms"] > 0 and t["predicted_per_second"] > 0
    assert r["speculative"]["type"] == "draft-simple"
    assert r["model"] == "tiny"


def test_speculation_does_not_change_greedy_output(srv):
    with_draft = complete(srv, PROMPTS[1], n=20)
    alone = complete(srv, PROMPTS[1], n=20, **{"speculative.type": "none"})
    ngram = complete(srv, PROMPTS[1], n=20, **{"speculative.type": "ngram-simple",
                                                "speculative.n_max": 2})
    assert alone["tokens"] == with_draft["tokens"] == ngram["tokens"]
    assert alone["content"] == with_draft["content"]
    assert "draft_n" not in alone["timings"] and with_draft["timings"]["draft_n"] > 0


def test_a_seed_gives_the_same_sampled_tokens_with_and_without_the_draft(srv):
    """llama-server's test_with_and_without_draft: temperature 0.2, top-k 5, a seed."""
    sampled = {"temperature": 0.2, "top_k": 5, "seed": 4242}
    with_draft = complete(srv, PROMPTS[0], n=16, **sampled)
    alone = complete(srv, PROMPTS[0], n=16, **sampled, **{"speculative.type": "none"})
    assert with_draft["timings"]["draft_n"] > 0
    assert with_draft["tokens"] == alone["tokens"]


def test_stream_reassembles_to_the_plain_answer(srv):
    plain = complete(srv, PROMPTS[2], n=20)
    events = stream_events(srv, "/completion", {"prompt": PROMPTS[2], "n_predict": 20,
                                                "cache_prompt": False, "stream": True,
                                                "return_tokens": True, **GREEDY})
    chunks, final = events[:-1], events[-1]
    assert len(chunks) >= 2 and all(c["stop"] is False for c in chunks)
    assert "".join(c["content"] for c in chunks) + final["content"] == plain["content"]
    assert [t for c in chunks for t in c["tokens"]] == plain["tokens"]
    assert all(len(c["from_draft"]) == len(c["tokens"]) for c in chunks)
    assert any(f for c in chunks for f in c["from_draft"])  # accepted drafts are marked
    # ... and name their proposer (server A: the draft model)
    assert all(c["origins"] == ["draft" if f else "target" for f in c["from_draft"]]
               for c in chunks)
    assert final["stop"] is True and final["timings"]["predicted_n"] == 20
    assert final["timings"]["draft_n"] > 0


def test_stop_string_cuts_the_answer_streamed_or_not(srv):
    full = complete(srv, PROMPTS[3], n=24)["content"]
    stop = full[6:9]
    cut = full[: full.index(stop)]
    r = complete(srv, PROMPTS[3], n=24, stop=[stop])
    assert (r["content"], r["stop_type"], r["stopping_word"]) == (cut, "word", stop)
    events = stream_events(srv, "/completion", {"prompt": PROMPTS[3], "n_predict": 24,
                                                "stop": [stop], "stream": True, **GREEDY})
    assert "".join(e["content"] for e in events) == cut


def test_completion_fields_as_llama_server(srv):
    """Token ids only when asked for (return_tokens), the prompt as text, has_new_line."""
    r = post(srv, "/completion", {"prompt": "def add(a, b):", "n_predict": 12, **GREEDY})
    body = r.json()
    assert r.status_code == 200 and body["tokens"] == [] and body["index"] == 0
    assert body["prompt"] == "def add(a, b):"
    assert body["has_new_line"] == ("\n" in body["content"])
    assert complete(srv, "def add(a, b):", n=12)["tokens"]  # with return_tokens
    events = stream_events(srv, "/completion", {"prompt": "def add(a, b):", "n_predict": 6,
                                                "stream": True, **GREEDY})
    assert all(e["tokens"] == [] for e in events)


def test_token_prompt_and_n_probs(srv):
    ids = post(srv, "/tokenize", {"content": PROMPTS[4]}).json()["tokens"]
    by_text = complete(srv, PROMPTS[4], n=8)
    r = complete(srv, ids, n=8, n_probs=3)
    assert r["tokens"] == by_text["tokens"]
    probs = r["completion_probabilities"]
    assert [p["id"] for p in probs] == r["tokens"]
    for p in probs:
        tops = [t["logprob"] for t in p["top_logprobs"]]
        assert len(tops) == 3 and tops == sorted(tops, reverse=True)
        assert p["top_logprobs"][0]["id"] == p["id"]  # greedy picks the most likely token
    assert post(srv, "/detokenize", {"tokens": ids}).json()["content"] == PROMPTS[4]


def test_seeded_sampling_is_reproducible(srv):
    body = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "seed": 7}
    a = complete(srv, PROMPTS[5], n=12, **body)
    b = complete(srv, PROMPTS[5], n=12, **body)
    assert a["tokens"] == b["tokens"] and a["seed"] == 7


# -- OpenAI API ------------------------------------------------------------------------------

def test_openai_client_chat_and_completions(srv):
    import openai

    client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key=KEY, max_retries=0)
    greedy = {"temperature": 0.0, "top_p": 1.0, "extra_body": {"top_k": 1}}
    messages = [{"role": "user", "content": "hi"}]
    chat = client.chat.completions.create(model="tiny", messages=messages, max_tokens=10,
                                          **greedy)
    assert chat.choices[0].finish_reason == "length"
    assert chat.usage.completion_tokens == 10
    rendered = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"  # tiny's ChatML
    n_prompt = len(post(srv, "/tokenize", {"content": rendered}).json()["tokens"])
    assert chat.usage.prompt_tokens == n_prompt
    pieces = client.chat.completions.create(model="tiny", messages=messages, max_tokens=10,
                                            stream=True, **greedy)
    everything = list(pieces)
    chunks = [c for c in everything if c.choices]  # the last one carries only the usage
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == \
        chat.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == "length"
    assert everything[-1].usage.completion_tokens == 10

    text = client.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=12, **greedy)
    assert text.choices[0].text == complete(srv, PROMPTS[0], n=12)["content"]
    assert text.usage.completion_tokens == 12
    streamed = client.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=12,
                                         stream=True, **greedy)
    assert "".join(c.choices[0].text for c in streamed) == text.choices[0].text
    assert [m.id for m in client.models.list()] == ["tiny"]


def test_apply_template_gives_the_chat_prompt(srv):
    """POST /apply-template renders the messages as the chat endpoint would prompt the model."""
    messages = [{"role": "user", "content": "hi"}]
    r = post(srv, "/apply-template", {"messages": messages})
    assert r.status_code == 200, r.text
    assert r.json() == {"prompt": "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"}
    chat = post(srv, "/v1/chat/completions", {"messages": messages, "max_tokens": 1, **GREEDY})
    ids = post(srv, "/tokenize", {"content": r.json()["prompt"]}).json()["tokens"]
    assert chat.json()["usage"]["prompt_tokens"] == len(ids)
    assert post(srv, "/apply-template", {"messages": []}).status_code == 400


def test_chat_stream_ends_with_done(srv):
    events = stream_events(srv, "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4, "stream": True,
        **GREEDY})
    assert events[-1] == "[DONE]"
    first, finish, last = events[0], events[-3], events[-2]
    # as llama-server: the role first (content null), the finish reason with an empty delta,
    # then usage and timings in a chunk of their own with no choices
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": None}
    assert finish["choices"][0]["finish_reason"] == "length" and finish["choices"][0]["delta"] == {}
    assert "usage" not in finish
    assert last["object"] == "chat.completion.chunk" and last["choices"] == []
    assert last["usage"]["completion_tokens"] == 4 and "draft_n" in last["timings"]
    assert all(re.fullmatch(r"b.+-tandem", e["system_fingerprint"]) for e in events[:-1])
    quiet = stream_events(srv, "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4, "stream": True,
        "stream_options": {"include_usage": False}, **GREEDY})
    assert quiet[-1] == "[DONE]" and not any("usage" in e for e in quiet[:-1])


# -- slots working together ------------------------------------------------------------------

def test_two_slots_six_requests_match_sequential_runs(srv):
    before = metrics(srv)
    alone = [complete(srv, p, n=16) for p in PROMPTS]
    middle = metrics(srv)
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        together = list(pool.map(lambda p: complete(srv, p, n=16), PROMPTS))
    after = metrics(srv)
    assert [r["content"] for r in together] == [r["content"] for r in alone]
    assert [r["tokens"] for r in together] == [r["tokens"] for r in alone]
    assert {r["id_slot"] for r in together} == {0, 1}

    def delta(name: str, a: dict, b: dict) -> float:
        return b.get(name, 0.0) - a.get(name, 0.0)

    for results, a, b in ((alone, before, middle), (together, middle, after)):
        assert delta("llamacpp:tokens_predicted_total", a, b) == \
            sum(r["tokens_predicted"] for r in results)
        assert delta("llamacpp:prompt_tokens_total", a, b) == \
            sum(r["timings"]["prompt_n"] for r in results)
        assert delta("llamacpp:spec_decode_num_draft_tokens_total", a, b) == \
            sum(r["timings"]["draft_n"] for r in results)
        assert delta("llamacpp:spec_decode_num_accepted_tokens_total", a, b) == \
            sum(r["timings"]["draft_n_accepted"] for r in results)
        assert delta("llamacpp:spec_decode_num_drafts_total", a, b) == \
            sum(r["speculative"]["n_drafts"] for r in results)
        assert delta('llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="0"}',
                     a, b) == sum(r["speculative"]["accepted_per_pos"][0] for r in results)
    # batched: two slots share each forward pass, so fewer passes for the same work
    assert delta("llamacpp:n_decode_total", middle, after) < \
        delta("llamacpp:n_decode_total", before, middle)
    assert after["llamacpp:requests_processing"] == 0 and after["llamacpp:requests_deferred"] == 0


def wait_slot_free(server: Server) -> None:
    deadline = time.monotonic() + 10
    while get(server, "/slots").json()[0]["is_processing"]:
        assert time.monotonic() < deadline, "the slot stayed busy after the client left"
        time.sleep(0.05)


def test_disconnected_client_frees_its_slot(srv_b):
    """Server B's single slot: requests that would run for seconds, left early."""
    body = {"prompt": PROMPTS[0], "n_predict": -1, "ignore_eos": True, "stream": True, **GREEDY}
    with httpx.stream("POST", f"{srv_b.url}/completion", json=body, timeout=60) as r:
        lines = r.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))
        slots = get(srv_b, "/slots").json()
        assert slots[0]["is_processing"]
        task = slots[0]["id_task"]
    wait_slot_free(srv_b)
    assert f"request {task} cancelled (client went away)" in srv_b.log()

    with pytest.raises(httpx.ReadTimeout):  # not streamed: the client gives up waiting
        httpx.post(f"{srv_b.url}/completion", json={**body, "stream": False}, timeout=0.5)
    wait_slot_free(srv_b)
    assert f"request {task + 1} cancelled (client went away)" in srv_b.log()
    assert metrics(srv_b)["llamacpp:requests_processing"] == 0
    assert complete(srv_b, PROMPTS[1], n=4)["tokens_predicted"] == 4


# -- errors ----------------------------------------------------------------------------------

BAD_REQUESTS = [
    # (path, raw body or JSON, extra headers, status, part of the message)
    ("/completion", b"{not json", {}, 400, "not valid JSON"),
    ("/completion", [1, 2], {}, 400, "JSON object"),
    ("/completion", {"prompt": "x", "temperature": "hot"}, {}, 400, "temperature"),
    ("/completion", {"prompt": "x", "n_predict": True}, {}, 400, "n_predict"),
    ("/completion", {"prompt": "x", "top_p": 1.5}, {}, 400, "top_p"),
    ("/completion", {"prompt": "x", "min_p": -0.1}, {}, 400, "min_p"),
    ("/completion", {"prompt": "x", "temperature": -1}, {}, 400, "temperature"),
    ("/completion", {"prompt": "x", "n_predict": -2}, {}, 400, "n_predict"),
    ("/completion", {"prompt": "hello " * 400}, {}, 400, "--ctx-size"),
    ("/completion", {"prompt": ""}, {}, 400, "empty"),
    ("/completion", {"prompt": [10**6]}, {}, 400, "outside the vocabulary"),
    ("/completion", {"n_predict": 4}, {}, 400, "prompt"),
    ("/completion", {"prompt": "x", "speculative.type": "eagle"}, {}, 400, "eagle"),
    ("/completion", {"prompt": "x", "id_slot": 5}, {}, 400, "id_slot 5"),
    ("/v1/chat/completions", {"messages": []}, {}, 400, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "x"}]}, {}, 400, "role"),
    ("/v1/completions", {"prompt": "x", "n": 17}, {}, 400, "at most 16"),
    ("/v1/completions", {"prompt": "x", "n": 2, "stream": True}, {}, 400, "without streaming"),
    ("/completion", {"prompt": [[1, 2], 3]}, {}, 400, "mixing token ids"),
    ("/completion", {"prompt": {"prompt_string": "x", "multimodal_data": ["AA=="]}}, {}, 400,
     "multimodal"),
    ("/completion", {"prompt": "x"}, {"Authorization": "Bearer wrong"}, 401, "invalid API key"),
    ("/completion", {"prompt": "x"}, {"Authorization": ""}, 401, "missing API key"),
    # constraints Tandem cannot compile are refused by name, never answered unconstrained
    ("/completion", {"prompt": "x", "grammar": "root ::= this is (not valid"}, {}, 400,
     "grammar: not a valid GBNF grammar"),
    ("/completion", {"prompt": "x", "json_schema": {"type": "hiccup"}}, {}, 400,
     "json_schema: Invalid type"),
    ("/completion", {"prompt": "x", "json_schema": 123}, {}, 400, "json_schema"),
    ("/completion", {"prompt": "x", "logit_bias": [[10**6, -100]]}, {}, 400,
     "logit_bias[0]: token id 1000000 is outside the vocabulary"),
    ("/completion", {"prompt": "x", "logit_bias": [[15, "lots"]]}, {}, 400,
     "logit_bias[0]: the bias must be a number"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                              "response_format": {"type": "json_object", "schema": 123}}, {}, 400,
     "response_format.schema"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                              "response_format": {"type": "yaml"}}, {}, 400,
     "response_format: expected type"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                              "response_format": {"type": "json_schema"}}, {}, 400,
     "response_format.json_schema: expected an object with a 'schema'"),
    ("/nowhere", {}, {}, 404, "no such endpoint"),
    ("/completion", b"[" + b"1," * (6 * 1024 * 1024) + b"1]", {}, 413, "larger than 10 MB"),
]


@pytest.mark.parametrize("path,body,headers,status,message", BAD_REQUESTS,
                         ids=[f"{i}-{b[3]}" for i, b in enumerate(BAD_REQUESTS)])
def test_bad_request_gets_its_status(srv, path, body, headers, status, message):
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = httpx.post(f"{srv.url}{path}", content=content, timeout=30,
                   headers={**AUTH, "Content-Type": "application/json", **headers})
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert message in err["message"] and err["code"] == status and err["type"]
    assert httpx.get(f"{srv.url}/health").status_code == 200


def test_a_limit_beyond_the_context_runs_until_the_context_is_full(srv):
    """As llama-server: n_predict larger than the context is accepted, and generation stops
    when the slot's context (256 tokens on server A) is full."""
    r = complete(srv, "def add(a, b):", n=10**6, ignore_eos=True)
    assert r["stop_type"] == "limit"
    assert r["tokens_evaluated"] + r["tokens_predicted"] == 256


def test_a_prompt_over_the_context_says_how_long_each_is(srv):
    r = post(srv, "/completion", {"prompt": "hello " * 400})
    err = r.json()["error"]
    assert r.status_code == 400 and err["type"] == "exceed_context_size_error"
    assert err["n_ctx"] == 256 and err["n_prompt_tokens"] > 256


def test_empty_or_plain_text_forms_of_those_fields_are_accepted(srv):
    r = post(srv, "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                                           "max_tokens": 2, "response_format": {"type": "text"},
                                           "logit_bias": {}, "tools": [], **GREEDY})
    assert r.status_code == 200, r.text


def test_browsers_on_another_origin_may_call_the_api(srv):
    """CORS as llama-server: a preflight is answered without the key, and answers (errors
    too) carry Access-Control-Allow-Origin."""
    origin = {"Origin": "http://localhost:5173"}
    pre = httpx.options(f"{srv.url}/v1/chat/completions", timeout=10, headers={
        **origin, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type"})
    assert pre.status_code == 200, pre.text
    assert pre.headers["access-control-allow-origin"] in ("*", origin["Origin"])
    assert "POST" in pre.headers["access-control-allow-methods"]
    ok = httpx.post(f"{srv.url}/tokenize", json={"content": "hi"}, headers={**AUTH, **origin},
                    timeout=10)
    assert ok.status_code == 200 and "access-control-allow-origin" in ok.headers
    denied = httpx.post(f"{srv.url}/tokenize", json={"content": "hi"}, headers=origin, timeout=10)
    assert denied.status_code == 401 and "access-control-allow-origin" in denied.headers


def test_health_needs_no_key_but_metrics_does(srv):
    assert httpx.get(f"{srv.url}/health").status_code == 200
    r = httpx.get(f"{srv.url}/metrics")
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"


def test_every_api_route_needs_the_key(srv):
    """Every route the OpenAPI description lists, but /health and the page's own files,
    answers 401 without the key or with a wrong one, whatever the body."""
    spec = httpx.get(f"{srv.url}/openapi.json", headers=AUTH).json()
    assert httpx.get(f"{srv.url}/openapi.json").status_code == 401
    open_ = {"/health", "/v1/health", "/", "/index.html", "/sw.js", "/manifest.webmanifest",
             "/_app/version.json", "/favicon.ico", "/static/{name}"}
    checked = 0
    for path, ops in spec["paths"].items():
        for method in ops:
            url = srv.url + path.replace("{id_slot}", "0").replace("{name}", "app.js")
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"X-Api-Key": "wrong"}):
                r = httpx.request(method.upper(), url, json={}, headers=headers, timeout=10)
                if path in open_:
                    assert r.status_code == 200, (method, path)
                else:
                    assert r.status_code == 401, (method, path, r.status_code)
                    assert r.json()["error"]["type"] == "authentication_error"
                checked += 1
    assert checked >= 3 * 25


# -- server B: n-gram speculation, no draft, a queue of one, a short timeout --------------------

def test_ngram_benchmark_request_reports_draft_stats(srv_b):
    prompt = "a b c d e f a b c d e f a b c d e f a b c"
    r = complete(srv_b, prompt, n=16)
    assert r["timings"]["draft_n"] > 0 and "draft_n_accepted" in r["timings"]
    assert r["speculative"]["type"] == "ngram-simple"
    assert r["tokens"] == complete(srv_b, prompt, n=16, **{"speculative.type": "none"})["tokens"]


def test_draft_simple_without_a_draft_is_refused(srv_b):
    r = post(srv_b, "/completion", {"prompt": "x", "speculative.type": "draft-simple"})
    assert r.status_code == 400 and "--model-draft" in r.json()["error"]["message"]


def test_full_queue_answers_503(srv_b):
    long = {"prompt": PROMPTS[0], "n_predict": -1, "ignore_eos": True, "stream": True, **GREEDY}
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        with httpx.stream("POST", f"{srv_b.url}/completion", json=long, timeout=60) as r:
            lines = r.iter_lines()  # kept: dropping it would close the connection
            assert next(line for line in lines if line.startswith("data: "))  # slot busy
            queued = pool.submit(complete, srv_b, PROMPTS[1], 2)
            deadline = time.monotonic() + 3
            while metrics(srv_b)["llamacpp:requests_deferred"] < 1:
                assert time.monotonic() < deadline, "the second request never queued"
                time.sleep(0.02)
            busy = post(srv_b, "/completion", {"prompt": "x", "n_predict": 2})
            assert busy.status_code == 503, busy.text
            assert "busy" in busy.json()["error"]["message"]
            # a refused request with several answers leaves none of them queued
            several = post(srv_b, "/completion", {"prompt": ["x", "y", "z"], "n_predict": 2})
            assert several.status_code == 503
            assert metrics(srv_b)["llamacpp:requests_deferred"] == 1
        # the long stream's client left: its slot goes to the queued request
        assert queued.result()["tokens_predicted"] == 2
    assert httpx.get(f"{srv_b.url}/health").status_code == 200


def test_more_answers_than_the_queue_holds_are_served_when_nothing_waits(srv_b):
    # server B: one slot, a queue of one; five prompts' answers come back in order
    r = post(srv_b, "/completion", {"prompt": PROMPTS[:5], "n_predict": 3, **GREEDY})
    assert r.status_code == 200, r.text
    assert [a["content"] for a in r.json()] == [complete(srv_b, p, n=3)["content"]
                                               for p in PROMPTS[:5]]
    too_many = post(srv_b, "/v1/completions", {"prompt": ["x"] * 5, "n": 16, "max_tokens": 1})
    assert too_many.status_code == 400 and "at most 64" in too_many.json()["error"]["message"]


def test_timeout_ends_a_long_stream_with_an_error(srv_b):
    long = {"prompt": PROMPTS[0], "n_predict": -1, "ignore_eos": True, "stream": True, **GREEDY}
    t0 = time.monotonic()
    events = stream_events(srv_b, "/completion", long)
    assert 3.5 < time.monotonic() - t0 < 20
    assert events[-1]["error"]["code"] == 408 and "--timeout" in events[-1]["error"]["message"]
    assert len(events) > 1 and events[0]["stop"] is False  # it was generating until then
    assert complete(srv_b, PROMPTS[1], n=2)["tokens_predicted"] == 2


def test_a_model_that_fails_to_load_stops_the_server(servers):
    broken = servers[2]  # started after A and B were ready; last here, so it had time
    assert broken.proc.wait(timeout=60) == 2
    assert "error:" in broken.log() and "broken.gguf" in broken.log()


# -- real models: llama-server's command lines, only the program name changed ------------------

@pytest.mark.real
@pytest.mark.parametrize("spec", ["none", "draft-simple"])
def test_real_command_lines(tmp_path, spec):
    from tandem import registry

    target = registry.pull("default")
    args = ["--model", str(target), "--ctx-size", "8192", "--parallel", "1"]
    if spec == "draft-simple":
        args += ["--model-draft", str(registry.pull("default-draft")), "--spec-type",
                 "draft-simple", "--spec-draft-n-max", "4"]
    else:
        args += ["--spec-type", "none"]
    s = Server(args, tmp_path / "server.log")
    try:
        s.wait_ready(300)
        r = httpx.post(f"{s.url}/completion", timeout=120, json={
            "prompt": "def fibonacci(n):", "n_predict": 8, "cache_prompt": False, **GREEDY})
        assert r.status_code == 200, r.text
        out = r.json()
        assert out["tokens_predicted"] == 8 and out["content"].strip()
        assert ("draft_n" in out["timings"]) == (spec == "draft-simple")
        assert re.search(rf"speculation: {'ON' if spec != 'none' else 'OFF'}", s.log())
    finally:
        s.stop()
