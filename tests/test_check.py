"""`tandem check` through the command line, on tiny generated models and on the real pair."""

from __future__ import annotations

import pytest

from tandem.cli import main

from . import tiny


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Tiny qwen2 target and draft GGUFs (same vocabulary), a llama GGUF (adds BOS, unlike
    qwen2) and a Hugging Face directory of the qwen2 draft."""
    d = tmp_path_factory.mktemp("check")
    draft = tiny.hf_model("qwen2", seed=2)
    return {
        "target": tiny.write_gguf(tiny.hf_model("qwen2", seed=1), d / "target.gguf", "qwen2"),
        "draft": tiny.write_gguf(draft, d / "draft.gguf", "qwen2"),
        "llama": tiny.write_gguf(tiny.hf_model("llama", seed=3), d / "llama.gguf", "llama"),
        "hf": tiny.write_hf(draft, d / "hf"),
    }


def _check(capsys, *argv) -> tuple[int, str, str]:
    code = main(["check", *map(str, argv)])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_target_alone_can_run(models, capsys):
    code, out, _ = _check(capsys, "-m", models["target"], "-c", 256)
    assert code == 0
    assert "target: " in out and "(qwen2, 2 layers, dim 64" in out
    assert "draft: none" in out
    assert "memory plan" in out and "fits: yes" in out
    assert out.rstrip().endswith("verdict: can run")


def test_compatible_pair_can_run(models, capsys):
    code, out, _ = _check(capsys, "-m", models["target"], "-md", models["draft"], "-c", 256,
                          "-np", 2)
    assert code == 0
    assert "draft: compatible" in out
    assert "target target.gguf" in out and "draft draft.gguf" in out
    assert "x 2 slot(s)" in out


def test_hf_directory_draft(models, capsys):
    code, out, _ = _check(capsys, "-m", models["target"], "-md", models["hf"], "-c", 256)
    assert code == 0, out
    assert "draft weights held as dense" in out


def test_incompatible_draft_exits_1_naming_the_rule(models, capsys):
    code, out, _ = _check(capsys, "-m", models["target"], "-md", models["llama"], "-c", 256)
    assert code == 1
    assert "draft: INCOMPATIBLE (add_bos): draft add-BOS on != target add-BOS off" in out
    assert "verdict: cannot run: the draft fails the add_bos rule" in out


def test_plan_that_does_not_fit_exits_1(models, capsys):
    # 2 layers * 2 kv heads * 16 dims * 2 (K, V) * bf16 = 256 bytes a position: 2^40 bytes
    code, out, _ = _check(capsys, "-m", models["target"], "-c", 2**32)
    assert code == 1
    assert "fits: NO" in out and "lower --ctx-size or --parallel" in out
    assert "exceeds the target's trained context of 512 tokens" in out


def test_missing_file_exits_2(tmp_path, capsys):
    code, out, err = _check(capsys, "-m", tmp_path / "nope.gguf")
    assert code == 2
    assert "model file not found" in err and "nope.gguf" in err


def test_not_a_gguf_exits_2(tmp_path, capsys):
    bad = tmp_path / "model.gguf"
    bad.write_text("hello")
    code, _, err = _check(capsys, "-m", bad)
    assert code == 2
    assert "is not a GGUF file" in err


def test_bad_numbers_exit_2(models, capsys):
    code, _, err = _check(capsys, "-m", models["target"], "-c", 0)
    assert code == 2 and "ctx-size must be >= 16" in err
    code, _, err = _check(capsys, "-m", models["target"], "-np", 0)
    assert code == 2 and "parallel must be >= 1" in err
    with pytest.raises(SystemExit) as e:
        main(["check", "-m", str(models["target"]), "-c", "lots"])
    assert e.value.code == 2


def test_draft_spec_type_without_draft_exits_2(models, capsys):
    code, _, err = _check(capsys, "-m", models["target"], "--spec-type", "draft-simple")
    assert code == 2 and "--model-draft" in err


@pytest.mark.real
def test_an_image_projector_is_checked_against_the_target(models, tmp_path, capsys):
    """--mmproj: read whole, its width checked against the target's (refused by name, exit 2),
    and counted in the plan."""
    from . import tiny_vision

    mmproj = tiny_vision.write_mmproj(tiny_vision.hf_model(seed=1), tmp_path / "mmproj.gguf")
    gemma = tiny.write_gguf(tiny.hf_model("gemma3", seed=1), tmp_path / "gemma.gguf", "gemma3")
    code, out, _ = _check(capsys, "-m", gemma, "-c", 256, "--mmproj", mmproj)
    assert code == 0 and "64 tokens each, 64-wide" in out
    assert "mmproj mmproj.gguf" in out and out.rstrip().endswith("verdict: can run")
    wide = tiny.write_gguf(tiny.hf_model("qwen2", seed=1, hidden_size=96), tmp_path / "w.gguf",
                           "qwen2")
    code, _, err = _check(capsys, "-m", wide, "--mmproj", mmproj)
    assert code == 2 and "projects images to 64-wide embeddings" in err
    assert "embedding_length 96" in err


def test_real_default_pair(capsys):
    code, out, _ = _check(capsys, "-m", "default", "-md", "default-draft")
    assert code == 0, out
    assert "draft: compatible: gpt2 vocabulary" in out
    assert "(qwen2, 28 layers, dim 1536" in out and "(qwen2, 24 layers, dim 896" in out
