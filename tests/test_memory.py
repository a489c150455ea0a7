"""The memory plan: arithmetic on made-up shapes, agreement with what the loader really holds."""

from __future__ import annotations

import math

import pytest
import torch

from tandem.config import EngineConfig
from tandem.errors import TandemError
from tandem.memory import (
    RUNTIME_BYTES,
    VOCAB_ENTRY_BYTES,
    ModelSpec,
    available_memory,
    kv_cache_bytes,
    largest_layer_weight,
    plan,
    weight_bytes,
    c_layer_bytes,
    c_layers,
    working_bytes,
)
from tandem.models.args import ModelArgs


def _plan(models, ctx_size=256, n_parallel=1, max_k=0, mode="auto", dtype="auto", *,
          prefill_chunk=512, batch_size=None, available=None, **cache_types):
    """memory.plan for the settings a command line gives (EngineConfig); the largest pass is
    max(prefill_chunk, batch_size), batch_size being the prefill chunk unless given."""
    cfg = EngineConfig(ctx_size=ctx_size, n_parallel=n_parallel, weights=mode, dtype=dtype,
                       prefill_chunk=prefill_chunk,
                       batch_size=prefill_chunk if batch_size is None else batch_size,
                       **cache_types)
    return plan(models, cfg, max_k, available=available)

ARGS = ModelArgs(arch="qwen2", dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=160,
                 vocab_size=100)  # head_dim 16

TENSORS = {
    "token_embd.weight": ("Q4_K", (100, 64)),  # always dense: 100*64*2 = 12800
    "blk.0.attn_q.weight": ("Q4_K", (64, 64)),  # int4: 2048 + 128*4 = 2560
    "blk.0.attn_q.bias": ("F32", (64,)),  # compute dtype: 128
    "blk.0.ffn_up.weight": ("Q4_0", (160, 64)),  # int4: 5120 + 320*4 = 6400
    "blk.0.ffn_down.weight": ("Q6_K", (64, 160)),  # dense: 20480
    "blk.0.attn_k.weight": ("Q4_1", (40, 64)),  # 40 rows: not a multiple of 16 -> dense 5120
    "blk.0.attn_norm.weight": ("F32", (64,)),  # float32: 256
}
INT4_BF16 = 12800 + 2560 + 128 + 6400 + 20480 + 5120 + 256
ELEMENTS_2D = 100 * 64 + 64 * 64 + 160 * 64 + 64 * 160 + 40 * 64


def test_int4_weights_follow_the_representation_rule():
    assert weight_bytes(TENSORS, "int4", 2) == INT4_BF16


def test_dense_weights_at_the_compute_dtype():
    assert weight_bytes(TENSORS, "dense", 2) == ELEMENTS_2D * 2 + 64 * 2 + 64 * 4
    assert weight_bytes(TENSORS, "dense", 4) == ELEMENTS_2D * 4 + 64 * 4 + 64 * 4


def test_untied_output_adds_a_matrix_and_tied_adds_nothing():
    untied = dict(TENSORS, **{"output.weight": ("Q6_K", (100, 64))})
    assert weight_bytes(untied, "int4", 2) == INT4_BF16 + 100 * 64 * 2


def test_plan_rows_follow_mode_and_dtype():
    spec = ModelSpec("target", ARGS, TENSORS, "t.gguf")
    p = _plan([spec], 256, 1, 4, "int4", "auto", available=10**9)
    assert p.rows[0].weights == INT4_BF16
    assert "int4" in p.rows[0].held_as
    # float32 compute means dense, whatever the mode asked
    p32 = _plan([spec], 256, 1, 4, "int4", "float32", available=10**9)
    assert p32.rows[0].weights == weight_bytes(TENSORS, "dense", 4)
    assert p32.rows[0].held_as == "dense float32"
    # a file whose tensors are all F32 loads in float32 under dtype auto
    f32 = {k: ("F32", shape) for k, (_, shape) in TENSORS.items()}
    pf = _plan([ModelSpec("target", ARGS, f32)], 256, 1, 4, "int4", "auto", available=10**9)
    assert pf.rows[0].held_as == "dense float32"
    # the KV cache holds what --cache-type-k / -v say, whatever the compute dtype: f16 by default
    assert pf.rows[0].kv_cache == p.rows[0].kv_cache == kv_cache_bytes(ARGS, 256, 1, 4, 2)
    # a Hugging Face directory is dense even in int4 mode
    hf = _plan([ModelSpec("target", ARGS, TENSORS, source="hf")], 256, available=10**9)
    assert hf.rows[0].weights == weight_bytes(TENSORS, "dense", 2)


