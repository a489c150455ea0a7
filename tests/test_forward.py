"""The C decoder layers (tandem/kernels/forward.c) on tiny quantized GGUF models.

Against the per-layer PyTorch path with the same kernels (decoder.Block, itself checked against
transformers in test_decoder.py), and for the property speculation rests on: a row's hidden
state does not depend on the rows around it, bit for bit.
"""

from __future__ import annotations

import random

import pytest
import torch
from gguf import GGMLQuantizationType as QT

from tandem import kernels
from tandem.config import EngineConfig, Numerics, SamplingParams, SpecConfig
from tandem.engine import Engine, Request
from tandem.errors import TandemError
from tandem.models.decoder import KVCache
from tandem.models.loader import load_model

from . import tiny

pytestmark = pytest.mark.skipif(not kernels.available(),
                                reason=f"native kernels unavailable: {kernels.unavailable_reason()}")

PROMPT = [5, 17, 42, 99, 3, 250, 7, 8, 9, 10, 11, 120, 33, 34, 35, 36, 37]


@pytest.fixture(scope="module", params=["qwen2", "llama", "qwen3", "gemma3", "qwen2-q4k"])
def qmodel_path(request, tmp_path_factory):
    """A tiny model with Q8_0 linear weights (qwen2: q/k/v biases, rope on halves; llama:
    rope on adjacent pairs; gemma3: sandwich norms, GELU, sliding-window layers with their own
    rope, a scaled one), or Q4_K ones 256 wide (qwen2-q4k: its int8 products read the
    kernels' 16-row groups, rowdotx.c)."""
    arch, _, q4k = request.param.partition("-")
    d = tmp_path_factory.mktemp(f"q-{request.param}")
    if q4k:
        return tiny.write_gguf(tiny.hf_model(arch, seed=5, **tiny.Q4K_SHAPE), d / "m.gguf", arch,
                               qtype=QT.Q4_K)
    return tiny.write_gguf(tiny.hf_model(arch, seed=5), d / "m.gguf", arch, qtype=QT.Q8_0)


def _load(path, bits: str = "int16"):
    return load_model(path, Numerics(weights="native", activations=bits), max_len=128)


KV = [torch.float32, torch.float16]  # --cache-type-k/-v f32 and f16 (the default)


def _tolerance(kv: torch.dtype, bits: str = "int16", q4k: bool = False) -> float:
    """How far the C layers' logits may be from the PyTorch layers', relative to the largest:
    the two orders of float operations part by a few float32 ulps; in a half cache such a
    difference can round a key or value to the neighbouring half (2^-11 relative), which
    later layers carry on. With int8 activations the two usually give the same bits, but such
    a difference can move one activation across a rounding step (1/127 of its block's
    largest value), which moves a tiny model's logits by up to ~1% (measured over seeds:
    qwen2 0.5% with the f32 cache, qwen3 1.2% with the f16 cache; int16 stays below 3e-4).
    q4k: the 256-wide Q4_K model, whose int16 steps part further (6.7e-4 measured with the
    f32 cache): 4-bit weights of a random model make larger activations from a one-ulp change.
    The half cache's 2e-3: 1.06e-3 measured on a Sapphire Rapids Xeon (avx512_fp16), whose
    PyTorch kernels sum in another order than a Zen 4's; a wrong value is orders larger."""
    if bits != "int16":
        return 2e-2
    if q4k:
        return 2e-3
    return 2e-4 if kv == torch.float32 else 2e-3


def _same_argmax_where_clear(got: torch.Tensor, want: torch.Tensor, tol: float) -> None:
    """got's argmax is want's at every position whose top two logits are further apart than
    both paths' allowed difference (a near-tie may fall either way)."""
    top2 = want.topk(2, dim=-1).values
    clear = (top2[..., 0] - top2[..., 1]) > 2 * tol * want.abs().max()
    assert clear.float().mean() > 0.5  # the check still covers most positions
    assert torch.equal(got.argmax(-1)[clear], want.argmax(-1)[clear])


def _logits(m, ids: list[int], chunk: int, native: bool, max_len: int = 128,
            kv: torch.dtype = torch.float32) -> torch.Tensor:
    """Logits of every position, the prompt fed `chunk` tokens at a time; kv: the cache's."""
    m.model._native = False if native else None  # None: keep the PyTorch layers
    cache = KVCache(m.args, 1, max_len, kv)
    out = []
    for s in range(0, len(ids), chunk):
        part = ids[s:s + chunk]
        out.append(m.model(torch.tensor([part]), cache, [0], [s])[0])
        cache.append(0, part)
    m.model._native = False
    return torch.cat(out)


