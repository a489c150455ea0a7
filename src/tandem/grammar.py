"""Constrained output: a grammar or JSON schema, and logit biases, on every row the target scores.

The constraint library is llguidance (the one llama.cpp links): it compiles GBNF or Lark
grammars and JSON schemas, and for a token sequence so far gives the set of tokens that may
come next (a bitmask over the vocabulary) and the tokens the grammar forces.

How a constraint meets speculation (engine.py, speculative/speculator.py):

    draft  = proposers' tokens, cut at the first one the grammar forbids;
             where the grammar forces tokens, those are the draft (confidence 1)
    masks  = Guide.row_masks(draft): row i's allowed tokens after draft[:i]
    logits = target rows with the disallowed tokens at -inf (every row, as one-token
             decoding applies the mask to its single row)
    verify as usual; the guide then consumes the emitted tokens

Each row is masked exactly as constrained decoding without speculation masks its one row, and
verification keeps only tokens the masked rows agree with, so greedy output is unchanged and
sampled output keeps the masked target's distribution. A draft model samples from its own
distribution masked by the same grammar (q masked as p is), so its tokens are never cut: cutting
a sampled draft where it drew a forbidden token would bias the recovered token.
"""

from __future__ import annotations

import math

import json
import threading
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from .errors import TandemError

if TYPE_CHECKING:
    from .tokenizer import Tokenizer

# JSON as an answer is written compactly but readably: fixed separators, no free whitespace,
# so every key, quote, comma and brace the schema fixes is a forced token (drafted for free)
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
_CONTROL, _USER_DEFINED = 3, 4  # GGUF token types


class GrammarError(TandemError):
    """A grammar or schema that cannot be compiled; the message names the field and the place."""


def from_gbnf(text: str, field: str = "grammar") -> str:
    """llama.cpp's GBNF (or a Lark grammar, which llguidance reads natively) -> a grammar
    string for `Guide`."""
    from llguidance import LLMatcher
    from llguidance.gbnf_to_lark import GbnfToLarkError, any_to_lark

    if not isinstance(text, str) or not text.strip():
        raise GrammarError(f"{field}: expected a GBNF grammar as a non-empty string")
    try:
        lark = any_to_lark(text)
    except (GbnfToLarkError, ValueError, KeyError, IndexError) as e:
        raise GrammarError(f"{field}: not a valid GBNF grammar: {e}") from None
    return LLMatcher.grammar_from_lark(lark)


def from_json_schema(schema: Any, field: str = "json_schema") -> str:
    """A JSON schema (an object, or true for any JSON value) -> a grammar string."""
    from llguidance import LLMatcher

    if schema is True or schema == {}:
        schema = {}
    elif not isinstance(schema, dict):
        raise GrammarError(f"{field}: expected a JSON schema object, got {json.dumps(schema)[:60]}")
    try:
        return LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS)
    except (ValueError, TypeError) as e:
        raise GrammarError(f"{field}: {e}") from None


def from_lark(lark: str) -> str:
    from llguidance import LLMatcher

    return LLMatcher.grammar_from_lark(lark)


class _Wrapper:
    """What llguidance's TokenizerWrapper reads from a tokenizer: the bytes of every token
    (control tokens, and user-defined ones written like <tool_call>, marked special with a
    leading 0xFF, as llguidance's llama.cpp binding does), EOS/BOS, and a tokenize call."""

    def __init__(self, tok: Tokenizer) -> None:
        self._tok = tok
        self.eos_token_id = tok.eos_id
        self.bos_token_id = tok.bos_id
        tokens, special = [], []
        for i, text in enumerate(tok.tokens):
            kind = tok.token_types[i]
            piece = tok.token_to_piece(i, special=True)
            if i in tok.eog_ids or kind == _CONTROL or (
                    kind == _USER_DEFINED and text.startswith("<") and text.endswith(">")):
                piece = b"\xff" + text.encode()
                special.append(i)
            tokens.append(piece)
        self.tokens = tokens
        self.special_token_ids = special

    def __call__(self, s: str | bytes) -> list[int]:
        if isinstance(s, bytes):
            s = s.decode("utf-8", errors="replace")
        return self._tok.encode(s, add_special=False, parse_special=False)


_lock = threading.Lock()


def lltokenizer(tok: Tokenizer, n_vocab: int):
    """The llguidance tokenizer of `tok` with `n_vocab` ids (the model's logit width), built once
    per tokenizer (about a second for a 150k vocabulary)."""
    from llguidance import LLTokenizer, TokenizerWrapper

    with _lock:
        cached = getattr(tok, "_llguidance", None)
        if cached is None or cached[0] != n_vocab:
            eos = sorted(tok.eog_ids) or None
            ll = LLTokenizer(TokenizerWrapper(_Wrapper(tok)), n_vocab=n_vocab, eos_token=eos)
            cached = tok._llguidance = (n_vocab, ll)
        return cached[1]


def check(tok: Tokenizer, n_vocab: int, grammar: str, field: str) -> None:
    """Raise GrammarError naming `field` if llguidance refuses the grammar for this vocabulary."""
    from llguidance import LLMatcher

    is_err, messages = LLMatcher.validate_grammar_with_warnings(grammar, lltokenizer(tok, n_vocab))
    if is_err:
        raise GrammarError(f"{field}: {messages[0].strip() if messages else 'invalid grammar'}")


def _mask_of(matcher, n_vocab: int) -> torch.Tensor:
    bits = np.unpackbits(np.frombuffer(matcher.compute_bitmask(), dtype=np.uint8),
                         bitorder="little")[:n_vocab]
    return torch.from_numpy(bits.astype(bool))


