"""Target/draft compatibility: llama.cpp's rules, each failing with its own message."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import pytest

from tandem.speculative.compat import (
    SPEC_VOCAB_CHECK_START_TOKEN_ID,
    SPEC_VOCAB_MAX_SIZE_DIFFERENCE,
    check_compatible,
)


def _tokens(n: int) -> list[str]:
    return [f"t{i}" for i in range(n)]


@dataclass
class Vocab:
    """Stand-in for tandem.tokenizer.Tokenizer: only what the check reads."""

    vocab_type: str = "gpt2"
    bos_id: int | None = 151643
    eos_id: int | None = 151645
    add_bos: bool = False
    add_eos: bool = False
    tokens: list[str] = field(default_factory=lambda: _tokens(1000))


def _with(**changes) -> Vocab:
    return dataclasses.replace(Vocab(), **changes)


def test_identical_vocabularies_pass():
    r = check_compatible(Vocab(), Vocab())
    assert r.ok and r.rule is None
    assert "compatible" in r.message


def test_vocab_type_must_match():
    r = check_compatible(Vocab(), _with(vocab_type="llama"))
    assert (r.ok, r.rule) == (False, "vocab_type")
    assert r.message == "draft vocabulary type 'llama' != target vocabulary type 'gpt2'"


@pytest.mark.parametrize("changes, rule, message", [
    (dict(bos_id=1), "bos", "draft BOS 1 != target BOS 151643"),
    (dict(bos_id=None), "bos", "draft BOS none != target BOS 151643"),
    (dict(eos_id=2), "eos", "draft EOS 2 != target EOS 151645"),
    (dict(add_bos=True), "add_bos", "draft add-BOS on != target add-BOS off"),
    (dict(add_eos=True), "add_eos", "draft add-EOS on != target add-EOS off"),
])
def test_special_tokens_must_match(changes, rule, message):
    r = check_compatible(Vocab(), _with(**changes))
    assert (r.ok, r.rule, r.message) == (False, rule, message)


def test_vocabulary_size_difference_over_128_fails():
    r = check_compatible(_with(tokens=_tokens(151936)), _with(tokens=_tokens(49152)))
    assert (r.ok, r.rule) == (False, "vocab_size")
    assert r.message == ("vocabulary size differs by 102784 (target 151936, draft 49152; "
                         "at most 128 allowed)")
    over = check_compatible(
        Vocab(), _with(tokens=_tokens(1000 + SPEC_VOCAB_MAX_SIZE_DIFFERENCE + 1)))
    assert over.rule == "vocab_size"


def test_padding_entries_at_the_end_pass():
    padded = _tokens(1000) + [f"[PAD{i}]" for i in range(SPEC_VOCAB_MAX_SIZE_DIFFERENCE)]
    assert check_compatible(Vocab(), _with(tokens=padded)).ok
    assert check_compatible(_with(tokens=padded), Vocab()).ok


def test_token_text_must_match_from_id_5():
    draft = _tokens(1000)
    draft[734] = "abd"
    target = _tokens(1000)
    target[734] = "abc"
    r = check_compatible(_with(tokens=target), _with(tokens=draft))
    assert (r.ok, r.rule) == (False, "token_text")
    assert r.message == "token 734 differs: target 'abc' != draft 'abd'"


def test_first_differing_token_is_named():
    draft = _tokens(1000)
    draft[900], draft[10] = "x", "y"
    r = check_compatible(Vocab(), _with(tokens=draft))
    assert r.message.startswith("token 10 differs")


def test_ids_below_5_are_not_compared():
    draft = _tokens(1000)
    for i in range(SPEC_VOCAB_CHECK_START_TOKEN_ID):
        draft[i] = f"<control{i}>"
    assert check_compatible(Vocab(), _with(tokens=draft)).ok
    draft[SPEC_VOCAB_CHECK_START_TOKEN_ID] = "changed"
    assert check_compatible(Vocab(), _with(tokens=draft)).rule == "token_text"


def test_rules_apply_in_llama_cpp_order():
    # everything differs: the vocabulary type is reported first, then special tokens, then size
    bad = Vocab(vocab_type="llama", bos_id=1, tokens=_tokens(10))
    assert check_compatible(Vocab(), bad).rule == "vocab_type"
    assert check_compatible(Vocab(), dataclasses.replace(bad, vocab_type="gpt2")).rule == "bos"


@pytest.fixture(scope="module")
def real_tokenizers(real_gguf):
    """Tokenizers of the default target, default draft and SmolLM2."""
    from tandem.tokenizer import Tokenizer

    return {name: Tokenizer.from_gguf_metadata(real_gguf(name).metadata)
            for name in ("default", "default-draft", "smollm2-135m")}


@pytest.mark.real
def test_real_qwen_pair_is_compatible(real_tokenizers):
    r = check_compatible(real_tokenizers["default"], real_tokenizers["default-draft"])
    assert r.ok, r.message


@pytest.mark.real
def test_real_smollm2_draft_is_refused(real_tokenizers):
    r = check_compatible(real_tokenizers["default"], real_tokenizers["smollm2-135m"])
    assert not r.ok
    # both are gpt2 BPE vocabularies without add-BOS; SmolLM2's BOS is 1, Qwen's 151643
    assert r.rule == "bos"
    assert r.message == "draft BOS 1 != target BOS 151643"