@pytest.mark.parametrize("kv", KV)
@pytest.mark.parametrize("bits", ["int16", "int8", "mixed", "int8-down64"])
def test_c_layers_match_the_pytorch_layers(qmodel_path, bits, kv):
    m = _load(qmodel_path, bits)
    cache = KVCache(m.args, 1, 128, kv)
    assert m.model.native_layers(cache) is not None  # the C path is what decoding uses
    want = _logits(m, PROMPT, len(PROMPT), native=False, kv=kv)
    got = _logits(m, PROMPT, len(PROMPT), native=True, kv=kv)
    scale = want.abs().max().item()
    # same kernels and cache; only the float order of norms, rope, softmax and exp differs
    tol = _tolerance(kv, bits, q4k="q4k" in str(qmodel_path.parent.name)) * scale
    assert (got - want).abs().max().item() <= tol
    # the same greedy token wherever the top two are further apart than the two paths can be
    top2 = want.topk(2, -1).values
    clear = top2[:, 0] - top2[:, 1] > 2 * tol
    assert clear.sum() >= len(PROMPT) // 2
    assert torch.equal(got.argmax(-1)[clear], want.argmax(-1)[clear])


def test_mixed_rounds_the_down_projection_in_int16_only(qmodel_path):
    """--activations mixed: the C layers give each product its own rounding: the down
    projection's int16, every other int8. Its logits are neither int8's nor int16's, and equal
    a model whose down projections alone were switched to int16 on the PyTorch layers."""
    m8, m16, mix = _load(qmodel_path, "int8"), _load(qmodel_path, "int16"), _load(qmodel_path, "mixed")
    assert {blk.w_down.bits for blk in mix.model.layers} == {16}
    assert {blk.wq.bits for blk in mix.model.layers} == {8} and mix.model.output.bits == 8
    got = _logits(mix, PROMPT, len(PROMPT), native=True)
    assert not torch.equal(got, _logits(m8, PROMPT, len(PROMPT), native=True))
    assert not torch.equal(got, _logits(m16, PROMPT, len(PROMPT), native=True))
    for blk in m8.model.layers:
        blk.w_down.bits = 16
    # the same products in C and in PyTorch's layers: within the float order of the rest
    # (which can move an int8 activation across a rounding step: _tolerance)
    want = _logits(m8, PROMPT, len(PROMPT), native=False)
    tol = _tolerance(torch.float32, "mixed", q4k="q4k" in str(qmodel_path.parent.name))
    assert (got - want).abs().max().item() <= tol * want.abs().max().item()
    assert torch.equal(got, _logits(m8, PROMPT, len(PROMPT), native=True))


def test_down64_rounds_the_down_projection_finer_than_its_blocks(qmodel_path):
    """--activations int8-down64: int8 everywhere, the down projection's input rounded finer
    than its weights' own block: a scale per 64 values where they are Q4_K / Q6_K (16-row
    groups); the C layers pass that to the kernel (logits neither int8's nor mixed's, equal to
    the PyTorch layers' products). A Q8_0 down projection has no grouped kernel: int16, the
    same bits as mixed."""
    m8, mix = _load(qmodel_path, "int8"), _load(qmodel_path, "mixed")
    fine = _load(qmodel_path, "int8-down64")
    q4k = "q4k" in str(qmodel_path.parent.name)
    want_down = (8, 64) if q4k else (16, 0)
    assert {blk.w_down.rounding() for blk in fine.model.layers} == {want_down}
    assert {blk.wq.rounding() for blk in fine.model.layers} == {(8, 0)}
    tm = fine.model
    layers = kernels.NativeLayers(fine.args, list(tm.layers), tm.cos, tm.sin, kernels.PROMPT_ROWS)
    assert (layers._layers[0].down.bits, layers._layers[0].down.ablock) == want_down
    got = _logits(fine, PROMPT, len(PROMPT), native=True)
    if not q4k:
        assert torch.equal(got, _logits(mix, PROMPT, len(PROMPT), native=True))
        return
    assert layers._layers[0].down.type in (112, 114)
    assert not torch.equal(got, _logits(m8, PROMPT, len(PROMPT), native=True))
    assert not torch.equal(got, _logits(mix, PROMPT, len(PROMPT), native=True))
    want = _logits(fine, PROMPT, len(PROMPT), native=False)
    assert (got - want).abs().max().item() <= 2e-2 * want.abs().max().item()


