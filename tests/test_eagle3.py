"""EAGLE-3 heads (models/eagle3.py, speculative/eagle.py) on tiny random targets and heads.

The head's outputs against a float reference written from the paper and llama.cpp's
eagle3.cpp (tests/tiny_eagle.py), in both formats; the target's features against
transformers' hidden states; the engine's drafts against the reference's predictions from the
whole sequence (the pairing of tokens and features is what acceptance rests on); greedy and
seeded output unchanged by a head; bad heads refused by name, before a server starts.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from gguf import GGMLQuantizationType as QT

from tandem import kernels
from tandem.config import EngineConfig, Numerics, SamplingParams, SpecConfig
from tandem.engine import Engine, Request
from tandem.errors import ModelFileError, TandemError
from tandem.models.decoder import KVCache
from tandem.models.eagle3 import is_head, load_head
from tandem.models.loader import load_model
from tandem.speculative.eagle import Eagle3Proposer

from . import tiny
from . import tiny_eagle as te

PROMPT = [5, 17, 42, 99, 3, 250, 7, 8, 9, 10, 11, 120, 33, 34, 35, 36, 37]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """(transformers target, its GGUF path, loaded target, head config, head weights)."""
    d = tmp_path_factory.mktemp("eagle")
    hf = tiny.hf_model("qwen2", seed=3)
    path = tiny.write_gguf(hf, d / "t.gguf", "qwen2")
    target = load_model(path, Numerics(dtype="float32"), max_len=600)
    cfg = te.head_config(hf.config)
    return hf, path, target, cfg, te.head_weights(cfg, seed=1)


def _features(target, ids: list[int], layers) -> torch.Tensor:
    target.model.feature_layers = tuple(layers)
    cache = KVCache(target.args, 1, 256, torch.float32)
    feats = torch.zeros(len(ids), len(layers) * target.args.dim)
    target.model.forward_packed(ids, cache, [0] * len(ids), list(range(len(ids))), [],
                                features=feats)
    return feats


def test_features_are_the_inputs_of_the_named_layers(pair):
    hf, _, target, _, _ = pair
    n, d = target.args.n_layers, target.args.dim
    feats = _features(target, PROMPT, (1, 0, n))
    with torch.no_grad():
        hs = hf(torch.tensor([PROMPT]), output_hidden_states=True).hidden_states
    assert torch.allclose(feats[:, :d], hs[1][0], atol=1e-5)
    assert torch.equal(feats[:, d: 2 * d], target.model.embed(torch.tensor(PROMPT)))
    # the id n_layers: the final pre-norm output (transformers' last entry is normed)
    normed = feats[:, 2 * d:] * torch.rsqrt(feats[:, 2 * d:].pow(2).mean(-1, keepdim=True)
                                            + target.args.norm_eps) * target.model.norm
    assert torch.allclose(normed, hs[-1][0], atol=1e-5)


@pytest.mark.skipif(not kernels.available(), reason="native kernels unavailable")
def test_the_c_layers_hand_the_same_features(tmp_path):
    path = tiny.write_gguf(tiny.hf_model("qwen2", seed=5), tmp_path / "q.gguf", "qwen2",
                           qtype=QT.Q8_0)
    m = load_model(path, Numerics(weights="native", activations="int16"), max_len=128)
    layers = (1, 0, m.args.n_layers)
    got = _features(m, PROMPT, layers)
    cache = KVCache(m.args, 1, 128, torch.float32)
    assert m.model.native_layers(cache) is not None
    m.model._native = None  # the PyTorch layers, same kernels
    want = _features(m, PROMPT, layers)
    assert (got - want).abs().max() <= 2e-4 * want.abs().max()


@pytest.mark.parametrize("fmt", ["hf", "gguf"])
@pytest.mark.parametrize("variant", ["plain", "norms", "own-embed"])
def test_head_matches_the_float_reference(pair, tmp_path, fmt, variant):
    """Pairs read as a prompt chunk, then one at a time (the cache), equal the reference's
    whole-sequence pass: pre-norm outputs, logits and the mapped target ids."""
    hf, _, target, cfg, w = pair
    if variant == "norms":
        cfg = {**cfg, "norm_before_residual": True, "norm_before_fc": True}
    if variant != "plain":
        w = te.head_weights(cfg, seed=2, own_embed=variant == "own-embed")
    path = (te.write_hf(cfg, w, tmp_path / "h") if fmt == "hf"
            else te.write_gguf(cfg, w, tmp_path / "h.gguf"))
    assert is_head(path)
    head = load_head(path, target)
    feats = _features(target, PROMPT, cfg["eagle_aux_hidden_state_layer_ids"])[:-1]
    ref_h, ref_logits, ref_ids = te.reference(cfg, w, hf.model.embed_tokens.weight.detach(),
                                              feats, PROMPT[1:])
    cache = head.cache(2, 64)
    g = head.encode(feats)
    h = [head.forward(PROMPT[1:9], g[:8], cache, 1, 0)]
    h += [head.forward([t], g[8 + i: 9 + i], cache, 1, 8 + i) for i, t in enumerate(PROMPT[9:])]
    h = torch.cat(h)
    logits = head.logits(h)
    assert torch.allclose(h, ref_h, atol=1e-4)
    assert torch.allclose(logits, ref_logits, atol=1e-4)
    assert head.to_target(logits.argmax(-1)) == ref_ids.tolist()


@pytest.mark.skipif(not kernels.available(), reason="native kernels unavailable")
def test_a_quantized_head_runs_on_the_kernels(pair, tmp_path):
    hf, _, target, cfg, w = pair
    head = load_head(te.write_gguf(cfg, w, tmp_path / "q.gguf", qtype=QT.Q8_0), target,
                     Numerics(weights="native"))
    assert type(head.w["wq"]).__name__ == "GGUFLinear"
    feats = _features(target, PROMPT, cfg["eagle_aux_hidden_state_layer_ids"])[:-1]
    _, ref_logits, _ = te.reference(cfg, w, hf.model.embed_tokens.weight.detach(), feats,
                                    PROMPT[1:])
    logits = head.logits(head.forward(PROMPT[1:], head.encode(feats), head.cache(1, 64), 0, 0))
    assert (logits - ref_logits).abs().max() <= 0.05 * ref_logits.abs().max()


def _engine(target, head, types: str, **cfg) -> Engine:
    return Engine(target, head, EngineConfig(ctx_size=512, **cfg), SpecConfig(types=types))


def _run(engine: Engine, sampling: SamplingParams, prompt=PROMPT):
    return engine.generate(Request(prompt_ids=list(prompt), sampling=sampling))


GREEDY = SamplingParams(temperature=0.0, n_predict=48)


@pytest.mark.parametrize("types", ["draft-eagle3", "auto"])
def test_greedy_output_is_the_targets(pair, tmp_path, types):
    _, _, target, cfg, w = pair
    head = load_head(te.write_gguf(cfg, w, tmp_path / "h.gguf"), target)
    alone = _run(_engine(target, None, "none"), GREEDY)
    e = _engine(target, head, types)
    for prompt in (PROMPT, PROMPT[:3], [PROMPT[0]]):
        got = _run(e, GREEDY, prompt)
        assert got.output == _run(_engine(target, None, "none"), GREEDY, prompt).output
    assert _run(e, GREEDY).output == alone.output
    assert e.spec.types[-1] == "draft-eagle3"


def test_seeded_sampling_gives_the_targets_text(pair, tmp_path):
    """The head proposes its top token and the target draws its own sample at each row, so a
    seed gives the text it gives without speculation (as llama-server)."""
    _, _, target, cfg, w = pair
    head = load_head(te.write_hf(cfg, w, tmp_path / "h"), target)
    s = SamplingParams(temperature=0.9, top_k=0, top_p=1.0, min_p=0.0, seed=11, n_predict=40)
    assert _run(_engine(target, head, "draft-eagle3"), s).output == \
        _run(_engine(target, None, "none"), s).output


def test_drafts_are_the_references_predictions(pair, tmp_path, monkeypatch):
    """In the engine's loop, each first drafted token is what the reference predicts from the
    target's features of the whole sequence so far: the head reads the pair (token[P+1],
    g_P) at position P, prompt chunks and verified rows alike, and nothing else."""
    hf, _, target, cfg, w = pair
    head = load_head(te.write_gguf(cfg, w, tmp_path / "h.gguf"), target)
    seen: list[tuple[int, int]] = []
    propose = Eagle3Proposer.propose

    def spy(self, k, extend=None):
        d = propose(self, k, extend)
        if d.ids:
            seen.append((len(self.tokens), d.ids[0]))
        return d

    monkeypatch.setattr(Eagle3Proposer, "propose", spy)
    e = _engine(target, head, "draft-eagle3", prefill_chunk=5)
    _run(_engine(target, None, "none"), GREEDY)  # another engine on the same target between
    out = _run(e, GREEDY).output
    assert len(seen) >= len(out) // 2
    _agree(seen, cfg, w, hf.model.embed_tokens.weight.detach(), target, PROMPT + out)


def _agree(seen, cfg, w, emb, target, seq) -> None:
    """Each first drafted token (n tokens known: the pair at n - 2 predicts token n) is the
    reference's prediction from the whole sequence, wherever the reference's top two are
    apart by more than a prompt chunk's rounding can move them (the features of a prompt read
    in other chunks differ in the last bits; verification rows never do)."""
    feats = _features(target, seq, cfg["eagle_aux_hidden_state_layer_ids"])
    _, logits, ref = te.reference(cfg, w, emb, feats[:-1], seq[1:])
    top2 = logits.topk(2, -1).values
    clear = [(n, first) for n, first in seen if top2[n - 2, 0] - top2[n - 2, 1] > 1e-2]
    assert len(clear) >= 0.8 * len(seen) > 0
    for n, first in clear:
        assert first == int(ref[n - 2]), n


def test_spec_types_and_a_head(pair, tmp_path):
    _, _, target, cfg, w = pair
    head = load_head(te.write_gguf(cfg, w, tmp_path / "h.gguf"), target)
    with pytest.raises(TandemError, match="draft-eagle3"):
        _engine(target, head, "draft-simple")
    with pytest.raises(TandemError, match="needs an EAGLE-3 head"):
        _engine(target, None, "draft-eagle3")
    assert _engine(target, head, "auto").spec.types == ["suffix", "draft-eagle3"]


# ---- bad heads ------------------------------------------------------------------------------


BAD = {
    "another target's width": (dict(meta={"target_hidden_size": 96}), "target_hidden_size"),
    "two target layers": (dict(meta={"target_layers": [0, 1]}), "exactly 3"),
    "a layer past the target": (dict(meta={"target_layers": [0, 1, 7]}), "names layer 7"),
    "no target layers": (dict(meta={"target_layers": None}), "eagle3.target_layers"),
    "another vocabulary": (dict(tokens=[f"t{i}" for i in range(50)]), "another target"),
    "no fc": (dict(drop=("fc.weight",)), "'fc.weight'"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_heads_are_refused_by_name(pair, tmp_path, case):
    _, _, target, cfg, w = pair
    how, match = BAD[case]
    path = te.write_gguf(cfg, w, tmp_path / "bad.gguf", **how)
    with pytest.raises(ModelFileError, match=match):
        load_head(path, target)


def test_a_d2t_outside_the_vocabulary_is_refused(pair, tmp_path):
    _, _, target, cfg, w = pair
    w = dict(w, d2t=w["d2t"].clone())
    w["d2t"][3] = 10_000
    with pytest.raises(ModelFileError, match="d2t.*draft id 3.*outside"):
        load_head(te.write_gguf(cfg, w, tmp_path / "bad.gguf"), target)
    with pytest.raises(ModelFileError, match="d2t.*draft id 3.*outside"):
        load_head(te.write_hf(cfg, w, tmp_path / "bad"), target)


def test_a_truncated_head_is_refused(pair, tmp_path):
    _, _, target, cfg, w = pair
    path = te.write_gguf(cfg, w, tmp_path / "h.gguf")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) * 2 // 3])
    with pytest.raises(ModelFileError, match="truncated|extends past"):
        load_head(path, target)


def test_the_server_refuses_a_bad_head_before_it_starts(pair, tmp_path):
    _, target_path, _, cfg, w = pair
    bad = te.write_gguf(cfg, w, tmp_path / "bad.gguf", meta={"target_layers": [0, 1]})
    r = subprocess.run([sys.executable, "-m", "tandem.cli", "serve", "-m", str(target_path),
                        "--model-draft", str(bad), "--spec-type", "draft-eagle3",
                        "--port", "1"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert "eagle3.target_layers" in r.stderr and "exactly 3" in r.stderr
    assert "listening" not in (r.stderr + r.stdout).lower()


@pytest.mark.parametrize("fmt", ["hf", "gguf"])
def test_a_trained_heads_exports_run_as_it_trained(pair, tmp_path, fmt):
    """`tandem train-head`'s module (the float reference it trains) exported, then loaded by
    the runtime: the same draft logits for the same pairs."""
    from tandem.models.gguf_file import GGUFFile
    from tandem.train.export import export_gguf, export_hf
    from tandem.train.head import Eagle3Head as Trained
    from tandem.train.head import HeadConfig

    hf, target_path, target, cfg, _ = pair
    n = target.args.n_layers
    c = HeadConfig(hidden_size=64, intermediate_size=96, num_attention_heads=4,
                   num_key_value_heads=2, vocab_size=target.args.vocab_size,
                   draft_vocab_size=40, target_hidden_size=64,
                   eagle_aux_hidden_state_layer_ids=[0, 1, n])
    torch.manual_seed(4)
    m = Trained(c)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.1 * torch.randn_like(p))
    m.set_vocabulary(torch.randperm(c.vocab_size)[:40].sort().values)
    emb = hf.model.embed_tokens.weight.detach()
    m.target_embed = emb
    if fmt == "hf":
        export_hf(m, tmp_path)
        path = tmp_path
    else:
        path = tmp_path / "head.gguf"
        export_gguf(m, path, GGUFFile(target_path).metadata, "f32")
    head = load_head(path, target)
    feats = _features(target, PROMPT, c.eagle_aux_hidden_state_layer_ids)[:-1]
    with torch.no_grad():
        g = m.encode(feats)[None]
        want_h, want, _ = m(torch.tensor([PROMPT[1:]]), g, torch.arange(len(PROMPT) - 1))
    got_h = head.forward(PROMPT[1:], head.encode(feats), head.cache(1, 64), 0, 0)
    assert torch.allclose(got_h, want_h[0], atol=1e-4)
    assert torch.allclose(head.logits(got_h), want[0], atol=1e-4)
    ids = want[0].argmax(-1)
    assert head.to_target(ids) == m.draft_to_target(ids).tolist()


def test_a_chats_next_turn_keeps_what_the_head_read(pair, tmp_path, monkeypatch):
    """The next request in a slot whose prompt starts with the last one's prompt and answer
    (a chat's next turn): the target reuses its cache, the head the pairs it read; its drafts
    are still the reference's predictions from the whole sequence, and the output the
    target's."""
    hf, _, target, cfg, w = pair
    head = load_head(te.write_gguf(cfg, w, tmp_path / "h.gguf"), target)
    e = _engine(target, head, "draft-eagle3")
    first = _run(e, GREEDY)
    turn = PROMPT + first.output + [12, 40, 41, 42]
    seen: list[tuple[int, int]] = []
    propose = Eagle3Proposer.propose

    def spy(self, k, extend=None):
        d = propose(self, k, extend)
        if d.ids:
            seen.append((len(self.tokens), d.ids[0], self.base))
        return d

    monkeypatch.setattr(Eagle3Proposer, "propose", spy)
    second = _run(e, GREEDY, turn)
    assert second.n_prompt_processed < len(turn) // 2  # the target reused its cache
    assert second.output == _run(_engine(target, None, "none"), GREEDY, turn).output
    assert seen and all(base == 0 for _, _, base in seen)
    _agree([(n, f) for n, f, _ in seen], cfg, w, hf.model.embed_tokens.weight.detach(),
           target, turn + second.output)


def test_rejection_sampling_gets_the_heads_distribution(pair, tmp_path):
    """--spec-draft-rejection: drafts drawn from the head's distribution, returned as q over
    the whole vocabulary (zero outside the head's), as the verifier needs it."""
    _, _, target, cfg, w = pair
    head = load_head(te.write_gguf(cfg, w, tmp_path / "h.gguf"), target)
    cache = head.cache(1, 64)
    s = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=3)
    p = Eagle3Proposer(head, cache, 0, s, torch.Generator().manual_seed(3), 4, 0, 0.0,
                       rejection=True)
    p.begin(PROMPT)
    p.hidden(0, _features(target, PROMPT, cfg["eagle_aux_hidden_state_layer_ids"])[:-1])
    d = p.propose(4)
    assert len(d.ids) == 4 and d.probs.shape == (4, target.args.vocab_size)
    assert torch.allclose(d.probs.sum(-1), torch.ones(4))
    outside = torch.ones(target.args.vocab_size, dtype=torch.bool)
    outside[head.d2t] = False
    assert d.probs[:, outside].abs().max() == 0
    assert all(d.probs[i, t] > 0 for i, t in enumerate(d.ids))


