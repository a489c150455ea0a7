"""LM Studio's workflow on the page of a router (`tandem serve --models-dir`), in a real headless
Chromium: pick the target, see the drafts `tandem check` accepts for it (the others greyed out
with the rule that refuses them), the memory plan of the pair, load, chat, compare without
speculation. Tiny generated models: a qwen2 target, a draft with its weights (its greedy drafts
are all accepted), and a llama model whose tokenizer adds BOS (check's add_bos rule)."""

from __future__ import annotations

import httpx
import pytest

from tests import tiny
from tests.servers import AUTH, KEY, Server
from tests.test_page import ask, browser, settings, stored_answer  # noqa: F401 (fixture)


@pytest.fixture(scope="module")
def router(tmp_path_factory):
    d = tmp_path_factory.mktemp("router-page")
    models = d / "models"
    models.mkdir()
    same = tiny.hf_model("qwen2", seed=0)
    tiny.write_gguf(same, models / "target.gguf", "qwen2")
    tiny.write_gguf(same, models / "draft.gguf", "qwen2")
    tiny.write_gguf(tiny.hf_model("llama", seed=3), models / "llama.gguf", "llama")
    s = Server(["--models-dir", str(models), "--api-key", KEY, "-t", "1", "-c", "1024",
                "--spec-draft-p-min", "0"], d / "router.log")
    try:
        s.wait_ready(120)
        yield s
    finally:
        s.stop()


def test_drafts_for_a_target_name_the_rule_that_refuses_each(router):
    r = httpx.get(f"{router.url}/models/drafts", params={"model": "target"}, headers=AUTH,
                  timeout=60)
    assert r.status_code == 200, r.text
    rows = {x["id"]: x for x in r.json()["data"]}
    assert rows["draft"]["accepted"] and rows["draft"]["plan"]["fits"]
    assert [m["role"] for m in rows["draft"]["plan"]["models"]] == ["target", "draft"]
    assert rows["llama"]["rule"] == "add_bos" and not rows["llama"]["accepted"]
    assert rows["target"]["rule"] == "the target itself"
    missing = httpx.get(f"{router.url}/models/drafts", params={"model": "nope"}, headers=AUTH)
    assert missing.status_code == 404 and "'nope' not found" in missing.json()["error"]["message"]
    assert httpx.get(f"{router.url}/models/drafts?model=target").status_code == 401  # the key


def test_pick_the_target_and_a_compatible_draft_then_chat_and_compare(router, browser):
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    pg = context.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    try:
        pg.goto(router.url + "/")
        pg.wait_for_selector("#key-dialog[open]", timeout=10_000)
        pg.fill("#key-input", KEY)
        pg.click("#key-save")
        pg.wait_for_function("document.querySelector('#model').textContent.includes('Pick a "
                             "model')", timeout=20_000)  # a router with nothing loaded yet
        assert pg.locator("#models").is_visible()
        pg.select_option("#pick-target", "target")
        pg.wait_for_selector("#pick-draft option[value=draft]", state="attached", timeout=60_000)
        # the refused model is listed greyed out, with the rule, and cannot be picked
        llama = pg.locator("#pick-draft option[value=llama]")
        assert llama.is_disabled() and "refused (add_bos)" in llama.inner_text()
        assert "add_bos rule" in pg.inner_text("#pick-refused")
        assert not pg.locator("#pick-draft option[value=draft]").is_disabled()
        pg.select_option("#pick-draft", "draft")
        assert "Memory plan for the pair" in pg.inner_text("#pick-plan")
        pg.click("#pick-load")
        pg.wait_for_function("document.querySelector('#pick-status').textContent"
                             ".startsWith('Answers:')", timeout=120_000)
        assert pg.inner_text("#pick-status") == "Answers: target, draft draft"
        assert "draft draft.gguf" in pg.inner_text("#model")  # the loaded model's /props
        # draft-simple: under auto a draft as costly as its target (these two) is not used
        settings(pg, temperature=0, max_tokens=32, spec_type="draft-simple")
        ask(pg, "Repeat after me: one two three one two three")
        msg = stored_answer(pg)
        # the target's own answer (speculation off, through the router), with the draft's
        # tokens accepted and coloured
        want = httpx.post(f"{router.url}/v1/chat/completions", headers=AUTH, timeout=60, json={
            "model": "target", "temperature": 0, "max_tokens": 32, "speculative.type": "none",
            "messages": [
                {"role": "user", "content": "Repeat after me: one two three one two three"}]})
        assert want.status_code == 200, want.text
        assert msg["content"] == want.json()["choices"][0]["message"]["content"]
        assert msg["stats"]["timings"]["draft_n_accepted"] > 0
        assert pg.locator(".msg.assistant .tok.o-d").count() > 0
        pg.click(".compare-button")
        pg.wait_for_selector(".compare .same", timeout=60_000)
        assert pg.locator(".compare .same").get_attribute("data-identical") == "true"
    finally:
        context.close()
    assert errors == []


@pytest.mark.real
def test_the_real_pair_on_a_routers_page(tmp_path, browser):
    """The issue's workflow with the real models: the Qwen2.5-Coder target, SmolLM2 refused by
    name, the 0.5B draft picked and loaded, a greedy answer equal to the target alone's."""
    from tandem.registry import pull

    models = tmp_path / "models"
    models.mkdir()
    for name in ("default", "default-draft", "smollm2-135m"):
        path = pull(name, quiet=True)
        (models / path.name).symlink_to(path)
    target, draft = pull("default", quiet=True).stem, pull("default-draft", quiet=True).stem
    s = Server(["--models-dir", str(models), "--api-key", KEY, "-t", "2", "-c", "2048"],
               tmp_path / "router.log")
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    pg = context.new_page()
    try:
        s.wait_ready(120)
        pg.goto(s.url + "/")
        pg.wait_for_selector("#key-dialog[open]", timeout=10_000)
        pg.fill("#key-input", KEY)
        pg.click("#key-save")
        pg.wait_for_selector("#models:not([hidden])", timeout=20_000)
        pg.select_option("#pick-target", target)
        pg.wait_for_selector(f"#pick-draft option[value='{draft}']", state="attached",
                             timeout=120_000)
        smol = pg.locator("#pick-draft option[value='SmolLM2-135M-Instruct.Q4_1']")
        assert smol.is_disabled() and "refused (bos)" in smol.inner_text()
        assert "SmolLM2-135M-Instruct.Q4_1: refused by the bos rule" in pg.inner_text(
            "#pick-refused")
        pg.select_option("#pick-draft", draft)
        assert "Memory plan for the pair" in pg.inner_text("#pick-plan")
        pg.click("#pick-load")
        pg.wait_for_function("document.querySelector('#pick-status').textContent"
                             ".startsWith('Answers:')", timeout=300_000)
        settings(pg, temperature=0, max_tokens=48, spec_type="draft-simple")
        ask(pg, "Write a Python function that reverses a string.", timeout=300_000)
        assert stored_answer(pg)["stats"]["timings"]["draft_n_accepted"] > 0
        pg.click(".compare-button")
        pg.wait_for_selector(".compare .same", timeout=300_000)
        assert pg.locator(".compare .same").get_attribute("data-identical") == "true"
    finally:
        context.close()
        s.stop()