@pytest.mark.parametrize("qtype", [QT.Q4_0, QT.Q5_0])
def test_down64_rounds_q4_0_down_projections_per_16_values(tmp_path, qtype):
    """Q4_0 / Q5_0 weights (blocks of 32, in 16-row groups): under int8-down64 the down
    projection's input takes a scale per 16 values (llama.cpp's Q8_0 has one per 32), the
    other products int8 per 32. The C layers run the per-16 kernel: logits neither int8's nor
    mixed's, equal to the PyTorch layers' products (the same kernel per product), and the same
    bits prompt-chunked or whole."""
    path = tiny.write_gguf(tiny.hf_model("qwen2", seed=5), tmp_path / "m.gguf", "qwen2",
                           qtype=qtype)
    fine, m8, mix = (_load(path, a) for a in ("int8-down64", "int8", "mixed"))
    assert {blk.w_down.rounding() for blk in fine.model.layers} == {(8, 16)}
    assert {blk.w_up.rounding() for blk in fine.model.layers} == {(8, 0)}
    tm = fine.model
    layers = kernels.NativeLayers(fine.args, list(tm.layers), tm.cos, tm.sin, kernels.PROMPT_ROWS)
    down = layers._layers[0].down
    assert (down.type, down.bits, down.ablock) == ({QT.Q4_0: 102, QT.Q5_0: 106}[qtype], 8, 16)
    got = _logits(fine, PROMPT, len(PROMPT), native=True)
    assert not torch.equal(got, _logits(m8, PROMPT, len(PROMPT), native=True))
    assert not torch.equal(got, _logits(mix, PROMPT, len(PROMPT), native=True))
    want = _logits(fine, PROMPT, len(PROMPT), native=False)
    assert (got - want).abs().max().item() <= 2e-2 * want.abs().max().item()
    assert torch.equal(_logits(fine, PROMPT, 3, native=True), got)


@pytest.mark.parametrize("kv", KV)
@pytest.mark.parametrize("bits", ["int16", "mixed", "int8-down64"])
def test_rows_do_not_depend_on_the_batch_bit_for_bit(qmodel_path, bits, kv):
    """One prompt pass, chunks of 5, and one token at a time give the same bits; so do several
    slots in one pass (verification of drafts for two sequences) against each alone."""
    m = _load(qmodel_path, bits)
    whole = _logits(m, PROMPT, len(PROMPT), native=True, kv=kv)
    assert torch.equal(_logits(m, PROMPT, 5, native=True, kv=kv), whole)
    assert torch.equal(_logits(m, PROMPT, 1, native=True, kv=kv), whole)

    prompts = [PROMPT[:9], PROMPT[3:6], PROMPT]
    cache = KVCache(m.args, 3, 128, kv)
    for s, p in enumerate(prompts):
        m.model(torch.tensor([p[:-1]]), cache, [s], [0], logits="none")
        cache.append(s, p[:-1])
    rows = torch.tensor([[p[-1], 60, 61] for p in prompts])
    starts = [cache.length(s) for s in range(3)]
    batched = m.model(rows, cache, [0, 1, 2], starts)
    for s, p in enumerate(prompts):
        alone = _logits(m, p + [60, 61], 1, native=True, kv=kv)
        assert torch.equal(batched[s], alone[-3:]), s


