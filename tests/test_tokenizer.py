"""The tokenizer: unit behaviour on tiny generated vocabularies (checked against the `tokenizers`
and `sentencepiece` reference implementations), and agreement with transformers on the real
GGUF files (marked real)."""

from __future__ import annotations

import io
import json
import random
import time
from functools import lru_cache

import pytest

from tandem.errors import TandemError
from tandem.tokenizer import CONTROL, NORMAL, UNUSED, USER_DEFINED, Tokenizer

CORPUS = [
    "def add(a, b):\n    return a + b\n",
    "The quick brown fox jumps over the lazy dog. " * 3,
    "for i in range(10):\n    print(i * i)\n",
    "Once upon a time there was a small robot who loved to read. It's what we'd do.",
    "héllo wörld — naïve café 日本語 12345",
] * 4
CONTROLS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|fim_pad|>"]
USER = ["<think>"]
TEXTS = [
    "def add(a, b):\n\treturn a + b  # sum\n\n",
    "The quick brown fox, 12345 foxes; it's 3.14!",
    "héllo wörld 日本語 😀 👨‍👩‍👧",
    "   spaces   and\ttabs\t\t\n\n\n  newlines  ",
    "", " ", "x",
]


@lru_cache(maxsize=1)
def reference_bpe():
    """A byte-level BPE trained with `tokenizers` on CORPUS (GPT-2 pre-tokenizer regex), with the
    control tokens as special and <think> as a plain added token."""
    from tokenizers import AddedToken, Tokenizer as Engine, models, pre_tokenizers, trainers

    ref = Engine(models.BPE())
    ref.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    ref.train_from_iterator(CORPUS, trainer)
    ref.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in CONTROLS])
    ref.add_tokens([AddedToken(t, special=False, normalized=False) for t in USER])
    return ref


def gguf_meta(**over) -> dict:
    """The tokenizer metadata of a GGUF file (as GGUFFile.metadata has it) for reference_bpe()."""
    ref = reference_bpe()
    model = json.loads(ref.to_str())["model"]
    vocab = ref.get_vocab(with_added_tokens=True)
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    types = [CONTROL if t in CONTROLS else USER_DEFINED if t in USER else NORMAL for t in tokens]
    meta = {
        "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "gpt-2",
        "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.merges": [m if isinstance(m, str) else " ".join(m) for m in model["merges"]],
        "tokenizer.ggml.bos_token_id": vocab["<|endoftext|>"],
        "tokenizer.ggml.eos_token_id": vocab["<|im_end|>"],
        "tokenizer.chat_template": None,
    }
    return {**meta, **{f"tokenizer.ggml.{k}": v for k, v in over.items()}}


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.from_gguf_metadata(gguf_meta())


def test_encode_matches_the_reference_bpe_and_decodes_back(tok):
    ref = reference_bpe()
    for text in TEXTS + CORPUS[:5] + ["<|im_start|>user\nhi<think>x</think><|im_end|>"]:
        ids = tok.encode(text, add_special=False)
        assert ids == ref.encode(text, add_special_tokens=False).ids, text
        assert tok.decode(ids) == text


def test_control_tokens_are_parsed_only_when_asked(tok):
    start = tok.tokens.index("<|im_start|>")
    assert tok.encode("<|im_start|>user", parse_special=True)[0] == start
    plain = tok.encode("<|im_start|>user", parse_special=False)
    assert start not in plain and len(plain) > 2
    assert tok.decode(plain) == "<|im_start|>user"


def test_user_defined_tokens_are_always_matched_whole(tok):
    think = tok.tokens.index("<think>")
    for parse in (True, False):
        assert tok.encode("a<think>b", parse_special=parse).count(think) == 1


def test_bos_and_eos_are_added_as_the_file_says(tok):
    assert not tok.add_bos and tok.encode("hi")[0] != tok.bos_id  # gpt-2 pre: no BOS by default
    both = Tokenizer.from_gguf_metadata(gguf_meta(add_bos_token=True, add_eos_token=True))
    ids = both.encode("hi")
    assert ids[0] == both.bos_id and ids[-1] == both.eos_id
    assert both.encode("hi", add_special=False) == ids[1:-1]
    # llama.cpp adds BOS for a llama3 pre-tokenizer when the file does not say
    assert Tokenizer.from_gguf_metadata(gguf_meta(pre="llama-bpe")).add_bos