def test_native_weights_count_their_file_bytes():
    # blocks read in place: their size in the file; a tied embedding is the output projection
    # (every row read per token); float tensors at float32, the native compute dtype
    in_file = {"Q4_K": 144 / 256, "Q4_0": 18 / 32, "Q4_1": 20 / 32, "Q6_K": 210 / 256}
    native = (100 * 64 * in_file["Q4_K"] + 64 * 64 * in_file["Q4_K"] + 64 * 4
              + 160 * 64 * in_file["Q4_0"] + 64 * 160 * in_file["Q6_K"] + 40 * 64 * in_file["Q4_1"]
              + 64 * 4)
    assert weight_bytes(TENSORS, "native", 4) == native
    # untied: the embedding is read row by row (not counted), output.weight in place
    untied = dict(TENSORS, **{"output.weight": ("Q6_K", (100, 64))})
    assert weight_bytes(untied, "native", 4) == native - 100 * 64 * in_file["Q4_K"] + 100 * 64 * in_file["Q6_K"]
    p = _plan([ModelSpec("target", ARGS, TENSORS, "t.gguf")], 256, 1, 4, "native", available=10**9)
    assert p.rows[0].held_as == "GGUF blocks in place + float32"
    assert p.rows[0].kv_cache == kv_cache_bytes(ARGS, 256, 1, 4, 2)


def test_cache_types_set_the_kv_bytes_of_each_model():
    target = ModelSpec("target", ARGS, TENSORS, "t.gguf")
    draft = ModelSpec("draft", ARGS, TENSORS, "d.gguf")
    f16 = _plan([target, draft], 256, 1, 4, available=10**9)
    assert [r.kv_cache for r in f16.rows] == [kv_cache_bytes(ARGS, 256, 1, 4, 2)] * 2
    # keys f32 and values f16 for the target, the draft's both f32
    mixed = _plan([target, draft], 256, 1, 4, available=10**9, cache_type_k="f32",
                  cache_type_k_draft="f32", cache_type_v_draft="f32")
    half = 256 + 4 + 1
    per_el = ARGS.n_layers * ARGS.n_kv_heads * ARGS.head_dim
    assert mixed.rows[0].kv_cache == half * per_el * (4 + 2)
    assert mixed.rows[1].kv_cache == half * per_el * (4 + 4) == 2 * f16.rows[1].kv_cache
    text = mixed.format()  # the plan printed before loading says which
    assert "target weights held as GGUF blocks in place + float32; KV cache keys f32, values f16" in text
    assert "draft weights held as GGUF blocks in place + float32; KV cache keys f32, values f32" in text
    with pytest.raises(TandemError, match="cache-type-v 'q8_0'"):
        EngineConfig(cache_type_v="q8_0")


def test_kv_cache_arithmetic():
    # 2 slots * (1000 + 8 + 1) positions * (K, V) * 2 layers * 2 kv heads * 16 dims * bf16
    assert kv_cache_bytes(ARGS, 1000, 2, 8, 2) == 2 * 1009 * 2 * 2 * 2 * 16 * 2


def test_kv_cache_matches_the_decoders_cache():
    from tandem.models.decoder import KVCache

    for n_par, ctx, k, dtype, el in ((1, 100, 0, torch.bfloat16, 2), (3, 50, 5, torch.float32, 4)):
        cache = KVCache(ARGS, n_par, ctx + k + 1, dtype)
        assert kv_cache_bytes(ARGS, ctx, n_par, k, el) == cache.nbytes


