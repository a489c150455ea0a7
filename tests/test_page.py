"""The web page at `/` in a real headless Chromium (Debian's `chromium`, driven by Playwright),
against `tandem serve` on a tiny model whose draft has the target's weights (so greedy drafts
are accepted and coloured). Without a browser the browser tests are skipped, saying so;
.ci/run installs one.

The server has an API key, so every browser test also goes through the page's key dialog.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import time

import httpx
import pytest

from tests.servers import AUTH, KEY, Server, same_weights_pair

CHROMIUM = os.environ.get("TANDEM_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
PUBLIC = ["/", "/index.html", "/sw.js", "/manifest.webmanifest", "/_app/version.json",
          "/favicon.ico", "/static/app.js", "/static/app.css", "/static/icon.svg"]


def _browser_missing() -> str | None:
    if importlib.util.find_spec("playwright") is None:
        return "Playwright for Python is not installed (pip install -e '.[test]')"
    if not os.path.exists(CHROMIUM):
        return f"no Chromium at {CHROMIUM} (Debian: apt-get install chromium; .ci/run does)"
    return None


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    d = tmp_path_factory.mktemp("page")
    target, draft = same_weights_pair(d)
    common = ["--model", str(target), "--api-key", KEY, "-t", "1"]
    # the page's server; --ignore-eos: the tiny model's answers run to max_tokens (so a long
    # one can be stopped)
    a = Server([*common, "--model-draft", str(draft), "--spec-type", "draft-simple",
                "--spec-draft-p-min", "0", "-c", "8192", "-np", "2", "--metrics",
                "--ignore-eos"], d / "page.log")
    b = Server([*common, "--no-ui"], d / "no-ui.log")
    try:
        for s in (a, b):
            s.wait_ready(120)
        yield a, b
    finally:
        a.stop()
        b.stop()


@pytest.fixture(scope="module")
def srv(servers) -> Server:
    return servers[0]


@pytest.fixture(scope="module")
def browser():
    missing = _browser_missing()
    if missing:
        pytest.skip(f"browser tests need a browser: {missing}")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        yield b
        b.close()


@pytest.fixture
def page(browser, srv):
    """A fresh browser profile (empty storage) on the page, past the API key dialog."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    pg = context.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.goto(srv.url + "/")
    pg.wait_for_selector("#key-dialog[open]", timeout=10_000)
    pg.fill("#key-input", KEY)
    pg.click("#key-save")
    pg.wait_for_function("document.querySelector('#model').textContent.includes('speculation')",
                         timeout=10_000)
    yield pg
    context.close()
    assert errors == []  # no script error on the page


def settings(pg, **values) -> None:
    for name, value in values.items():
        field = pg.locator(f"#settings [name={name}]")
        if name == "spec_type":
            field.select_option(value)
        elif isinstance(value, bool):
            field.set_checked(value)
        else:
            field.fill(str(value))


def ask(pg, text: str, timeout: float = 60_000) -> None:
    """Type a message, send it with Enter, wait until the answer's statistics show."""
    n = pg.locator(".msg.assistant .stats").count()
    pg.fill("#input", text)
    pg.press("#input", "Enter")
    pg.wait_for_function(f"document.querySelectorAll('.msg.assistant .stats').length > {n}",
                         timeout=timeout)


def stored_answer(pg) -> dict:
    """The last answer as the page keeps it in localStorage."""
    chats = json.loads(pg.evaluate("localStorage.getItem('tandem.chats')"))
    return chats[-1]["messages"][-1]


def api_answer(srv: Server, text: str, **fields) -> dict:
    r = httpx.post(f"{srv.url}/v1/chat/completions", headers=AUTH, timeout=60, json={
        "messages": [{"role": "user", "content": text}], **fields})
    assert r.status_code == 200, r.text
    return r.json()


# ---- without a browser ---------------------------------------------------------------------