def test_end_of_generation_ids_follow_llama_cpp():
    meta = gguf_meta(eos_token_id=None)
    tokens = meta["tokenizer.ggml.tokens"] + ["</s>", "[PAD9]"]
    meta["tokenizer.ggml.tokens"] = tokens
    meta["tokenizer.ggml.token_type"] = meta["tokenizer.ggml.token_type"] + [NORMAL, UNUSED]
    t = Tokenizer.from_gguf_metadata(meta)
    eog = {t.tokens[i] for i in t.eog_ids}
    assert eog == {"<|im_end|>", "<|endoftext|>", "<|fim_pad|>"}  # "</s>" as plain text is no end
    with_eos = Tokenizer.from_gguf_metadata(gguf_meta(eos_token_id=5))
    assert 5 in with_eos.eog_ids


def test_decode_can_skip_control_tokens_but_keeps_user_defined(tok):
    ids = tok.encode("<|im_start|>hi<think><|im_end|>")
    assert tok.decode(ids) == "<|im_start|>hi<think><|im_end|>"
    assert tok.decode(ids, skip_special=True) == "hi<think>"


def test_token_to_piece_gives_raw_bytes_of_a_split_character(tok):
    ids = tok.encode("😀", add_special=False)
    assert len(ids) == 4  # no merges for it in this vocabulary: one byte-level token per byte
    assert [tok.token_to_piece(i) for i in ids] == [b"\xf0", b"\x9f", b"\x98", b"\x80"]
    with pytest.raises(TandemError, match="out of range"):
        tok.token_to_piece(tok.vocab_size)


def test_incremental_decoding_never_shows_half_a_character(tok):
    text = "a😀b日本語é"
    ids = tok.encode(text, add_special=False)
    dec = tok.incremental()
    chunks = [dec.push(i) for i in ids] + [dec.flush()]
    assert "".join(chunks) == text
    assert all("\ufffd" not in c for c in chunks)
    assert chunks[1:4] == ["", "", ""]  # the first three bytes of 😀 wait for the fourth


def test_incremental_decoding_equals_decode_on_any_ids(tok):
    rng = random.Random(0)
    for skip in (False, True):
        for _ in range(200):
            ids = [rng.randrange(tok.vocab_size) for _ in range(rng.randrange(1, 12))]
            dec = tok.incremental(skip_special=skip)
            streamed = "".join(dec.push(i) for i in ids) + dec.flush()
            assert streamed == tok.decode(ids, skip_special=skip), ids


def test_pre_tokenizer_types_split_text_as_llama_cpp_does():
    def pieces(pre: str, text: str) -> list[str]:
        t = Tokenizer.from_gguf_metadata(gguf_meta(pre=pre))
        return [t.decode([i]) for i in t.encode(text, add_special=False)]

    assert pieces("qwen2", "x 12345") == ["x", " ", "1", "2", "3", "4", "5"]  # digit by digit
    assert pieces("smollm", "x 12345") == ["x", " ", "1", "2", "3", "4", "5"]
    llama3 = pieces("llama-bpe", "12345")  # groups of at most three digits: 123|45
    assert "".join(llama3) == "12345" and "123" in {"".join(llama3[:k]) for k in range(len(llama3))}
    assert pieces("gpt-2", "x 12345") == ["x", " 12345"]  # the vocabulary has the whole number
    assert pieces("default", "it's")[-2:] == ["'", "s"]  # punctuation is split off first


