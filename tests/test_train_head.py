"""`tandem train-head` on tiny random models: the EAGLE-3 head's computation (causal, the
training-time-test unroll equal to drafting with a cache), the target's features captured,
training that learns and resumes exactly, and both exports read back."""

from __future__ import annotations

import json

import gguf
import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from tandem.cli import main
from tandem.config import Numerics
from tandem.models.gguf_file import GGUFFile
from tandem.models.loader import load_model
from tandem.train import answers, data, export, loop
from tandem.train.cli import build_head
from tandem.train.head import Eagle3Head, HeadConfig

from . import tiny

LAYERS = [1, 2, 4]  # of a 4-layer target; 4: its final pre-norm output


def small_head(seed: int = 0, **over) -> Eagle3Head:
    torch.manual_seed(seed)
    c = HeadConfig(**{**dict(hidden_size=32, intermediate_size=48, num_attention_heads=4,
                             num_key_value_heads=2, vocab_size=50, draft_vocab_size=20,
                             target_hidden_size=24, eagle_aux_hidden_state_layer_ids=[0, 1, 2]),
                      **over})
    head = Eagle3Head(c)
    head.set_vocabulary(torch.arange(3, 43, 2))
    head.target_embed = torch.randn(50, 32)
    return head


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    d = tmp_path_factory.mktemp("target")
    ref = tiny.hf_model("qwen2", seed=3, num_hidden_layers=4)
    path = tiny.write_gguf(ref, d / "t.gguf", "qwen2")
    return ref, load_model(path, Numerics(dtype="float32"), max_len=2048)


@pytest.fixture(scope="module")
def captured(target, tmp_path_factory):
    _, tgt = target
    return data.capture(tgt, tmp_path_factory.mktemp("cap"), n_tokens=3072, seq_len=48,
                        layers=LAYERS, topk=8, seed=0, chunk=20, progress=False)


def new_head(tgt, cap, vocab: int = 120) -> Eagle3Head:
    train, _ = cap.split()
    head = build_head(tgt, cap, data.choose_vocabulary(cap, train, vocab, tgt.args.vocab_size),
                      96, seed=0)
    head.target_embed = tgt.model.embed
    return head


# ---- the head ---------------------------------------------------------------------------------


def test_encode_forward_shapes_and_causal():
    head = small_head()
    feats = torch.randn(2, 7, 72)
    tokens = torch.randint(0, 50, (2, 7))
    g = head.encode(feats)
    h, logits, (k, v) = head(tokens, g, torch.arange(7))
    assert g.shape == h.shape == (2, 7, 32) and logits.shape == (2, 7, 20)
    assert k.shape == v.shape == (2, 2, 7, 8)
    # a change at position 4 leaves positions 0..3 as they were and moves 4..6
    tokens2, g2 = tokens.clone(), g.clone()
    tokens2[:, 4], g2[:, 4] = (tokens[:, 4] + 1) % 50, g[:, 4] + 1
    h2, _, _ = head(tokens2, g2, torch.arange(7))
    assert torch.equal(h2[:, :4], h[:, :4])
    assert (h2[:, 4:] - h[:, 4:]).abs().amax(-1).min() > 1e-3
    # rows fed one at a time with the cache give what one pass gives
    kv, rows = None, []
    for p in range(7):
        hp, _, kv = head(tokens[:, p: p + 1], g[:, p: p + 1], torch.tensor([p]), past_kv=kv)
        rows.append(hp)
    assert (torch.cat(rows, 1) - h).abs().max() < 1e-5


