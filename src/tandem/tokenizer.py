"""Text <-> token ids from the model file's own vocabulary, with HF `tokenizers` as the engine.

Built from GGUF metadata (`tokenizer.ggml.*`, the way llama.cpp reads it) or from a Hugging Face
directory (tokenizer.json). Also: incremental detokenization for streaming, and the model's own
jinja2 chat template rendered the way transformers renders it.
"""

from __future__ import annotations

import codecs
import json
import logging
import threading
from datetime import datetime
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Regex, models, normalizers, pre_tokenizers
from tokenizers import Tokenizer as Engine

from .errors import ModelFileError, TandemError

log = logging.getLogger("tandem.tokenizer")

# tokenizer.ggml.token_type values
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

# Pre-tokenizer regexes per `tokenizer.ggml.pre`, as llama.cpp's llm_tokenizer_bpe applies them:
# each regex splits the pieces the previous one left, unmatched text stays a piece of its own.
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_LLAMA3 = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)
_QWEN2 = _LLAMA3.replace(r"\p{N}{1,3}", r"\p{N}")
_UPPER, _LOWER = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]", r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]"
_NOT_LN, _SUFFIX = r"[^\r\n\p{L}\p{N}]?", r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
_GPT4O = (
    f"{_NOT_LN}{_UPPER}*{_LOWER}+{_SUFFIX}|{_NOT_LN}{_UPPER}+{_LOWER}*{_SUFFIX}"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_SPLITS: dict[str, tuple[str, ...]] = {
    "default": (r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"),
    "llama3": (_LLAMA3,),
    "qwen2": (_QWEN2,),
    "smollm": (r"\p{N}", _GPT2),
    "gpt-2": (_GPT2,),
    "falcon": (r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, r"[0-9][0-9][0-9]"),
    "gpt-4o": (_GPT4O,),
}
_PRE_ALIASES = {
    **dict.fromkeys(["llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "dbrx", "smaug-bpe"],
                    "llama3"),
    **dict.fromkeys(["deepseek-r1-qwen", "stablelm2", "megrez"], "qwen2"),
    **dict.fromkeys(["starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b"], "smollm"),
    **dict.fromkeys(["phi-2", "mpt", "olmo", "jais", "jina-es", "jina-de", "trillion", "exaone4"], "gpt-2"),
    "llama4": "gpt-4o",
}
_ADD_BOS_BY_DEFAULT = {"llama3"}  # llama.cpp: these pre types add BOS unless the file says otherwise
_IGNORE_MERGES = {"llama3"}  # a word that is a whole token is taken as is, merges or not

# llama.cpp's rule (llama-vocab.cpp): tokens with these texts end generation, besides EOS/EOT/EOM.
EOG_TEXTS = frozenset([
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<｜end▁of▁sentence｜>", "[e~[",
])
# Fill-in-the-middle pad / repo / file-separator tokens end generation too (found by text when the
# file gives no tokenizer.ggml.fim_*_token_id).
_FIM_EOG_TEXTS = {
    "fim_pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "fim_rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "fim_sep": ("<|file_sep|>",),
}

# llama.cpp's fill-in-the-middle tokens by text, where the file gives no fim_*_token_id
FIM_TEXTS = {
    "fim_pre": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<PRE>", "▁<PRE>"),
    "fim_suf": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<SUF>", "▁<SUF>"),
    "fim_mid": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<MID>", "▁<MID>"),
    **_FIM_EOG_TEXTS,
}

CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
    "{% endif %}"
)
# llama-server's built-in templates by name (--chat-template NAME), as llama.cpp's
# llm_chat_apply_template writes them
BUILTIN_TEMPLATES = {
    "chatml": CHATML_TEMPLATE,
    "llama3": (
        "{% for m in messages %}{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\n\n'"
        " + m['content'] | trim }}{{ '<|eot_id|>' }}{% endfor %}{% if add_generation_prompt %}"
        "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"),
    "command-r": (
        "{% set names = {'system': '<|SYSTEM_TOKEN|>', 'user': '<|USER_TOKEN|>', "
        "'assistant': '<|CHATBOT_TOKEN|>'} %}{% for m in messages %}"
        "{{ '<|START_OF_TURN_TOKEN|>' + names[m['role']] + (m['content'] | trim) + "
        "'<|END_OF_TURN_TOKEN|>' }}{% endfor %}{% if add_generation_prompt %}"
        "{{ '<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>' }}{% endif %}"),
    "gemma": (
        "{% set ns = namespace(system='') %}{% for m in messages %}"
        "{% if m['role'] == 'system' %}{% set ns.system = m['content'] | trim %}{% else %}"
        "{% set role = 'model' if m['role'] == 'assistant' else m['role'] %}"
        "{{ '<start_of_turn>' + role + '\n' }}{% if ns.system and role != 'model' %}"
        "{{ ns.system + '\n\n' }}{% set ns.system = '' %}{% endif %}"
        "{{ (m['content'] | trim) + '<end_of_turn>\n' }}{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"),
    "phi3": (
        "{% for m in messages %}{{ '<|' + m['role'] + '|>\n' + m['content'] + '<|end|>\n' }}"
        "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"),
}


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte-level alphabet: every byte as a printable character (space -> 'Ġ')."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
            *range(ord("®"), ord("ÿ") + 1)]
    shifted = [b for b in range(256) if b not in keep]
    return {**{b: chr(b) for b in keep}, **{b: chr(256 + n) for n, b in enumerate(shifted)}}


_BYTE_OF_CHAR = {c: bytes([b]) for b, c in _bytes_to_unicode().items()}


class Tokenizer:
    """A model's tokenizer. Build it with `from_gguf_metadata` or `from_hf_dir`.

    Control (and unknown) tokens are special: matched whole in text only when parse_special is
    true, and left out of decoded text when skip_special is true. User-defined tokens (e.g. Qwen's
    `<tool_call>`) are always matched whole and always decoded, as in llama.cpp.
    """

    def __init__(self, engine: Engine, *, vocab_type: str, pre: str | None, tokens: list[str],
                 token_types: list[int], bos_id: int | None, eos_id: int | None, add_bos: bool,
                 add_eos: bool, eog_ids: set[int], chat_template: str | None) -> None:
        self._engine = engine
        self._lock = threading.Lock()  # encode toggles the engine's encode_special_tokens flag
        self.vocab_type, self.pre = vocab_type, pre
        self.tokens, self.token_types = tokens, token_types
        self.bos_id, self.eos_id, self.add_bos, self.add_eos = bos_id, eos_id, add_bos, add_eos
        self.eog_ids, self.chat_template = eog_ids, chat_template
        self.fim: dict[str, int | None] = {}  # FIM token ids by role (fim_pre, ...), see fim_ids
        if add_bos and bos_id is None or add_eos and eos_id is None:
            raise ModelFileError("the tokenizer asks to add BOS/EOS but names no BOS/EOS token id")
        # EOG tokens count as control even when the file marks them otherwise (llama.cpp does so)
        self._kinds = list(token_types)
        for i in eog_ids:
            if self._kinds[i] not in (CONTROL, UNKNOWN):
                self._kinds[i] = CONTROL
        self._pieces: list[bytes | None] = [None] * len(tokens)

    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    @cached_property
    def ids(self) -> dict[str, int]:
        """Each token's text -> its id (the last, where texts repeat), built once: a tools
        request looks its markers up here instead of mapping ~150k tokens each time."""
        return {t: i for i, t in enumerate(self.tokens)}

    def fim_ids(self) -> dict[str, int | None]:
        """Fill-in-the-middle token ids: fim_pre, fim_suf, fim_mid (needed for infill), fim_rep,
        fim_sep, fim_pad (used where present); the file's ids, else found by text."""
        out = {}
        for key, texts in FIM_TEXTS.items():
            found = self.fim.get(key)
            if found is None:
                found = next((i for i, t in enumerate(self.tokens) if t in texts), None)
            out[key] = found
        return out

    # ---- building ------------------------------------------------------------------------------

    @classmethod
    def from_gguf_metadata(cls, meta: dict[str, Any]) -> Tokenizer:
        """From `GGUFFile(path).metadata`: vocab "gpt2" (byte-level BPE) or "llama" (SentencePiece)."""
        model = meta.get("tokenizer.ggml.model")
        tokens = meta.get("tokenizer.ggml.tokens")
        if model is None or not tokens:
            raise ModelFileError("the GGUF metadata has no tokenizer (tokenizer.ggml.model / tokens)")
        n = len(tokens)
        types = list(meta.get("tokenizer.ggml.token_type") or [NORMAL] * n)
        if len(types) != n:
            raise ModelFileError(f"tokenizer.ggml.token_type has {len(types)} entries for {n} tokens")
        vocab = _unique_vocab(tokens)

        def token_id(key: str, default: int | None = None) -> int | None:
            value = meta.get(f"tokenizer.ggml.{key}", default)
            if value is None or value is default:
                return default
            if type(value) is not int or not 0 <= value < n:  # llama.cpp: warn, use the default
                log.warning("tokenizer.ggml.%s is %r, not a token id (0..%d): ignored", key,
                            value, n - 1)
                return default
            return value

        pre = meta.get("tokenizer.ggml.pre")
        if model == "gpt2":
            pre = pre or "default"  # llama.cpp's choice (with a warning) for old files
            engine = _byte_level_engine(vocab, meta.get("tokenizer.ggml.merges"), pre)
            bos, eos = token_id("bos_token_id"), token_id("eos_token_id")
            add_bos = _PRE_ALIASES.get(pre, pre) in _ADD_BOS_BY_DEFAULT
        elif model == "llama":
            unk = token_id("unknown_token_id", 0)
            scores = meta.get("tokenizer.ggml.scores") or [0.0] * n
            prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", True))
            engine = _sentencepiece_engine(vocab, scores, tokens[unk], prefix)
            bos, eos, add_bos = token_id("bos_token_id", 1), token_id("eos_token_id", 2), True
        else:
            raise TandemError(f"unsupported tokenizer.ggml.model {model!r}; supported: gpt2, llama")
        extra = [token_id(k) for k in ("eot_token_id", "eom_token_id")]
        eog = _eog_ids(vocab, types, [eos, *extra], {k: token_id(f"{k}_token_id") for k in _FIM_EOG_TEXTS})
        _add_special_tokens(engine, tokens, types, eog)
        tok = cls(
            engine, vocab_type=model, pre=pre, tokens=list(tokens), token_types=types, bos_id=bos,
            eos_id=eos, add_bos=bool(meta.get("tokenizer.ggml.add_bos_token", add_bos)),
            add_eos=bool(meta.get("tokenizer.ggml.add_eos_token", False)),
            eog_ids=eog, chat_template=meta.get("tokenizer.chat_template"),
        )
        tok.fim = {k: token_id(f"{k}_token_id") for k in FIM_TEXTS}
        return tok

    @classmethod
    def from_hf_dir(cls, path: str | Path) -> Tokenizer:
        """From a Hugging Face directory: tokenizer.json, plus tokenizer_config.json (bos/eos,
        add_bos_token, chat_template), chat_template.jinja, config.json and generation_config.json."""
        path = Path(path)
        if not (path / "tokenizer.json").is_file():
            raise ModelFileError(
                f"{path} has no tokenizer.json; Tandem reads Hugging Face fast tokenizers only")
        try:
            engine = Engine.from_file(str(path / "tokenizer.json"))
        except Exception as e:
            raise ModelFileError(f"{path / 'tokenizer.json'} cannot be read: {e}") from None
        config, model_config, generation = (
            _read_json(path / f) for f in ("tokenizer_config.json", "config.json", "generation_config.json"))
        vocab_type = _hf_vocab_type(engine, path)
        vocab = engine.get_vocab(with_added_tokens=True)
        tokens = [""] * (max(vocab.values()) + 1)
        for text, i in vocab.items():
            tokens[i] = text
        types = [BYTE if vocab_type == "llama" and _is_byte_token(t) else NORMAL for t in tokens]
        for i, added in engine.get_added_tokens_decoder().items():
            types[i] = CONTROL if added.special else USER_DEFINED
        bos, eos = (_hf_special_id(engine, config, model_config, name) for name in ("bos_token", "eos_token"))
        # without add_bos_token/add_eos_token, what the tokenizer.json post-processor adds decides
        with_special = engine.encode("a", add_special_tokens=True).ids
        added = len(with_special) > len(engine.encode("a", add_special_tokens=False).ids)
        add_bos = config.get("add_bos_token", added and with_special[0] == bos)
        add_eos = config.get("add_eos_token", added and with_special[-1] == eos)
        extra = generation.get("eos_token_id", model_config.get("eos_token_id"))
        return cls(
            engine, vocab_type=vocab_type, pre=None, tokens=tokens, token_types=types, bos_id=bos,
            eos_id=eos, add_bos=bool(add_bos), add_eos=bool(add_eos),
            eog_ids=_eog_ids(vocab, types, [eos, *(extra if isinstance(extra, list) else [extra])], {}),
            chat_template=_hf_chat_template(path, config),
        )

    # ---- text <-> ids --------------------------------------------------------------------------

    def encode(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """Token ids of `text`; BOS/EOS added per add_bos/add_eos when add_special."""
        if not isinstance(text, str):
            raise TandemError(f"text to tokenize must be a string, got {type(text).__name__}")
        with self._lock:
            self._engine.encode_special_tokens = not parse_special
            ids = self._engine.encode(text, add_special_tokens=False).ids
        if add_special and self.add_bos:
            ids.insert(0, self.bos_id)
        if add_special and self.add_eos:
            ids.append(self.eos_id)
        return ids

    def token_to_piece(self, token_id: int, special: bool = True) -> bytes:
        """The raw bytes a token stands for (may be part of a UTF-8 character).

        Control tokens give their text when `special`, else b"". A SentencePiece token keeps the
        space its '▁' stands for, as llama-server's streamed output does.
        """
        if not 0 <= token_id < len(self.tokens):
            raise TandemError(
                f"token id {token_id} is out of range for this vocabulary (0..{len(self.tokens) - 1})")
        kind = self._kinds[token_id]
        if kind in (CONTROL, UNKNOWN):
            return self.tokens[token_id].encode() if special else b""
        piece = self._pieces[token_id]
        if piece is None:
            piece = self._pieces[token_id] = self._make_piece(self.tokens[token_id], kind)
        return piece

    def _make_piece(self, text: str, kind: int) -> bytes:
        if kind == USER_DEFINED:
            return text.encode()
        if kind == BYTE:
            return bytes([int(text[3:5], 16)])
        if kind != NORMAL:
            return b""
        if self.vocab_type == "gpt2":
            return b"".join(_BYTE_OF_CHAR.get(c) or c.encode() for c in text)
        return text.replace("▁", " ").encode()

    def decode(self, ids: list[int], skip_special: bool = False) -> str:
        """The text of `ids` (control tokens left out when skip_special); bad UTF-8 shows as U+FFFD."""
        raw = b"".join(self.token_to_piece(i, special=not skip_special) for i in ids)
        return raw.decode("utf-8", errors="replace")

    def incremental(self, skip_special: bool = False) -> IncrementalDecoder:
        """A streaming decoder: see IncrementalDecoder."""
        return IncrementalDecoder(self, skip_special)

    # ---- chat ----------------------------------------------------------------------------------

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True,
                            tools: list[dict] | None = None, **template_kwargs: Any) -> str:
        """The prompt text for `messages`, rendered with the model's jinja2 chat template exactly as
        transformers' apply_chat_template(tokenize=False) renders it. A model file without a
        template gets ChatML (<|im_start|>role\\ncontent<|im_end|>), as llama.cpp falls back to."""
        if not isinstance(messages, list) or not all(isinstance(m, dict) and "role" in m for m in messages):
            raise TandemError("messages must be a list of objects with a 'role' and a 'content'")
        # transformers drops keys set to None (e.g. "content": null next to tool_calls)
        messages = [{k: v for k, v in m.items() if v is not None} for m in messages]
        names = {"bos_token": self.bos_id, "eos_token": self.eos_id}
        variables = {k: self.tokens[i] for k, i in names.items() if i is not None} | template_kwargs
        template = _compile_template(self.chat_template or CHATML_TEMPLATE)
        try:
            return template.render(
                messages=messages, tools=tools, documents=None,
                add_generation_prompt=add_generation_prompt, **variables)
        except Exception as e:
            raise TandemError(
                f"the model's chat template failed on these messages: {type(e).__name__}: {e}") from None


class IncrementalDecoder:
    """Text for a stream of token ids, one token at a time, never splitting a UTF-8 character.

    Bytes of an unfinished character wait for the tokens that complete it, so
    "".join(push(i) for i in ids) + flush() == tokenizer.decode(ids). Example, with 😀 (F0 9F 98
    80) spread over two byte tokens: push(<F0 9F>) -> "", push(<98 80>) -> "😀". O(1) per token.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special: bool = False) -> None:
        self._piece = tokenizer.token_to_piece
        self._special = not skip_special
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        return self._utf8.decode(self._piece(token_id, special=self._special))

    def flush(self) -> str:
        """Whatever is still held back (an unfinished character comes out as U+FFFD)."""
        return self._utf8.decode(b"", final=True)


# ---- engine construction ---------------------------------------------------------------------


def _unique_vocab(tokens: list[str]) -> dict[str, int]:
    vocab = {t: i for i, t in enumerate(tokens)}
    if len(vocab) != len(tokens):
        seen: dict[str, int] = {}
        for i, t in enumerate(tokens):
            if t in seen:
                raise ModelFileError(f"duplicate token in the vocabulary: {t!r} has ids {seen[t]} and {i}")
            seen[t] = i
    return vocab


def _byte_level_engine(vocab: dict[str, int], merges: list[str] | None, pre: str) -> Engine:
    kind = _PRE_ALIASES.get(pre, pre)
    if kind not in _SPLITS:
        names = ", ".join(sorted({*_SPLITS, *_PRE_ALIASES}))
        raise TandemError(f"unsupported tokenizer.ggml.pre {pre!r}; supported: {names}")
    if not merges:
        raise ModelFileError("a gpt2 (BPE) tokenizer needs tokenizer.ggml.merges; the file has none")
    pairs = []
    for merge in merges:
        cut = merge.find(" ", 1)  # llama.cpp's split: a merge's left part may itself start with ' '
        pairs.append((merge[:cut], merge[cut + 1:]))
    try:
        engine = Engine(models.BPE(vocab, pairs, ignore_merges=kind in _IGNORE_MERGES))
    except Exception as e:
        raise ModelFileError(f"the GGUF BPE merges do not fit its vocabulary: {e}") from None
    engine.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in _SPLITS[kind]]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    return engine


def _sentencepiece_engine(vocab: dict[str, int], scores: list[float], unk: str,
                          add_space_prefix: bool) -> Engine:
    """SentencePiece BPE as llama.cpp runs it, expressed as BPE merges.

    llama.cpp repeatedly merges the adjacent pair whose joined text is the highest-scoring token.
    That is BPE with the merges (a, b) -> ab ranked by score(ab), best first: e.g. tokens
    ▁t (-5), he (-3), ▁the (-1) give merges [▁t he, ...] ordered ▁the, he, ▁t. Characters missing
    from the vocabulary become <0xXX> byte tokens. Spaces are '▁'; one is prepended to each piece
    of text (after special tokens too) when add_space_prefix.
    """
    candidates, known = [], vocab.__contains__
    for token, score in zip(vocab, scores):  # vocab keeps the id order
        for cut in range(1, len(token)):
            if known(token[:cut]) and known(token[cut:]):
                candidates.append((-score, vocab[token[:cut]], vocab[token[cut:]], token[:cut], token[cut:]))
    candidates.sort()
    engine = Engine(models.BPE(vocab, [(a, b) for *_, a, b in candidates], unk_token=unk, fuse_unk=True,
                               byte_fallback=True))
    steps = [normalizers.Prepend("▁")] if add_space_prefix else []
    engine.normalizer = normalizers.Sequence([*steps, normalizers.Replace(" ", "▁")])
    return engine


def _add_special_tokens(engine: Engine, tokens: list[str], types: list[int], eog: set[int]) -> None:
    """Control/unknown (and end-of-generation) tokens as special added tokens, user-defined ones as
    plain added tokens; both are cut out of the raw text whole before the pre-tokenizer sees it."""
    special = [i for i, k in enumerate(types) if k in (CONTROL, UNKNOWN) or i in eog]
    engine.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False) for i in special])
    engine.add_tokens([AddedToken(t, special=False, normalized=False)
                       for i, (t, k) in enumerate(zip(tokens, types)) if k == USER_DEFINED and i not in eog])


def _eog_ids(vocab: dict[str, int], types: list[int], ids: list[int | None],
             fim: dict[str, int | None]) -> set[int]:
    """llama.cpp's end-of-generation set: EOS/EOT/EOM, tokens with EOG_TEXTS, FIM pad/repo/sep.

    One deviation: a "</s>" the file marks as a normal or user-defined token is text (an HTML tag
    in Qwen's and Gemma 3's vocabularies), not an end marker as in current llama.cpp.
    """
    by_text = {vocab[t] for t in EOG_TEXTS if t in vocab}
    if "</s>" in vocab and types[vocab["</s>"]] in (NORMAL, USER_DEFINED):
        by_text.discard(vocab["</s>"])
    eog = by_text | {i for i in ids if i is not None}
    for key, texts in _FIM_EOG_TEXTS.items():
        found = fim.get(key)
        found = found if found is not None else next((vocab[t] for t in texts if t in vocab), None)
        if found is not None:
            eog.add(found)
    # llama.cpp's exceptions: gpt-oss / solar-open's "<|end|>" and gemma4's "</s>" do not end generation
    if {"<|return|>", "<|call|>"} <= vocab.keys() or {"<|calls|>", "<|flush|>"} <= vocab.keys():
        eog.discard(vocab.get("<|end|>"))
    if "<|tool_response>" in vocab:
        eog.discard(vocab.get("</s>"))
    return eog


def _hf_vocab_type(engine: Engine, path: Path) -> str:
    """"gpt2" for byte-level BPE, "llama" for SentencePiece-style BPE ('▁' spaces, <0xXX> bytes)."""
    shape = f"{engine.pre_tokenizer!r} {engine.normalizer!r} {engine.decoder!r}"
    if isinstance(engine.model, models.BPE) and "ByteLevel" in shape:
        return "gpt2"
    if isinstance(engine.model, models.BPE) and (engine.model.byte_fallback or "▁" in shape):
        return "llama"
    raise TandemError(f"{path}/tokenizer.json: a {type(engine.model).__name__} tokenizer that is neither "
                      "byte-level nor SentencePiece-style BPE is not supported")


def _hf_special_id(engine: Engine, config: dict, model_config: dict, name: str) -> int | None:
    """The id of e.g. "bos_token" named in tokenizer_config.json, else config.json's "bos_token_id"."""
    value = config.get(name)
    value = value.get("content") if isinstance(value, dict) else value
    found = engine.token_to_id(value) if isinstance(value, str) else None
    fallback = model_config.get(f"{name}_id")
    return found if found is not None else fallback[0] if isinstance(fallback, list) else fallback


def _is_byte_token(text: str) -> bool:
    return len(text) == 6 and text.startswith("<0x") and text.endswith(">")


def _read_json(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ModelFileError(f"{path} is not valid JSON: {e}") from None
    return value if isinstance(value, dict) else {}


def _hf_chat_template(path: Path, config: dict) -> str | None:
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: [{"name": "default", "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    if template is None and (path / "chat_template.jinja").is_file():
        template = (path / "chat_template.jinja").read_text(encoding="utf-8")
    if template is None:
        template = _read_json(path / "chat_template.json").get("chat_template")
    return template if isinstance(template, str) else None


# ---- chat templates: the environment transformers renders them in ----------------------------


@lru_cache(maxsize=8)
def _compile_template(source: str):
    import jinja2
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationTag(Extension):
        """transformers' `{% generation %}...{% endgeneration %}` (marks assistant text): renders its body."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    class Lenient(jinja2.Undefined):
        """An undefined variable joined to text adds nothing, as llama.cpp's template engine
        reads it (FireFunction v2's template adds `functions`, which only llama.cpp's own
        handler defines); where transformers would raise, llama-server renders."""

        def __add__(self, other):
            return other

        __radd__ = __add__

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, undefined=Lenient,
                                        extensions=[GenerationTag, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(source)
    except jinja2.exceptions.TemplateSyntaxError as e:
        raise TandemError(
            f"the model's chat template is not valid jinja2 (line {e.lineno}): {e.message}") from None
