"""Can this draft model propose tokens for that target? llama.cpp's rules, with named failures.

The rules of common_speculative_are_compatible (llama.cpp common/speculative.cpp), in its order:

1. vocab_type: the same tokenizer kind (gpt2 BPE, llama SentencePiece, ...).
2. special tokens: the same add-BOS and add-EOS flags, BOS id and EOS id.
3. vocab_size: the vocabulary sizes differ by at most SPEC_VOCAB_MAX_SIZE_DIFFERENCE (padding).
4. token_text: every id from SPEC_VOCAB_CHECK_START_TOKEN_ID up to the smaller size has the same
   text in both (ids below 5 are often control tokens that families renumber).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

SPEC_VOCAB_MAX_SIZE_DIFFERENCE = 128
SPEC_VOCAB_CHECK_START_TOKEN_ID = 5


class VocabInfo(Protocol):
    """What the check reads from a tokenizer (tandem.tokenizer.Tokenizer has these)."""

    vocab_type: str
    bos_id: int | None
    eos_id: int | None
    add_bos: bool
    add_eos: bool
    tokens: list[str]


@dataclass(frozen=True, slots=True)
class CompatResult:
    """ok, or the first rule that failed (vocab_type, add_bos, add_eos, bos, eos, vocab_size,
    token_text) and a message naming it and both values."""

    ok: bool
    rule: str | None
    message: str


def check_compatible(target_tok: VocabInfo, draft_tok: VocabInfo) -> CompatResult:
    """Apply the rules in order; the first that fails is reported."""
    for check in (_vocab_type, _special_tokens, _vocab_size, _token_text):
        failure = check(target_tok, draft_tok)
        if failure is not None:
            return CompatResult(False, failure[0], failure[1])
    n = min(len(target_tok.tokens), len(draft_tok.tokens))
    return CompatResult(
        True, None,
        f"compatible: {target_tok.vocab_type} vocabulary, same special tokens, "
        f"identical token text for ids {SPEC_VOCAB_CHECK_START_TOKEN_ID}..{n - 1}",
    )


def _vocab_type(t: VocabInfo, d: VocabInfo) -> tuple[str, str] | None:
    if t.vocab_type != d.vocab_type:
        return "vocab_type", (
            f"draft vocabulary type {d.vocab_type!r} != target vocabulary type {t.vocab_type!r}"
        )
    return None


def _special_tokens(t: VocabInfo, d: VocabInfo) -> tuple[str, str] | None:
    for rule, label in (("add_bos", "add-BOS"), ("add_eos", "add-EOS"),
                        ("bos_id", "BOS"), ("eos_id", "EOS")):
        tv, dv = getattr(t, rule), getattr(d, rule)
        if tv != dv:
            return rule.removesuffix("_id"), f"draft {label} {_show(dv)} != target {label} {_show(tv)}"
    return None


def _vocab_size(t: VocabInfo, d: VocabInfo) -> tuple[str, str] | None:
    nt, nd = len(t.tokens), len(d.tokens)
    if abs(nt - nd) > SPEC_VOCAB_MAX_SIZE_DIFFERENCE:
        return "vocab_size", (
            f"vocabulary size differs by {abs(nt - nd)} (target {nt}, draft {nd}; "
            f"at most {SPEC_VOCAB_MAX_SIZE_DIFFERENCE} allowed)"
        )
    return None


def _token_text(t: VocabInfo, d: VocabInfo) -> tuple[str, str] | None:
    start = SPEC_VOCAB_CHECK_START_TOKEN_ID
    n = min(len(t.tokens), len(d.tokens))
    tt, dt = t.tokens, d.tokens
    if tt[start:n] == dt[start:n]:  # one C-level comparison in the common (compatible) case
        return None
    i = next(i for i in range(start, n) if tt[i] != dt[i])
    return "token_text", f"token {i} differs: target {tt[i]!r} != draft {dt[i]!r}"


def _show(value: object) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)