@pytest.mark.parametrize("over", [{}, {"norm_before_residual": True, "norm_before_fc": True}])
def test_unroll_is_drafting(over):
    """Step 0 of the training-time unroll is the plain forward; step j at row i is what
    drafting computes: the true pairs 0..i in the cache, then j pairs (token, previous h)."""
    head = small_head(**over)
    B, L, steps = 2, 9, 3
    tokens = torch.randint(0, 50, (B, L))
    g = head.encode(torch.randn(B, L, 72))
    outs = head.unroll(tokens, g, steps)
    h0, logits0, _ = head(tokens[:, 1:], g[:, :-1], torch.arange(L - 1))
    assert (outs[0][0] - h0).abs().max() < 1e-5 and (outs[0][1] - logits0).abs().max() < 1e-5
    for i in range(L - 1):
        h, _, kv = head(tokens[:, 1: i + 2], g[:, : i + 1], torch.arange(i + 1))
        prev = h[:, -1:]
        for j in range(1, min(steps, L - 1 - i)):
            prev, logits, kv = head(tokens[:, i + 1 + j: i + 2 + j], prev,
                                    torch.tensor([i + j]), past_kv=kv)
            assert (prev[:, 0] - outs[j][0][:, i]).abs().max() < 1e-4
            assert (logits[:, 0] - outs[j][1][:, i]).abs().max() < 1e-4


def test_vocabulary_maps_both_ways():
    head = small_head()
    ids = torch.arange(20)
    assert torch.equal(head.draft_to_target(ids), torch.arange(3, 43, 2))
    assert int(head.t2d.sum()) == 20 and bool(head.t2d[3]) and not bool(head.t2d[4])
    index = loop.draft_index(head)
    assert int(index[5]) == 1 and int(index[4]) == -1


# ---- capture and training ---------------------------------------------------------------------


def test_capture_holds_the_targets_layer_inputs(target, captured):
    ref, tgt = target
    cap = captured
    assert cap.complete and cap.feats.shape == (cap.meta["n_seqs"], 48, 3 * 64)
    tokens = torch.from_numpy(cap.tokens[0].astype(np.int64))[None]
    with torch.no_grad():
        out = ref(tokens, output_hidden_states=True)
    hs = out.hidden_states  # [i]: the input of layer i (the last one normed: not comparable)
    feats = torch.from_numpy(cap.feats[0].astype(np.float32))
    for c, layer in enumerate(LAYERS[:2]):
        want = hs[layer][0]
        assert (feats[:, c * 64:(c + 1) * 64] - want).abs().max() <= 2e-3 * want.abs().max()
    logp = torch.log_softmax(out.logits[0], -1)
    assert (torch.from_numpy(cap.top_ids[0, :, 0].astype(np.int64)) == logp.argmax(-1)).all()
    assert np.allclose(cap.top_logp[0, :, 0], logp.max(-1).values.numpy(), atol=2e-3)
    # a second capture with other settings is refused by name
    with pytest.raises(data.TandemError, match="topk"):
        data.capture(tgt, cap.dir, n_tokens=3072, seq_len=48, layers=LAYERS, topk=4, seed=0)


def test_vocabulary_is_the_targets_frequent_choices(captured):
    train, _ = captured.split()
    ids = data.choose_vocabulary(captured, train, 40, 303)
    assert len(ids) == 40 and (np.diff(ids) > 0).all()
    counts = np.bincount(captured.top_ids[train, :, 0].reshape(-1), minlength=303)
    assert counts[ids].min() >= np.sort(counts)[-40]
    with pytest.raises(data.TandemError, match="--draft-vocab"):
        data.choose_vocabulary(captured, train, 304, 303)


def test_training_lowers_the_loss(target, captured, tmp_path):
    _, tgt = target
    head = new_head(tgt, captured)
    cfg = loop.TrainConfig(steps=30, ttt=3, lr=3e-3, batch=4, eval_every=30)
    last = loop.train(head, captured, cfg, tmp_path, progress=False, log=lambda s: None)
    curve = [json.loads(ln) for ln in (tmp_path / "curve.jsonl").read_text().splitlines()]
    assert [r["step"] for r in curve] == [0, 30] and curve[-1] == last
    assert last["val_loss"] < 0.9 * curve[0]["val_loss"]
    assert len(last["acc"]) == len(last["cond"]) == 3 and 0 <= last["expected"] <= 3