def test_check_counts_the_head_in_the_memory_plan(pair, tmp_path):
    _, target_path, _, cfg, w = pair
    head = te.write_gguf(cfg, w, tmp_path / "h.gguf")
    r = subprocess.run([sys.executable, "-m", "tandem.cli", "check", "-m", str(target_path),
                        "--model-draft", str(head), "--spec-type", "draft-eagle3", "-c", "256"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "EAGLE-3 head" in r.stdout and "matches the target" in r.stdout
    assert f"draft {head.name}" in r.stdout  # its row: weights, its KV cache, working


def test_greedy_output_across_context_shifts(pair, tmp_path):
    """A full context shifted (--context-shift): the head starts again from the next rows the
    target computes, and the greedy text stays the target's."""
    _, _, target, cfg, w = pair
    head = load_head(te.write_gguf(cfg, w, tmp_path / "h.gguf"), target)
    s = SamplingParams(temperature=0.0, ignore_eos=True, n_predict=90)

    def engine(h, types):
        return Engine(target, h, EngineConfig(ctx_size=48, context_shift=True),
                      SpecConfig(types=types, n_max=5, p_min=0.0))

    for prompt in ([5, 6, 7, 8] * 6, list(range(30, 50))):
        for keep in (0, -1):
            req = dict(sampling=s, n_keep=keep, cache_prompt=False)
            want = engine(None, "none").generate(Request(list(prompt), **req))
            got = engine(head, "draft-eagle3").generate(Request(list(prompt), **req))
            assert got.truncated and got.output == want.output
            assert got.stats.n_drafted > 0


def test_slots_sharing_passes_each_get_their_own_rows(pair, tmp_path, monkeypatch):
    """Three sequences in one engine (--parallel 3), started at different steps so prompt
    chunks and verification rows share passes: each head slot reads only its own rows, the
    drafts are still the reference's predictions, the outputs the target's."""
    hf, _, target, cfg, w = pair
    head = load_head(te.write_gguf(cfg, w, tmp_path / "h.gguf"), target)
    e = Engine(target, head, EngineConfig(ctx_size=256, n_parallel=3, prefill_chunk=6),
               SpecConfig(types="draft-eagle3"))
    seen: dict[int, list[tuple[int, int]]] = {}
    propose = Eagle3Proposer.propose

    def spy(self, k, extend=None):
        d = propose(self, k, extend)
        if d.ids:
            seen.setdefault(self.slot, []).append((len(self.tokens), d.ids[0]))
        return d

    monkeypatch.setattr(Eagle3Proposer, "propose", spy)
    prompts = [PROMPT, PROMPT[3:] + [7, 7], [9, 8, 7, 6, 5, 4, 3, 2, 1, 11, 12, 13]]
    seqs = [e.add(Request(list(prompts[0]), GREEDY))]
    e.step()
    seqs.append(e.add(Request(list(prompts[1]), GREEDY)))
    e.step()
    seqs.append(e.add(Request(list(prompts[2]), GREEDY)))
    while not all(s.done for s in seqs):
        e.step()
    emb = hf.model.embed_tokens.weight.detach()
    for s, prompt in zip(seqs, prompts):
        assert s.output == _run(_engine(target, None, "none"), GREEDY, prompt).output
        _agree(seen[s.slot], cfg, w, emb, target, prompt + s.output)


def test_speculators_and_vllm_layouts_load_alike(pair, tmp_path):
    """A speculators checkpoint (the layer's tensors under "layers.0.", its settings nested in
    transformer_layer_config) and a vLLM-style one ("model." prefixes) give the same head as
    SpecForge's layout."""
    _, _, target, cfg, w = pair
    feats = _features(target, PROMPT, cfg["eagle_aux_hidden_state_layer_ids"])[:-1]
    nested = {k: cfg[k] for k in ("hidden_size", "intermediate_size", "num_attention_heads",
                                  "num_key_value_heads", "head_dim", "rms_norm_eps",
                                  "rope_theta", "vocab_size", "num_hidden_layers")}
    spec_cfg = {"architectures": ["Eagle3Speculator"], "transformer_layer_config": nested,
                **{k: cfg[k] for k in ("draft_vocab_size", "target_hidden_size",
                                       "eagle_aux_hidden_state_layer_ids")}}
    layouts = {
        "specforge": (cfg, w),
        "speculators": (spec_cfg, {k.replace("midlayer.", "layers.0."): v for k, v in w.items()}),
        "vllm": ({**cfg, "architectures": ["Eagle3LlamaForCausalLM"]},
                 {("model." + k if k.startswith("midlayer.") or k == "fc.weight" else k): v
                  for k, v in w.items()}),
    }
    out = {}
    for name, (c, weights) in layouts.items():
        head = load_head(te.write_hf(c, weights, tmp_path / name), target)
        out[name] = head.logits(head.forward(PROMPT[1:], head.encode(feats), head.cache(1, 64),
                                             0, 0))
    assert torch.equal(out["speculators"], out["specforge"])
    assert torch.equal(out["vllm"], out["specforge"])
