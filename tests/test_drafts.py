"""The draft picker's judgement (server/router/drafts.py): every other model of a router's catalog is
accepted as a draft with the pair's memory plan, or refused naming the rule `tandem check`
applies; on tiny generated models."""

from __future__ import annotations

import pytest

from tandem.config import EngineConfig, SpecConfig
from tandem.check import memory_plan
from tandem.server.router.drafts import draft_choices

from . import tiny


def plans(target, ctx_size: int):
    """plan_for as the router gives it: the target's plan with that draft, as serve makes it."""
    cfg = EngineConfig(ctx_size=ctx_size)

    def plan_for(draft):
        spec = SpecConfig(types=["draft-simple"] if draft else ["none"])
        return memory_plan(cfg, spec, str(target), draft and str(draft)).as_json()
    return plan_for


@pytest.fixture(scope="module")
def catalog(tmp_path_factory):
    d = tmp_path_factory.mktemp("drafts")
    (d / "broken.gguf").write_bytes(b"GGUF but not really")
    return [
        ("target", tiny.write_gguf(tiny.hf_model("qwen2", seed=1), d / "target.gguf", "qwen2")),
        ("draft", tiny.write_gguf(tiny.hf_model("qwen2", seed=2), d / "draft.gguf", "qwen2")),
        ("llama", tiny.write_gguf(tiny.hf_model("llama", seed=3), d / "llama.gguf", "llama")),
        ("broken", d / "broken.gguf"),
    ]


def test_each_other_model_is_accepted_or_refused_by_name(catalog):
    out = draft_choices("target", catalog, plans(catalog[0][1], 256))
    rows = {r["id"]: r for r in out["data"]}
    assert out["model"] == "target" and set(rows) == {"target", "draft", "llama", "broken"}
    assert rows["draft"]["accepted"] and rows["draft"]["rule"] is None
    assert rows["draft"]["message"].startswith("compatible")
    # the llama model adds BOS, the qwen2 target does not: check's add_bos rule refuses it
    assert not rows["llama"]["accepted"] and rows["llama"]["rule"] == "add_bos"
    assert "draft add-BOS on != target add-BOS off" in rows["llama"]["message"]
    assert rows["llama"]["plan"] is None
    assert not rows["target"]["accepted"] and rows["target"]["rule"] == "the target itself"
    assert not rows["broken"]["accepted"] and rows["broken"]["rule"] == "unreadable"
    assert "broken.gguf" in rows["broken"]["message"]


def test_the_pairs_plan_adds_the_draft_to_the_targets(catalog):
    out = draft_choices("target", catalog, plans(catalog[0][1], 256))
    alone = out["plan"]
    pair = next(r for r in out["data"] if r["id"] == "draft")["plan"]
    assert [m["role"] for m in alone["models"]] == ["target"]
    assert [m["role"] for m in pair["models"]] == ["target", "draft"]
    assert pair["total"] > alone["total"] and pair["fits"]
    # the plan follows the settings it is given (the child's command line in the router)
    longer = draft_choices("target", catalog, plans(catalog[0][1], 4096))
    assert longer["plan"]["total"] > alone["total"]


def test_a_target_not_downloaded_or_unreadable_is_a_clear_error(catalog, tmp_path):
    from tandem.server.schemas import ApiError

    missing = [("pending", tmp_path / "hf:user-model"), *catalog]
    with pytest.raises(ApiError) as e:
        draft_choices("pending", missing, plans(catalog[0][1], 256))
    assert e.value.status == 409 and "not downloaded yet" in str(e.value)
    with pytest.raises(ApiError) as e:
        draft_choices("broken", catalog, plans(catalog[0][1], 256))
    assert e.value.status == 400 and "broken" in str(e.value)
    # as a draft, a model not downloaded yet is refused by name; the others are still judged
    out = draft_choices("target", missing, plans(catalog[0][1], 256))
    rows = {r["id"]: r for r in out["data"]}
    assert rows["pending"]["rule"] == "unreadable" and rows["draft"]["accepted"]