def test_resume_equals_an_unbroken_run(target, captured, tmp_path):
    _, tgt = target
    cfg = loop.TrainConfig(steps=6, ttt=2, lr=1e-3, batch=2, eval_every=3)
    a = new_head(tgt, captured)
    loop.train(a, captured, cfg, tmp_path / "a", progress=False, log=lambda s: None)

    def stop_at_3(line: str) -> None:
        if line.startswith("step      3"):
            raise KeyboardInterrupt

    b = new_head(tgt, captured)
    with pytest.raises(KeyboardInterrupt):
        loop.train(b, captured, cfg, tmp_path / "b", progress=False, log=stop_at_3)
    b = new_head(tgt, captured)  # a fresh process: everything from the checkpoint
    loop.train(b, captured, cfg, tmp_path / "b", progress=False, log=lambda s: None)
    for k, v in a.state_dict().items():
        assert torch.equal(v, b.state_dict()[k]), k

    def curve(d):
        return [{k: v for k, v in json.loads(ln).items() if k != "seconds"}
                for ln in (d / "curve.jsonl").read_text().splitlines()]

    assert curve(tmp_path / "a") == curve(tmp_path / "b")


def test_answers_are_the_targets_greedy_continuations(target, tmp_path):
    ref, tgt = target
    ps = answers.prompts(3, seed=1)
    assert len(ps) == 3 and len(set(ps)) == 3 and all(p.strip() for p in ps)
    got = answers.self_answers(tgt, tmp_path, 2, seed=1, max_new=6, progress=False)
    prompt = tgt.tokenizer.encode(tgt.tokenizer.apply_chat_template(
        [{"role": "user", "content": ps[0]}]), parse_special=True)
    with torch.no_grad():
        want = ref.generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False,
                            eos_token_id=tgt.tokenizer.eos_id)[0].tolist()
    assert got[0] == want
    # a longer list goes on from the answers already kept
    again = answers.self_answers(tgt, tmp_path, 3, seed=1, max_new=6, progress=False)
    assert again[:2] == got and len((tmp_path / "answers.jsonl").read_text().splitlines()) == 3
    # the corpus takes them in among the files
    stream = data.corpus_tokens(tgt.tokenizer, 4000, 0, again).tolist()
    text = ",".join(map(str, stream))
    assert all(",".join(map(str, doc)) in text for doc in again)


# ---- export -----------------------------------------------------------------------------------


@pytest.mark.parametrize("gtype", ["f32", "q8_0", "q4_0"])
def test_gguf_export_reads_back(target, captured, tmp_path, gtype):
    _, tgt = target
    head = new_head(tgt, captured, vocab=128)
    path = tmp_path / "head.gguf"
    export.export_gguf(head, path, GGUFFile(tgt.path).metadata, gtype)
    r = gguf.GGUFReader(path)
    kv = {f.name: f.contents() for f in r.fields.values()}
    c = head.config
    assert kv["general.architecture"] == "eagle3" and kv["eagle3.block_count"] == 1
    assert kv["eagle3.embedding_length"] == 64 and kv["eagle3.feed_forward_length"] == 96
    assert kv["eagle3.attention.head_count"] == 4 and kv["eagle3.attention.head_count_kv"] == 2
    assert kv["eagle3.rope.dimension_count"] == 16 and kv["eagle3.target_hidden_size"] == 64
    assert kv["eagle3.target_layers"] == LAYERS
    assert r.fields["eagle3.target_layers"].types == [gguf.GGUFValueType.ARRAY,
                                                      gguf.GGUFValueType.INT32]
    assert kv["eagle3.norm_before_residual"] is False and kv["eagle3.norm_before_fc"] is False
    target_kv = gguf.GGUFReader(tgt.path)
    for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.eos_token_id",
                "tokenizer.ggml.token_type"):
        assert kv[key] == target_kv.fields[key].contents()
        assert r.fields[key].types == target_kv.fields[key].types
    t = {x.name: x for x in r.tensors}
    assert "token_embd.weight" not in t and "enc.output_norm.weight" not in t
    assert t["blk.0.attn_q.weight"].shape.tolist() == [128, 64]  # ne: (in, out)
    assert t["fc.weight"].shape.tolist() == [192, 64] and t["output.weight"].shape.tolist() == [64, 128]
    assert t["d2t"].tensor_type == gguf.GGMLQuantizationType.I64
    assert np.array_equal(t["d2t"].data, head.draft_to_target(torch.arange(128)).numpy())
    assert t["blk.0.attn_norm_2.weight"].tensor_type == gguf.GGMLQuantizationType.F32
    want_type = gguf.GGMLQuantizationType[export.GGUF_TYPES[gtype][0]]
    assert t["blk.0.ffn_up.weight"].tensor_type == want_type == t["output.weight"].tensor_type

    def weight(name):
        x = t[name]
        return gguf.quants.dequantize(x.data, x.tensor_type).reshape(x.shape.tolist()[::-1])

    tol = {"f32": 0, "q8_0": 0.02, "q4_0": 0.2}[gtype]
    for proj, heads in (("q", c.num_attention_heads), ("k", c.num_key_value_heads)):
        got = export.unpermute(weight(f"blk.0.attn_{proj}.weight"), heads)
        want = getattr(head.midlayer.self_attn, f"{proj}_proj").weight.detach().numpy()
        assert np.abs(got - want).max() <= tol * np.abs(want).max()
    want = head.midlayer.hidden_norm.weight.detach().numpy()
    assert np.array_equal(weight("blk.0.attn_norm_2.weight"), want)