def test_bad_tokenizer_metadata_is_refused_with_the_accepted_values():
    with pytest.raises(TandemError, match="unsupported tokenizer.ggml.pre 'nope'.*qwen2.*smollm"):
        Tokenizer.from_gguf_metadata(gguf_meta(pre="nope"))
    with pytest.raises(TandemError, match="unsupported tokenizer.ggml.model 'bert'; supported: gpt2, llama"):
        Tokenizer.from_gguf_metadata(gguf_meta(model="bert"))
    with pytest.raises(TandemError, match="needs tokenizer.ggml.merges"):
        Tokenizer.from_gguf_metadata(gguf_meta(merges=[]))
    dup = gguf_meta()
    dup["tokenizer.ggml.tokens"] = dup["tokenizer.ggml.tokens"][:-1] + ["a"]
    with pytest.raises(TandemError, match="duplicate token"):
        Tokenizer.from_gguf_metadata(dup)


# ---- chat templates ---------------------------------------------------------------------------


def test_chat_template_renders_like_transformers():
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer.from_gguf_metadata(gguf_meta())
    tok.chat_template = (
        "{{ bos_token }}{% for m in messages %}{% if m.role == 'bad' %}{{ raise_exception('no bad roles') }}"
        "{% endif %}{% generation %}{{ m.role }}={{ m.content | tojson }}{% endgeneration %}\n"
        "{% if loop.index > 1 %}{% break %}{% endif %}{% endfor %}{{ strftime_now('%Y') | length }}"
        "{% if add_generation_prompt %}<go>{% endif %}"
    )
    fast = PreTrainedTokenizerFast(tokenizer_object=reference_bpe(), bos_token="<|endoftext|>",
                                   chat_template=tok.chat_template)
    msgs = [{"role": "user", "content": "é\"<"}, {"role": "x", "content": 1}, {"role": "y", "content": 2}]
    for gen in (True, False):
        out = tok.apply_chat_template(msgs, add_generation_prompt=gen)
        assert out == fast.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen)
    assert out == '<|endoftext|>user="é\\"<"x=14'  # tojson keeps non-ASCII, loop stops after 2
    with pytest.raises(TandemError, match="no bad roles"):
        tok.apply_chat_template([{"role": "bad", "content": ""}])
    with pytest.raises(TandemError, match="list of objects with a 'role'"):
        tok.apply_chat_template([{"content": "hi"}])
    tok.chat_template = "{% for %}"
    with pytest.raises(TandemError, match="not valid jinja2"):
        tok.apply_chat_template([{"role": "user", "content": "hi"}])


def test_no_template_falls_back_to_chatml(tok):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert tok.chat_template is None
    assert tok.apply_chat_template(msgs) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    assert tok.apply_chat_template(msgs, add_generation_prompt=False).endswith("Hi<|im_end|>\n")


# ---- SentencePiece ("llama") vocabularies ------------------------------------------------------


@lru_cache(maxsize=1)
def sentencepiece_model():
    spm = pytest.importorskip("sentencepiece")
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS), model_writer=buf, vocab_size=400, model_type="bpe",
        byte_fallback=True,
        normalization_rule_name="identity", remove_extra_whitespaces=False, hard_vocab_limit=False,
        user_defined_symbols=USER, control_symbols=["<|im_start|>", "<|im_end|>"], minloglevel=2)
    return spm.SentencePieceProcessor(model_proto=buf.getvalue())


def spm_meta(sp) -> dict:
    def kind(i):
        return (2 if sp.is_unknown(i) else 3 if sp.is_control(i) else 6 if sp.is_byte(i)
                else 4 if sp.id_to_piece(i) in USER else 1)

    n = sp.get_piece_size()
    return {
        "tokenizer.ggml.model": "llama", "tokenizer.ggml.pre": "default",
        "tokenizer.ggml.tokens": [sp.id_to_piece(i) for i in range(n)],
        "tokenizer.ggml.scores": [sp.get_score(i) for i in range(n)],
        "tokenizer.ggml.token_type": [kind(i) for i in range(n)],
        "tokenizer.ggml.bos_token_id": sp.bos_id(), "tokenizer.ggml.eos_token_id": sp.eos_id(),
        "tokenizer.ggml.unknown_token_id": sp.unk_id(),
    }