def test_working_buffer_arithmetic():
    # logits 2 slots * 5 rows * 100; chunk 64 * max(3*160, 4 heads * 1000); rope 1005 * 16
    expected = 4 * (2 * 5 * 100 + 64 * max(480, 4000) + 1005 * 16) + VOCAB_ENTRY_BYTES * 100
    assert working_bytes(ARGS, 1000, 2, 4, 64) == expected
    # a short context: the FFN dominates and the chunk is capped at the context
    assert working_bytes(ARGS, 16, 1, 0, 512) == (4 * (100 + 16 * 480 + 17 * 16)
                                                   + VOCAB_ENTRY_BYTES * 100)
    # compact weights on the PyTorch layers: the largest layer weight (ffn 160 x 64) is
    # expanded for a prefill chunk (int4 mode, or native with a layer weight the kernels
    # cannot read)
    assert largest_layer_weight(TENSORS) == 160 * 64
    odd = dict(TENSORS, **{"blk.0.attn_v.weight": ("MXFP4", (32, 64))})
    p = _plan([ModelSpec("target", ARGS, odd)], 1000, 2, 4, "native", prefill_chunk=64,
             available=10**9)
    assert p.rows[0].working == expected + 4 * 160 * 64
    # a --batch-size above the prompt chunk makes the largest pass, and the plan counts it
    wide = _plan([ModelSpec("target", ARGS, odd)], 1000, 2, 4, "native", prefill_chunk=64,
                 batch_size=128, available=10**9)
    assert wide.rows[0].working > p.rows[0].working
    # every layer weight native: the layers run in C (forward.c) and hold, per chunk row,
    # h (max(dim, q width, ffn) = 160), q, k, v, attention out, residual update, gate, up, the
    # quantized activations (160 * (1/2 + 5/32): a scale and a sum per 16 values and an
    # integer sum per 16, as tq_scratch_alloc allocates) and two copies of the embedding
    assert c_layers(ModelSpec("target", ARGS, TENSORS), "native")
    assert not c_layers(ModelSpec("target", ARGS, odd), "native")
    per_row = 160 + 160 * (0.5 + 5 / 32) + 2 * 64 + 2 * 32 + 3 * 64 + 2 * 160
    scores = 2 * 2 * (1000 + 4 + 10)  # 2 threads x 2 query heads per kv head x cache length
    c_expected = (4 * (2 * 5 * 100 + 1005 * 16) + VOCAB_ENTRY_BYTES * 100
                  + 4 * (math.ceil(64 * per_row) + scores))
    assert c_layer_bytes(ARGS, 1000, 2, 4, 64, threads=2) == c_expected
    p = _plan([ModelSpec("target", ARGS, TENSORS)], 1000, 2, 4, "native", prefill_chunk=64,
             available=10**9)
    assert p.rows[0].working == c_layer_bytes(ARGS, 1000, 2, 4, 64)
    assert p.rows[0].working < expected  # no score matrix, nothing expanded
    dense32 = _plan([ModelSpec("target", ARGS, TENSORS)], 1000, 2, 4, "dense", "float32", prefill_chunk=64,
                   available=10**9)
    assert dense32.rows[0].working == expected


def test_totals_fits_and_table():
    t = ModelSpec("target", ARGS, TENSORS, "big.gguf")
    d = ModelSpec("draft", ARGS, TENSORS, "small.gguf")
    p = _plan([t, d], 1000, 2, 4, available=10**9)
    assert p.total == sum(r.weights + r.kv_cache + r.working for r in p.rows) + RUNTIME_BYTES
    assert p.fits
    text = p.format()
    assert "target big.gguf" in text and "draft small.gguf" in text
    assert "runtime (Python, PyTorch, the server)" in text and "fits: yes" in text
    short = _plan([t, d], 1000, 2, 4, available=p.total - 1)
    assert not short.fits
    assert "fits: NO" in short.format() and "short" in short.format()
    # more slots need more KV cache
    assert _plan([t], 1000, 4, 4, available=1).rows[0].kv_cache == 2 * _plan(
        [t], 1000, 2, 4, available=1).rows[0].kv_cache


@pytest.mark.parametrize("kwargs, word", [
    (dict(mode="int8"), "weights"),
    (dict(dtype="float16"), "dtype"),
    (dict(ctx_size=0), "ctx-size"),
    (dict(n_parallel=0), "parallel"),
    (dict(max_k=-1), "drafted"),
])
def test_bad_settings_are_named(kwargs, word):
    args = dict(ctx_size=256, n_parallel=1, max_k=4, mode="int4", dtype="auto")
    args.update(kwargs)
    with pytest.raises(TandemError, match=word):
        _plan([ModelSpec("target", ARGS, TENSORS)], available=1, **args)