def test_permutation_is_llama_cpps_pairs():
    """Row 2i of a permuted head is row i of the HF head, row 2i + 1 row i + D/2."""
    w = np.arange(2 * 8 * 3, dtype=np.float32).reshape(16, 3)  # 2 heads of D = 8
    p = export.permute(w, 2)
    assert np.array_equal(p[0], w[0]) and np.array_equal(p[1], w[4])
    assert np.array_equal(p[8 + 2], w[8 + 1]) and np.array_equal(p[8 + 3], w[8 + 5])
    assert np.array_equal(export.unpermute(p, 2), w)


def test_hf_export_round_trip(tmp_path):
    head = small_head(norm_before_fc=True, own_embeddings=True)
    export.export_hf(head, tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["num_hidden_layers"] == 1
    assert cfg["draft_vocab_size"] == 20 and cfg["vocab_size"] == 50 and cfg["head_dim"] == 8
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [0, 1, 2] and cfg["norm_before_fc"]
    state = load_file(str(tmp_path / "model.safetensors"))
    assert {"fc.weight", "input_norm.weight", "embed_tokens.weight", "midlayer.hidden_norm.weight",
            "midlayer.self_attn.q_proj.weight", "norm.weight", "lm_head.weight"} <= set(state)
    assert state["d2t"].dtype == torch.int64 and state["t2d"].dtype == torch.bool
    back = Eagle3Head(HeadConfig.from_hf(cfg, own_embeddings="embed_tokens.weight" in state))
    back.load_state_dict(state)
    feats, tokens = torch.randn(1, 5, 72), torch.randint(0, 50, (1, 5))
    a, b = head(tokens, head.encode(feats), torch.arange(5)), back(tokens, back.encode(feats),
                                                                     torch.arange(5))
    assert torch.equal(a[1], b[1])


# ---- the command ------------------------------------------------------------------------------


def test_command_trains_exports_and_resumes(target, tmp_path, capsys):
    _, tgt = target
    argv = ["train-head", "--target", str(tgt.path), "--out", str(tmp_path), "--corpus-tokens",
            "1024", "--seq-len", "32", "--layers", "1,2,4", "--draft-vocab", "64", "--ffn", "32",
            "--steps", "4", "--ttt", "2", "--threads", "1", "--no-progress", "--gguf-type", "f16"]
    assert main(argv) == 0
    assert {"config.json", "model.safetensors", "head.gguf", "checkpoint.pt",
            "curve.jsonl"} <= {p.name for p in tmp_path.iterdir()}
    curve = (tmp_path / "curve.jsonl").read_text()
    assert main(argv) == 0  # everything done: nothing is read or trained again
    assert (tmp_path / "curve.jsonl").read_text() == curve
    capsys.readouterr()
    assert main([*argv[:-2], "--gguf-type", "f16", "--layers", "1,2,9"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("tandem: error: --layers") and "\n" not in err