def test_a_half_cache_holds_the_keys_rounded_to_halves(qmodel_path):
    """--cache-type-k/-v f16: what the C layers store is each float32 key and value rounded to
    the nearest half, as PyTorch rounds (layer 0's are computed from the embeddings alone, so
    they compare exactly); later layers read the rounded rows, so the logits move, a little."""
    m = _load(qmodel_path)
    caches = {kv: KVCache(m.args, 1, 128, kv) for kv in KV}
    m.model._native = False
    out = {kv: m.model(torch.tensor([PROMPT]), c, [0], [0])[0] for kv, c in caches.items()}
    half, full = caches[torch.float16], caches[torch.float32]
    assert half.k.dtype == half.v.dtype == torch.float16
    n = len(PROMPT)
    assert torch.equal(half.k[0, 0, :, :n], full.k[0, 0, :, :n].half())
    assert torch.equal(half.v[0, 0, :, :n], full.v[0, 0, :, :n].half())
    assert not torch.equal(half.k[0, 0, :, :n].float(), full.k[0, 0, :, :n])  # it did round
    a, b = out[torch.float16], out[torch.float32]
    assert 0 < (a - b).abs().max().item() <= 5e-3 * b.abs().max().item()
    assert torch.equal(a.argmax(-1), b.argmax(-1))
    # keys in halves and values in float32, and the other way round: each as its own path
    mixed = KVCache(m.args, 1, 128, torch.float16, v_dtype=torch.float32)
    got = m.model(torch.tensor([PROMPT]), mixed, [0], [0])[0]
    m.model._native = None
    ref = KVCache(m.args, 1, 128, torch.float16, v_dtype=torch.float32)
    want = m.model(torch.tensor([PROMPT]), ref, [0], [0])[0]
    m.model._native = False
    assert (got - want).abs().max().item() <= _tolerance(torch.float16) * want.abs().max().item()
    assert not torch.equal(got, a) and not torch.equal(got, b)


@pytest.mark.parametrize("kv", KV)
@pytest.mark.parametrize("bits", ["int16", "mixed"])
def test_three_query_heads_per_key_head_over_several_key_blocks(tmp_path, bits, kv):
    """Attention takes the query heads of a key/value head two at a time (here a pair and one
    alone) over blocks of 64 keys, prefetching the next block: 150 positions against the
    PyTorch layers, in any chunking bit for bit, and three slots decoding in one pass (rope and
    cache writes in the attention step) as each alone."""
    path = tiny.write_gguf(tiny.hf_model("qwen2", seed=11, hidden_size=192, num_attention_heads=6,
                                         num_key_value_heads=2),
                           tmp_path / "g3.gguf", "qwen2", qtype=QT.Q8_0)
    m = load_model(path, Numerics(weights="native", activations=bits), max_len=256)
    assert m.args.n_heads // m.args.n_kv_heads == 3 and m.args.head_dim == 32
    rng = random.Random(3)
    ids = [rng.randrange(5, 250) for _ in range(150)]
    whole = _logits(m, ids, len(ids), native=True, max_len=256, kv=kv)
    if bits == "int16":  # (int8 roundings of the two paths' activations part at a few places)
        want = _logits(m, ids, len(ids), native=False, max_len=256, kv=kv)
        assert (whole - want).abs().max().item() <= _tolerance(kv) * want.abs().max().item()
        _same_argmax_where_clear(whole, want, _tolerance(kv))
    assert torch.equal(_logits(m, ids, 7, native=True, max_len=256, kv=kv), whole)
    assert torch.equal(_logits(m, ids, 1, native=True, max_len=256, kv=kv), whole)

    prompts = [ids[:100], ids[20:90], ids[:149]]
    cache = KVCache(m.args, 3, 256, kv)
    for s, p in enumerate(prompts):
        m.model(torch.tensor([p]), cache, [s], [0], logits="none")
        cache.append(s, p)
    batched = m.model(torch.tensor([[60], [61], [62]]), cache, [0, 1, 2],
                      [cache.length(s) for s in range(3)])
    for s, p in enumerate(prompts):
        alone = _logits(m, p + [60 + s], len(p) + 1, native=True, max_len=256, kv=kv)
        assert torch.equal(batched[s, -1], alone[-1]), s


def test_positions_outside_the_cache_are_refused(qmodel_path):
    m = _load(qmodel_path)
    cache = KVCache(m.args, 1, 16, torch.float32)
    with pytest.raises(TandemError, match="tq_forward failed"):
        m.model(torch.tensor([[1, 2, 3]]), cache, [0], [14])


IQ_TYPES = [QT.IQ2_XXS, QT.IQ2_XS, QT.IQ2_S, QT.IQ3_XXS, QT.IQ3_S, QT.IQ1_S, QT.IQ1_M, QT.TQ1_0,
            QT.TQ2_0]  # rowdoti.c's


@pytest.mark.parametrize("qtype", [QT.Q8_0, QT.Q4_K, QT.Q2_K, QT.Q3_K, QT.IQ4_XS, QT.IQ4_NL,
                                   QT.F16, QT.BF16, *IQ_TYPES])