def test_sentencepiece_vocab_encodes_like_sentencepiece():
    sp = sentencepiece_model()
    t = Tokenizer.from_gguf_metadata(spm_meta(sp))
    assert t.vocab_type == "llama" and t.add_bos  # llama.cpp's default for SentencePiece
    for text in TEXTS[:4] + CORPUS[:5] + ["The  quick\u00a0fox ✓"]:
        ids = t.encode(text)
        assert ids == [sp.bos_id(), *sp.encode(text)], text
        assert t.decode(ids, skip_special=True) == " " + text  # the encoder's prefix space stays
    # after a special token the text gets a prefix space again, as llama.cpp does
    start = t.tokens.index("<|im_start|>")
    assert t.encode("<|im_start|>quick", add_special=False) == [start, *sp.encode("quick")]
    assert t.decode(t.encode("✓", add_special=False)) == " ✓"  # via <0xE2> <0x9C> <0x93>


# ---- Hugging Face directories ------------------------------------------------------------------


def test_hf_directory_with_byte_level_bpe(tmp_path):
    from transformers import PreTrainedTokenizerFast

    template = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{{ eos_token }}{% endfor %}"
    fast = PreTrainedTokenizerFast(tokenizer_object=reference_bpe(), bos_token="<|endoftext|>",
                                   eos_token="<|im_end|>", chat_template=template)
    fast.save_pretrained(tmp_path)
    t = Tokenizer.from_hf_dir(tmp_path)
    assert t.vocab_type == "gpt2" and not t.add_bos and not t.add_eos
    assert (t.bos_id, t.eos_id) == (fast.bos_token_id, fast.eos_token_id)
    assert t.eos_id in t.eog_ids
    for text in TEXTS + ["<|im_start|>x<think><|im_end|>"]:
        assert t.encode(text) == fast.encode(text, add_special_tokens=False)
        assert t.decode(t.encode(text)) == text
    msgs = [{"role": "user", "content": "hi"}]
    expected = fast.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert t.apply_chat_template(msgs) == expected


def test_hf_directory_with_sentencepiece_bpe(tmp_path):
    from transformers import LlamaTokenizer

    sp = sentencepiece_model()
    (tmp_path / "tokenizer.model").write_bytes(sp.serialized_model_proto())
    LlamaTokenizer.from_pretrained(tmp_path, legacy=False).save_pretrained(tmp_path / "hf")
    hf = LlamaTokenizer.from_pretrained(tmp_path / "hf")
    t = Tokenizer.from_hf_dir(tmp_path / "hf")
    assert t.vocab_type == "llama" and (t.bos_id, t.eos_id) == (sp.bos_id(), sp.eos_id())
    for text in TEXTS[:4]:
        assert t.encode(text) == hf.encode(text), text
    ids = t.encode("✓ x")
    assert [t.token_to_piece(i) for i in ids[:4]] == [b" ", b"\xe2", b"\x9c", b"\x93"]  # byte fallback
    assert t.decode(ids) == " ✓ x"


def test_hf_directory_without_tokenizer_json_is_refused(tmp_path):
    with pytest.raises(TandemError, match="no tokenizer.json"):
        Tokenizer.from_hf_dir(tmp_path)


# ---- the real models --------------------------------------------------------------------------

REAL_TEXTS = [
    "def fib(n):\n    if n < 2:\n\t\treturn n\n    return fib(n - 1) + fib(n - 2)\n",
    "Numbers: 12345 3.14159 1,000,000 -42 0x1F 2024-01-01",
    "héllo wörld — naïve café ñ ß",
    "Emoji 👋🏽 family 👨‍👩‍👧‍👦 flag 🇯🇵 😀",
    "你好，世界！こんにちは 안녕하세요 Привет мир العربية",
    "I'm sure you can't, we'll see, they've gone; HE'S HERE, I'D",
    "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n",
    "a    b\t\t c   \n\n\n  d  ", "line1\r\nline2\n\n  \n", "   leading and trailing   ",
    "", " ", "\n", "<tool_call>{\"a\": 1}</tool_call>", "<|fim_prefix|>x<|fim_suffix|>y<|fim_middle|>",
]