def test_available_memory_reads_meminfo():
    avail, source = available_memory()
    assert source == "MemAvailable"
    with open("/proc/meminfo") as f:
        total = next(int(x.split()[1]) for x in f if x.startswith("MemTotal:")) * 1024
    assert 0 < avail <= total


def _held_bytes(model: torch.nn.Module) -> int:
    """Every tensor a loaded Transformer holds (parameters, buffers, plain tensor attributes),
    each storage once, without the rope tables (counted as working buffers)."""
    seen, total = set(), 0
    for mod in model.modules():
        for name, value in list(vars(mod).items()) + list(mod.named_parameters(recurse=False)) \
                + list(mod.named_buffers(recurse=False)):
            if not isinstance(value, torch.Tensor) or name in ("cos", "sin"):
                continue
            key = value.untyped_storage().data_ptr()
            if key not in seen:
                seen.add(key)
                total += value.untyped_storage().nbytes()
    return total


@pytest.mark.parametrize("arch, tie", [("qwen2", False), ("llama", True)])
def test_plan_matches_what_the_loader_holds(tmp_path, arch, tie):
    """The planned weight bytes are exactly what load_model keeps, in every mode."""
    import gguf

    from tandem.models.gguf_file import GGUFFile
    from tandem.config import Numerics
    from tandem.models.loader import args_from_gguf, load_model

    from .tiny import hf_model, write_gguf

    path = write_gguf(hf_model(arch, tie_word_embeddings=tie), tmp_path / "m.gguf", arch,
                      gguf.GGMLQuantizationType.Q4_0)
    g = GGUFFile(path)
    spec = ModelSpec.from_gguf("target", g, args_from_gguf(g))
    for mode, dtype in (("int4", "bfloat16"), ("dense", "bfloat16"), ("dense", "float32")):
        p = _plan([spec], 64, 1, 0, mode, dtype, available=1)
        loaded = load_model(str(path), Numerics(weights=mode, dtype=dtype), max_len=65)
        assert p.rows[0].weights == _held_bytes(loaded.model), (mode, dtype)


@pytest.mark.real
def test_default_pair_plan_is_plausible(real_gguf):
    from tandem.models.loader import args_from_gguf

    g = real_gguf("default")
    spec = ModelSpec.from_gguf("target", g, args_from_gguf(g))
    file_size = g.path.stat().st_size
    p = _plan([spec], 4096, 1, 8, "int4", "auto", available=1)
    dense = _plan([spec], 4096, 1, 8, "dense", "bfloat16", available=1)
    n_params = sum(math.prod(shape) for _, shape in spec.tensors.values())
    assert dense.rows[0].weights == pytest.approx(2 * n_params, rel=0.01)
    # int4 keeps the Q4_K matrices at 5 bits, but the embedding, the Q6_K output projection
    # and the Q6_K layers become bf16: more than the file, well under dense bf16.
    assert file_size < p.rows[0].weights < 2 * file_size
    assert p.rows[0].weights < 0.7 * dense.rows[0].weights
    # KV cache: 28 layers, 2 kv heads of 128, 4105 positions, bf16
    assert p.rows[0].kv_cache == 4105 * 2 * 28 * 2 * 128 * 2


def test_embeddings_caches_are_counted_for_the_target():
    """--embedding / --reranking: Engine.embed's scratch cache (--batch-size positions) and the
    cache a long input pooled last is read into (a slot's context) join the target's KV."""
    from tandem.models.decoder import KVCache

    target = ModelSpec("target", ARGS, TENSORS, "t.gguf")
    draft = ModelSpec("draft", ARGS, TENSORS, "d.gguf")
    cfg = EngineConfig(ctx_size=256, batch_size=64, prefill_chunk=64)
    off = plan([target, draft], cfg, 4, available=10**9)
    on = plan([target, draft], cfg, 4, available=10**9, embeddings=True)
    extra = sum(KVCache.of_types(ARGS, 1, n + 1, ("f16", "f16")).nbytes for n in (64, 256))
    assert on.rows[0].kv_cache == off.rows[0].kv_cache + extra
    assert on.rows[1].kv_cache == off.rows[1].kv_cache  # the draft embeds nothing
    assert "embeddings' caches" in on.format() and "embeddings" not in off.format()