def test_greedy_speculation_equals_target_alone_on_the_c_path(tmp_path, qtype):
    """Q4_K: the target's int8 products on the 16-row groups (rowdotx.c), verification rows
    against one-token decoding; Q2_K, Q3_K, IQ4_XS, IQ4_NL, F16, BF16: rowdotn.c's kernels;
    the i-quants and ternary types: rowdoti.c's (random blocks for the types the gguf package
    cannot quantize)."""
    shape = tiny.Q4K_SHAPE if qtype in (QT.Q4_K, QT.Q2_K, QT.Q3_K, QT.IQ4_XS, *IQ_TYPES) else {}
    target = _load(tiny.write_gguf(tiny.hf_model("qwen2", seed=3, **shape), tmp_path / "t.gguf",
                                   "qwen2", qtype=qtype), "int8")
    draft = _load(tiny.write_gguf(tiny.hf_model("qwen2", seed=9), tmp_path / "d.gguf", "qwen2",
                                  qtype=QT.Q8_0), "int8")
    cfg = EngineConfig(ctx_size=128)
    base = Engine(target, None, cfg, SpecConfig(types=["none"]))
    spec = Engine(target, draft, cfg, SpecConfig(types=["ngram-simple", "draft-simple"],
                                                 n_max=4, p_min=0.0, ngram_min=1, ngram_max=3))
    rng = random.Random(0)
    drafted = 0
    for _ in range(6):
        ids = [rng.randrange(target.args.vocab_size - 3) for _ in range(rng.randint(2, 8))] * 2
        sp = SamplingParams(n_predict=20, temperature=0.0)
        want = base.generate(Request(list(ids), sp, cache_prompt=False)).output
        seq = spec.generate(Request(list(ids), sp, cache_prompt=False))
        assert seq.output == want, ids
        drafted += seq.stats.n_drafted
    assert drafted > 0
    # and it ran on the C layers, over the file's own type
    assert target.model._native not in (None, False)
    assert {lin.type_name for lin in target.model.modules() if hasattr(lin, "type_name")} >= {
        qtype.name}


def test_int8_q4k_products_take_the_16_row_groups(tmp_path):
    """The C layers read a Q4_K product with int8 activations from its 16-row groups (made
    once, the same size, and shared with the PyTorch layers), and one with int16 activations
    (mixed: the down projection) from the GGUF blocks; built with repacked=False every product
    reads the GGUF blocks, which gives the same values to float32 summation."""
    m = _load(tiny.write_gguf(tiny.hf_model("qwen2", seed=4, **tiny.Q4K_SHAPE),
                              tmp_path / "m.gguf", "qwen2", qtype=QT.Q4_K), "mixed")
    tm = m.model
    packed = kernels.NativeLayers(m.args, list(tm.layers), tm.cos, tm.sin, kernels.PROMPT_ROWS)
    plain = kernels.NativeLayers(m.args, list(tm.layers), tm.cos, tm.sin, kernels.PROMPT_ROWS,
                                 repacked=False)
    lay = packed._layers[0]
    assert (lay.wq.type, lay.gate.type, lay.down.type) == (112, 112, 12)
    assert lay.wq.W == tm.layers[0].wq.kernel_blocks()[1].ctypes.data  # one copy
    assert plain._layers[0].wq.type == 12
    x = tm.tok_embeddings[torch.tensor(PROMPT)].float()
    outs = []
    for layers in (packed, plain):
        cache = KVCache(m.args, 1, 128, torch.float32)
        outs.append(layers.forward(x, cache.k, cache.v, [0] * len(PROMPT),
                                   list(range(len(PROMPT))), threads=2))
    assert not torch.equal(outs[0], outs[1])  # another order of the float steps
    assert (outs[0] - outs[1]).abs().max() <= 2e-2 * outs[1].abs().max()


def test_draft_shortlist_reads_rows_of_the_blocks(qmodel_path):
    """The draft's vocabulary shortlist (--spec-draft-vocab) on GGUF blocks: a prefix of the
    output matrix's rows in place and a copy of the few extra rows give exactly the full
    projection's values at those ids."""
    from tandem.speculative.draft import Shortlist

    m = _load(qmodel_path, "int8")
    short = Shortlist(m.model.output, 64, m.args.vocab_size)
    short.add([200, 7, 150, 200])
    assert short.ids.tolist() == list(range(64)) + [200, 150]
    h = torch.randn(m.args.dim)
    full = m.model.output(h[None])[0]
    assert torch.equal(short.logits(h), full[short.ids])