def test_page_files_need_no_key_and_no_ui_turns_them_off(servers):
    a, b = servers
    for path in PUBLIC:
        r = httpx.get(a.url + path)
        assert r.status_code == 200, path
    page = httpx.get(a.url + "/")
    assert page.text.startswith("<!doctype html>") and "text/html" in page.headers["content-type"]
    assert httpx.get(a.url + "/_app/version.json").json()["version"]
    assert httpx.get(a.url + "/props").status_code == 401  # the API still wants the key
    missing = httpx.get(a.url + "/static/nothing.js")
    assert missing.status_code == 404 and "nothing.js" in missing.json()["error"]["message"]
    # a name longer than the file system allows is just not one of the page's files
    assert httpx.get(a.url + "/static/" + "x" * 300 + ".js").status_code == 404
    for path in PUBLIC:  # --no-ui: none of them, the API as before
        assert httpx.get(b.url + path, headers=AUTH).status_code == 404, path
    assert httpx.get(b.url + "/v1/models", headers=AUTH).status_code == 200


def test_chat_stream_carries_each_tokens_text_and_proposer(srv):
    """What the page reads: with return_tokens, every content chunk names its tokens, the text
    each added and who proposed it; the pieces join to the answer, the draft model's count is
    the accepted drafts, and OpenAI's fields are unchanged."""
    body = {"messages": [{"role": "user", "content": "one two three one two three"}],
            "stream": True, "return_tokens": True, "temperature": 0, "max_tokens": 40}
    chunks = []
    with httpx.stream("POST", f"{srv.url}/v1/chat/completions", json=body, headers=AUTH,
                      timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
    content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks
                      if c["choices"])
    toks = [(t, p, o) for c in chunks if "tokens" in c
            for t, p, o in zip(c["tokens"], c["pieces"], c["origins"], strict=True)]
    timings = chunks[-1]["timings"]
    assert "".join(p for _, p, _ in toks) == content
    assert len(toks) == timings["predicted_n"]
    assert sum(o == "draft" for _, _, o in toks) == timings["draft_n_accepted"] > 0
    assert {o for _, _, o in toks} == {"draft", "target"}
    plain = api_answer(srv, "one two three one two three", temperature=0, max_tokens=40)
    assert plain["choices"][0]["message"]["content"] == content
    assert "tokens" not in plain and "origins" not in plain


# ---- in the browser ------------------------------------------------------------------------


def test_answer_streams_coloured_and_is_kept_after_reload(page, srv):
    settings(page, temperature=0, max_tokens=48)
    ask(page, "Repeat after me: one two three one two three")
    shown = page.inner_text(".msg.assistant .body")
    msg = stored_answer(page)
    # the page shows the target's greedy answer, as the API gives it
    want = api_answer(srv, "Repeat after me: one two three one two three", temperature=0,
                      max_tokens=48)
    assert msg["content"] == want["choices"][0]["message"]["content"]
    assert shown.strip() == msg["content"].strip()
    # coloured: every token the draft model proposed and the target kept
    accepted = want["timings"]["draft_n_accepted"]
    assert accepted > 0
    assert sum(t[1] == "d" for t in msg["tokens"]) == accepted
    assert page.locator(".msg.assistant .tok.o-d").count() > 0
    stats = page.inner_text(".msg.assistant .stats")
    assert "tok/s" in stats and "first token" in stats
    assert f"/{want['timings']['draft_n']})" in stats and "tokens per verification" in stats
    # hovering a token names it
    title = page.locator(".msg.assistant .tok.o-d").first.get_attribute("title")
    assert title.startswith("token ") and "draft model" in title
    # kept in the browser: a reload shows the same conversation
    page.reload()
    page.wait_for_selector(".msg.assistant .stats", timeout=10_000)
    assert page.locator(".msg").count() == 2
    assert page.inner_text(".msg.assistant .body") == shown
    assert page.locator(".msg.assistant .tok.o-d").count() > 0