def test_the_suffix_pool_is_counted_where_speculation_searches_it():
    """The pool of earlier answers (--spec-suffix-pool, on by default under auto) holds an index
    of ~1.1 KB per token: a large budget must show in the plan, and none without speculation."""
    from tandem.check import _pool_tokens
    from tandem.config import SpecConfig
    from tandem.memory import POOL_BYTES_PER_TOKEN

    t = ModelSpec("target", ARGS, TENSORS, "big.gguf")
    cfg = EngineConfig(ctx_size=256)
    bare = plan([t], cfg, 0, available=10**12)
    assert bare.pool == 0 and "suffix pool" not in bare.format()
    auto = SpecConfig(types=["auto"], suffix_pool=1_000_000).resolved(False)
    assert _pool_tokens(auto) == 1_000_000
    assert _pool_tokens(SpecConfig(types=["none"], suffix_pool=1_000_000).resolved(False)) == 0
    big = plan([t], cfg, 0, available=10**12, pool_tokens=_pool_tokens(auto))
    assert big.pool == 1_000_000 * POOL_BYTES_PER_TOKEN
    assert big.total == bare.total + big.pool
    assert "suffix pool of earlier answers, when full" in big.format()


def test_the_plan_counts_an_image_encoder(tmp_path):
    """--mmproj: the projector's weights held in float32 (every tensor of the file) and one
    image's activations are a row of the plan, which the server checks before loading."""
    from tandem.check import memory_plan
    from tandem.config import EngineConfig, SpecConfig
    from tests import tiny, tiny_vision

    m = tiny_vision.hf_model(seed=1)
    mmproj = tiny_vision.write_mmproj(m, tmp_path / "mmproj.gguf")
    text = tiny.write_gguf(tiny.hf_model("gemma3", seed=1), tmp_path / "text.gguf", "gemma3")
    without = memory_plan(EngineConfig(ctx_size=64), SpecConfig(types=["none"]), str(text), None)
    plan = memory_plan(EngineConfig(ctx_size=64), SpecConfig(types=["none"]), str(text), None,
                       mmproj=str(mmproj))
    row = plan.rows[-1]
    params = sum(p.numel() for n, p in m.named_parameters()
                 if "vision_tower" in n or "multi_modal_projector" in n)
    assert (row.role, row.weights, row.kv_cache) == ("mmproj", 4 * params, 0)
    assert row.working > 0 and plan.total == without.total + row.total
    assert "mmproj weights held as dense float32" in plan.format()


def test_the_plan_names_each_matrix_type_and_its_kernel():
    """`tandem check` and the server's log say which kernel reads each matrix type, and a type
    without one is named with what it costs (never silently slow)."""
    odd = dict(TENSORS, **{"blk.0.attn_v.weight": ("MXFP4", (32, 64)),
                           "blk.0.attn_k.weight": ("Q3_K", (32, 256))})
    text = _plan([ModelSpec("target", ARGS, odd)], 1000, 1, 4, "native", prefill_chunk=64,
                 available=10**9).format()
    assert "Q3_K x1 (row kernels, int8 in 16-row groups, prompt kernel)" in text
    assert "MXFP4 x1 (no native kernel: expanded at load" in text
    dense = _plan([ModelSpec("target", ARGS, odd)], 1000, 1, 4, "dense", prefill_chunk=64,
                  available=10**9).format()
    assert "matrices:" not in dense  # dense mode reads no blocks