def test_every_build_runs_the_layers_to_the_same_bits(qmodel_path, kernel_build):
    """Whole decoder layers (forward.c: norms, rope, attention, SiLU and the products) give
    the AVX2 build's hidden states and cache bit for bit in the AVX-512 builds: a 17-row
    prompt pass and a one-row decode after it, int16, int8 and mixed activations, with a
    float32 and a half cache."""
    for bits, kv in (("int16", torch.float32), ("int8", torch.float16), ("mixed", torch.float32),
                     ("mixed", torch.float16), ("int8-down64", torch.float16)):
        m = _load(qmodel_path, bits)
        tm = m.model
        out = {}
        for b in ("avx2", kernel_build):
            layers = kernels.NativeLayers(m.args, list(tm.layers), tm.cos, tm.sin,
                                          kernels.PROMPT_ROWS, build=b)
            cache = KVCache(m.args, 1, 128, kv)
            x = tm.tok_embeddings[torch.tensor(PROMPT)].float()
            prompt = layers.forward(x, cache.k, cache.v, [0] * len(PROMPT),
                                    list(range(len(PROMPT))), threads=2)
            one = layers.forward(x[:1], cache.k, cache.v, [0], [len(PROMPT)], threads=2)
            out[b] = (prompt, one, cache.k.clone(), cache.v.clone())
        for want, got in zip(out["avx2"], out[kernel_build]):
            assert torch.equal(got, want), bits


def test_a_long_input_pooled_last_is_read_in_chunks_to_the_same_bits(tmp_path):
    """Embeddings pooled "last" (and so reranking) read an input longer than --batch-size in
    chunks, up to a slot's context, as llama-server does for causal models; the layers do not
    depend on how rows are split into passes, so the last row has one pass's bits."""
    m = _load(tiny.write_gguf(tiny.hf_model("qwen3", seed=6), tmp_path / "e.gguf", "qwen3",
                              qtype=QT.Q8_0), "mixed")
    rng = random.Random(5)
    ids = [rng.randrange(5, 250) for _ in range(100)]
    whole = Engine(m, None, EngineConfig(ctx_size=128, batch_size=128), SpecConfig(types=["none"]))
    want = whole.embed(ids, "last")
    for chunk in (16, 33):
        small = Engine(m, None, EngineConfig(ctx_size=128, batch_size=chunk),
                       SpecConfig(types=["none"]))
        assert torch.equal(small.embed(ids, "last"), want)
        for pooling in ("mean", "none", "cls"):  # these need every row of one pass
            with pytest.raises(TandemError, match=f"1..{chunk} fit .--batch-size"):
                small.embed(ids, pooling)
    with pytest.raises(TandemError, match="1..128 fit .a slot's context"):
        small.embed(ids * 2, "last")


def test_engines_make_the_kernel_layouts_at_load(tmp_path):
    """load_engine (tandem serve, generate, bench) makes every int8 Q4_K product's 16-row groups
    before the first request, so its prompt time does not pay them (~1 s for the default
    target); the first pass then reads the copies already made."""
    from tandem.flags import load_engine
    from tandem.models.quant import GGUFLinear

    path = tiny.write_gguf(tiny.hf_model("qwen2", seed=4, **tiny.Q4K_SHAPE), tmp_path / "m.gguf",
                           "qwen2", qtype=QT.Q4_K)
    said = []
    engine = load_engine(str(path), None, EngineConfig(ctx_size=128), SpecConfig(types=["none"]),
                         log=said.append)
    lins = [m for m in engine.target.model.modules() if isinstance(m, GGUFLinear)]
    assert lins and all(8 in lin._kernel_blocks for lin in lins if lin.bits == 8)
    made = {id(lin): lin.kernel_blocks()[1] for lin in lins}
    assert any(lin.kernel_blocks()[0] == "Q4_Kx16" for lin in lins)
    assert "kernel layouts" in said[0]
    engine.generate(Request(PROMPT[:5], SamplingParams(n_predict=2, temperature=0.0)))
    assert all(lin.kernel_blocks()[1] is made[id(lin)] for lin in lins)