def test_repetition_and_probabilities(page, srv):
    """Speculation chosen on the page (suffix: repetition of earlier tokens) and token
    probabilities: repetition tokens get their own colour, hovering shows p."""
    settings(page, temperature=0, max_tokens=200, spec_type="suffix", probs=True)
    text = "one two three one two three one two three"
    ask(page, text)
    msg = stored_answer(page)
    want = api_answer(srv, text, temperature=0, max_tokens=200, **{"speculative.type": "suffix"})
    assert msg["content"] == want["choices"][0]["message"]["content"]
    # the tokens the page marks are those the server reported accepted for this answer (the
    # API's second asking may draft more: the suffix pool remembers the first answer)
    accepted = msg["stats"]["timings"]["draft_n_accepted"]
    assert sum(t[1] == "s" for t in msg["tokens"]) == accepted > 0
    assert want["timings"]["draft_n_accepted"] >= accepted
    assert page.locator(".msg.assistant .tok.o-s").count() > 0
    assert page.locator(".msg.assistant .tok.o-d").count() == 0
    title = page.locator(".msg.assistant .tok.o-s").first.get_attribute("title")
    assert "repetition (suffix)" in title and " p = " in title
    p = float(title.rsplit("p = ", 1)[1])
    assert 0.0 < p <= 1.0


def test_compare_reruns_without_speculation(page):
    settings(page, temperature=0, max_tokens=40)
    ask(page, "Write a function that adds two numbers")
    page.click(".compare-button")
    page.wait_for_selector(".compare .same", timeout=60_000)
    same = page.locator(".compare .same")
    assert same.get_attribute("data-identical") == "true"  # greedy: the same text
    text = page.inner_text(".compare")
    assert "Speculation off:" in text and "With it:" in text and "as fast" in text
    assert stored_answer(page)["compare"]["identical"] is True  # kept with the answer


def test_stop_ends_the_answer_and_frees_the_slot(page, srv):
    settings(page, temperature=0, max_tokens=3000, spec_type="none")
    page.fill("#input", "Tell me a very long story")
    page.press("#input", "Enter")
    page.wait_for_selector(".msg.assistant .tok", timeout=30_000)
    page.click("#stop")
    page.wait_for_selector(".msg.assistant .stats", timeout=10_000)
    assert "Stopped after" in page.inner_text(".msg.assistant")
    assert len(stored_answer(page)["tokens"]) < 3000
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # the server let the request go
        slots = httpx.get(f"{srv.url}/slots", headers=AUTH).json()
        if not any(s["is_processing"] for s in slots):
            break
        time.sleep(0.2)
    else:
        raise AssertionError(f"a slot is still busy after the stop: {slots}")
    settings(page, max_tokens=8)
    ask(page, "And now a short one")  # the page works on
    assert page.locator(".msg.assistant").count() == 2


def test_new_chat_and_the_list_of_conversations(page):
    settings(page, temperature=0, max_tokens=8)
    ask(page, "first conversation")
    page.click("#new-chat")
    assert page.locator(".msg").count() == 0
    ask(page, "second conversation")
    buttons = page.locator("#chat-list .open")
    assert buttons.count() == 2
    buttons.filter(has_text="first conversation").click()
    assert page.inner_text(".msg.user .body") == "first conversation"


def test_live_panel_shows_slots_and_run_acceptance(page):
    settings(page, temperature=0, max_tokens=24)
    ask(page, "count to ten")
    page.wait_for_function(
        "document.querySelector('#live').textContent.includes('Acceptance, this run')"
        " && /\\d+% \\(\\d+\\/\\d+\\)/.test(document.querySelector('#live').textContent)",
        timeout=10_000)
    live = page.inner_text("#live")
    assert "of 2" in live and "Queue" in live


def test_accessible_names_keyboard_and_a_narrow_window(page):
    unnamed = page.evaluate("""() => [...document.querySelectorAll(
        'button, input, select, textarea')].filter(el => el.offsetParent !== null
        || el.closest('dialog')).filter(el => !((el.labels && el.labels.length)
        || el.getAttribute('aria-label') || el.textContent.trim())).map(el => el.outerHTML)""")
    assert unnamed == []
    # keyboard only: the skip link leads to the message box, Enter sends
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.className") == "skip"
    page.keyboard.press("Enter")
    page.keyboard.type("hello")
    assert page.evaluate("document.activeElement.id") == "input"
    page.set_viewport_size({"width": 380, "height": 740})
    assert page.evaluate("document.documentElement.scrollWidth <= innerWidth")
    assert page.locator("#input").is_visible() and page.locator("#send").is_visible()
    assert not page.locator("#side").is_visible()
    page.click("#toggle-side")
    assert page.locator("#side").is_visible()
    assert page.get_attribute("#toggle-side", "aria-expanded") == "true"