def test_the_loader_logs_a_type_without_a_native_kernel(tmp_path, monkeypatch, caplog):
    """A file whose matrices no native kernel reads is named in the log with their count and
    cost when it loads (here Q8_0, taken out of the kernels' types for the test)."""
    import logging

    from gguf import GGMLQuantizationType as QT

    from tandem import choices
    from tandem.models.gguf_file import GGUFFile
    from tandem.models.loader import _warn_no_kernel
    from tests import tiny

    path = tiny.write_gguf(tiny.hf_model("qwen2", seed=1), tmp_path / "m.gguf", "qwen2",
                           qtype=QT.Q8_0)
    with caplog.at_level(logging.WARNING, logger="tandem.models"):
        _warn_no_kernel(GGUFFile(path), "float32")
    assert not caplog.records  # every matrix native: nothing said
    monkeypatch.setattr(choices, "KERNEL_TYPES",
                        {k: v for k, v in choices.KERNEL_TYPES.items() if k != "Q8_0"})
    with caplog.at_level(logging.WARNING, logger="tandem.models"):
        _warn_no_kernel(GGUFFile(path), "float32")
    (msg,) = [r.getMessage() for r in caplog.records]
    assert "m.gguf" in msg and "of type Q8_0: no native kernel: expanded at load" in msg


def test_a_drafts_output_counts_the_rows_of_its_shortlist():
    """--spec-draft-vocab N: a draft reads N rows of an output projection it reads in place
    (Q8_0), so only they become resident; a type the kernels repack is held whole."""
    from tandem.kernels import REPACK_FROM

    q8 = dict(TENSORS, **{"output.weight": ("Q8_0", (100, 64))})
    whole = weight_bytes(q8, "native", 4)
    assert weight_bytes(q8, "native", 4, 25, REPACK_FROM) == whole - 75 * 64 * 34 // 32
    assert weight_bytes(q8, "native", 4, 1000, REPACK_FROM) == whole  # more rows than there are
    q6 = dict(TENSORS, **{"output.weight": ("Q6_K", (100, 256))})
    assert weight_bytes(q6, "native", 4, 25, REPACK_FROM) == weight_bytes(q6, "native", 4)
    assert weight_bytes(q6, "native", 4, 25, ()) < weight_bytes(q6, "native", 4)  # not repacked
    t, d = ModelSpec("target", ARGS, q8, "t.gguf"), ModelSpec("draft", ARGS, q8, "d.gguf")
    cfg = EngineConfig(ctx_size=256)
    p = plan([t, d], cfg, 4, available=10**12, draft_vocab=25)
    assert p.rows[0].weights == whole and p.rows[1].weights < whole  # the target reads all rows


def test_only_the_largest_pass_is_counted_once():
    """The target's and the draft's passes never run at once: the larger one's buffers are in
    its row, the other row keeps only what it holds between passes."""
    t = ModelSpec("target", ARGS, TENSORS, "t.gguf")
    small = ModelArgs(arch="qwen2", dim=32, n_layers=1, n_heads=2, n_kv_heads=1, ffn_dim=64,
                      vocab_size=100)
    d = ModelSpec("draft", small, TENSORS, "d.gguf")
    alone = _plan([d], 256, 1, 4, "int4", available=10**12).rows[0]
    pair = _plan([t, d], 256, 1, 4, "int4", available=10**12)
    assert pair.rows[0].working == _plan([t], 256, 1, 4, "int4", available=10**12).rows[0].working
    assert pair.rows[1].working == working_bytes(small, 256, 1, 4, 0, logit_rows=1) \
        < alone.working


def test_the_host_prompt_cache_is_named_with_its_cap_beside_the_total():
    t = ModelSpec("target", ARGS, TENSORS, "t.gguf")
    p = plan([t], EngineConfig(ctx_size=256, cache_ram=100), 0, available=10**12)
    text = p.format()
    assert p.prompt_cache == 100 << 20
    assert "host prompt cache, up to (--cache-ram)" in text and "100.0 MiB" in text
    assert "total with the host prompt cache full" in text
    none = plan([t], EngineConfig(ctx_size=256, cache_ram=0), 0, available=10**12)
    assert none.total == p.total and "host prompt cache, up to" not in none.format()
    assert "no host prompt cache" in none.format()
    tight = plan([t], EngineConfig(ctx_size=256, cache_ram=100), 0, available=p.total + 1)
    assert tight.fits and "--cache-ram 0 at most" in tight.format()
    j = p.as_json()
    assert j["total"] == p.total and j["host_prompt_cache_cap"] == 100 << 20
    assert [m["role"] for m in j["models"]] == ["target"]