@pytest.fixture(scope="module")
def real():
    """name -> (ours, transformers' tokenizer built from the same GGUF metadata, our build time in
    seconds, the metadata) for the Qwen target and SmolLM2."""
    from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_TOKENIZER_MAPPING as KEYS
    from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer

    from tandem.models.gguf_file import GGUFFile
    from tandem.registry import pull

    out = {}
    for name in ("default", "smollm2-135m"):
        g = GGUFFile(pull(name, quiet=True))
        t0 = time.perf_counter()
        ours = Tokenizer.from_gguf_metadata(g.metadata)
        build_s = time.perf_counter() - t0
        # transformers' own GGUF reader would read the file a second time; its key table suffices
        tokenizer_dict = {name: g.metadata[f"tokenizer.{key}"] for key, name in KEYS["tokenizer"].items()
                          if f"tokenizer.{key}" in g.metadata}
        out[name] = (ours, convert_gguf_tokenizer(g.arch, tokenizer_dict)[0], build_s, g.metadata)
    return out


@pytest.mark.real
@pytest.mark.parametrize("name", ["default", "smollm2-135m"])
def test_real_encode_matches_transformers(real, name):
    ours, ref, _, _ = real[name]
    for parse_special in (True, False):
        ref.encode_special_tokens = not parse_special
        for text in REAL_TEXTS:
            ids = ours.encode(text, add_special=False, parse_special=parse_special)
            assert ids == ref.encode(text, add_special_tokens=False).ids, (text, parse_special)
            assert ours.decode(ids) == text
    ref.encode_special_tokens = False


@pytest.mark.real
def test_real_qwen_vocabulary_facts(real):
    qwen, _, build_s, _ = real["default"]
    smol = real["smollm2-135m"][0]
    assert (qwen.vocab_type, qwen.pre, qwen.vocab_size) == ("gpt2", "qwen2", 151936)
    assert (qwen.bos_id, qwen.eos_id, qwen.add_bos, qwen.add_eos) == (151643, 151645, False, False)
    assert qwen.encode("hi") == qwen.encode("hi", add_special=False)  # Qwen adds no BOS
    assert [qwen.decode([i]) for i in qwen.encode("12345")] == list("12345")  # digits one by one
    # llama-server lists these EOG tokens for Qwen2.5-Coder
    assert {qwen.tokens[i] for i in qwen.eog_ids} == {
        "<|endoftext|>", "<|im_end|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>"}
    assert (smol.pre, smol.bos_id, smol.eos_id, smol.add_bos) == ("smollm", 1, 2, False)
    assert build_s < 5.0, f"building the Qwen tokenizer took {build_s:.1f}s"


@pytest.mark.real
def test_real_qwen_chat_template_matches_transformers(real):
    from transformers import PreTrainedTokenizerFast

    qwen, ref, _, meta = real["default"]
    fast = PreTrainedTokenizerFast(tokenizer_object=ref, chat_template=meta["tokenizer.chat_template"],
                                   bos_token="<|endoftext|>", eos_token="<|im_end|>")
    user = [{"role": "user", "content": "Write a haiku about tabs\tand spaces."}]
    for msgs in ([{"role": "system", "content": "You are terse."}, *user], user):
        assert qwen.apply_chat_template(msgs) == fast.apply_chat_template(
            msgs, tokenize=False, add_generation_prompt=True)
    assert qwen.apply_chat_template(user).startswith(
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.")


@pytest.mark.real
def test_real_qwen_streaming_keeps_characters_whole(real):
    qwen = real["default"][0]
    text = "Ωmega 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 🦜🪿 龘靐齉 done"
    ids = qwen.encode(text, add_special=False)
    assert any(qwen.token_to_piece(i).decode("utf-8", errors="ignore").encode() != qwen.token_to_piece(i)
               for i in ids), "the text should contain a character split across tokens"
    dec = qwen.incremental()
    chunks = [dec.push(i) for i in ids] + [dec.flush()]
    assert "".join(chunks) == text and all("\ufffd" not in c for c in chunks)