class Guide:
    """One sequence's grammar state: the tokens it allows next, the tokens it forces, and the
    emitted tokens it has consumed. Masks are bool tensors over the model's n_vocab logits."""

    def __init__(self, tok: Tokenizer, n_vocab: int, grammar: str) -> None:
        from llguidance import LLMatcher

        self.n_vocab = n_vocab
        # Lookahead (the rows of a draft, the draft model's next token) runs on a copy of the
        # matcher: llguidance 1.9's rollback after masks were computed ahead can leave a state
        # that differs from consuming the same tokens once (found on the real pair: '"}' refused
        # after a string where one-token decoding allows it; and with a tiny model, digits past
        # an integer's maximum after rolling back over an end of generation). The end of
        # generation is never consumed ahead either: nothing follows it.
        self.eog = frozenset(tok.eog_ids)
        self.matcher = LLMatcher(lltokenizer(tok, n_vocab), grammar, log_level=0)
        if self.matcher.is_error():
            raise GrammarError(f"grammar: {self.matcher.get_error()}")

    @property
    def stopped(self) -> bool:
        """The grammar is complete: only the end of generation may follow (the mask says so,
        and the model emits it, as one-token decoding would), or it failed."""
        return self.matcher.is_stopped() or self.matcher.is_error()

    @property
    def failed(self) -> bool:
        return self.matcher.is_error()

    def _mask(self) -> torch.Tensor:
        return _mask_of(self.matcher, self.n_vocab)

    def allowed(self, ahead: list[int] = ()) -> torch.Tensor:
        """(n_vocab,) bool: what may follow the consumed tokens and then `ahead` (all valid,
        no end of generation among them)."""
        if not ahead:
            return self._mask()
        m = self.matcher.deep_copy()
        m.consume_tokens(list(ahead))
        return _mask_of(m, self.n_vocab)

    def _upto_end(self, ids: list[int]) -> int:
        """Tokens of ids before the first end-of-generation token."""
        return next((i for i, t in enumerate(ids) if t in self.eog), len(ids))

    def valid(self, ids: list[int]) -> int:
        """How many leading tokens of ids the grammar allows (up to an end of generation,
        included: nothing after it is emitted)."""
        if not ids:
            return 0
        end = self._upto_end(ids)
        return min(self.matcher.validate_tokens(list(ids[: end + 1])), end + 1)

    def forced(self, limit: int) -> list[int]:
        """The tokens the grammar forces next (at most limit): each the only way on."""
        if limit <= 0 or self.stopped:
            return []
        return self.matcher.compute_ff_tokens()[:limit]

    def row_masks(self, draft: list[int]) -> torch.Tensor:
        """(k+1, n_vocab) bool: row i allows what may follow the consumed tokens and draft[:i]
        (draft must be valid: see `valid`)."""
        rows = [self._mask()]
        n = self._upto_end(draft)
        if n:
            m = self.matcher.deep_copy()
            for t in draft[:n]:
                m.consume_token(t)
                rows.append(_mask_of(m, self.n_vocab))
        # rows after an end of generation are never emitted: left unconstrained
        rows.extend(torch.ones(self.n_vocab, dtype=torch.bool) for _ in draft[n:])
        return torch.stack(rows)

    def advance(self, ids: list[int]) -> None:
        """The sequence emitted ids (each one a masked row allowed)."""
        if ids and not self.matcher.is_stopped():
            self.matcher.consume_tokens(list(ids))


BIAS_LIMIT = 1e9  # |bias| beyond this acts as this (logits are tens)


def bias_vector(bias: dict[int, float], n_vocab: int) -> torch.Tensor | None:
    """{token id: added logit} -> (n_vocab,) float32 (-inf where a token is banned)."""
    if not bias:
        return None
    out = torch.zeros(n_vocab, dtype=torch.float64)
    for t, b in bias.items():
        if 0 <= t < n_vocab:
            out[t] += b
    # +inf, or a bias past float32's range, means "this token": BIAS_LIMIT says it and keeps
    # the logits finite (inf - inf would be NaN); -inf (a ban) stays
    return out.clamp(max=BIAS_LIMIT).clamp(min=-BIAS_LIMIT).float().masked_fill(
        out == -math.inf, -math.inf)


def constrain(rows: torch.Tensor, draft: list[int], guide: Guide | None,
              bias: torch.Tensor | None, banned_eog: list[int] | tuple = ()) -> torch.Tensor:
    """A sequence's k+1 logit rows as its request shapes them: logit biases added, a grammar's
    disallowed tokens at -inf (row i after draft[:i], as one-token decoding masks its row),
    `banned_eog` (the end-of-generation tokens of a request that ignores EOS; llama.cpp's -inf
    bias) at -inf except where a grammar allows nothing else. Unshaped rows are returned as
    they are; shaped ones are a copy."""
    if bias is None and guide is None and not banned_eog:
        return rows
    rows = rows.clone()
    if bias is not None:
        rows += bias[: rows.shape[-1]]
    allowed = None
    if guide is not None:
        allowed = guide.row_masks(draft)
        rows.masked_fill_(~allowed, float("-inf"))
    if banned_eog:
        eog = torch.tensor(list(banned_eog))
        if allowed is None:
            rows[:, eog] = float("-inf")
        else:  # only the rows where the grammar allows more than the end
            other = allowed.clone()
            other[:, eog] = False
            rows[other.any(-1).nonzero()[:, 0][:, None], eog] = float("-inf")
    return rows
