"""The native kernels (tandem/kernels/) against the gguf package and float64 math.

matmul's error model: weights exact; each activation x is rounded to the int16 grid of its
block (s = max|x| / 16383 over 256 values for the K-quants, 32 for the others), so
|x - x~| <= s / 2; the integer sums are exact and the float32 steps after them add a relative
error far below that. Hence |y - x.w| <= sum_k |w_k| s_k / 2 (1 + 1e-3) + 1e-5 sum_k |w_k x_k|.
"""

from __future__ import annotations

import ctypes
import subprocess
import sys

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as QT
from gguf import quants as gguf_quants

from tandem import kernels
from tandem.config import Numerics
from tandem.errors import TandemError
from tandem.models.loader import resolve_mode
from tandem.models.gguf_file import RawTensor
from tandem.models.quant import GGUFEmbedding, GGUFLinear, make_linear

pytestmark = pytest.mark.skipif(not kernels.available(),
                                reason=f"native kernels unavailable: {kernels.unavailable_reason()}")

SIMPLE = [QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.Q8_0]  # gguf.quants can quantize these
K_QUANTS = [QT.Q4_K, QT.Q5_K, QT.Q6_K]
# block bytes and where the f16 scales sit, for random K-quant blocks
K_LAYOUT = {QT.Q4_K: (144, (0, 2)), QT.Q5_K: (176, (0, 2)), QT.Q6_K: (210, (208,))}


def _tensor(qtype: QT, rows: int, cols: int, seed: int = 0) -> RawTensor:
    rng = np.random.default_rng(seed)
    if qtype in SIMPLE:
        values = rng.standard_normal((rows, cols)).astype(np.float32)
        data = gguf_quants.quantize(values, qtype)
    else:  # random bytes (every nibble, bit and scale pattern) with sane f16 scales
        nbytes, f16_at = K_LAYOUT[qtype]
        blocks = rng.integers(0, 256, size=(rows * cols // 256, nbytes), dtype=np.uint8)
        for at in f16_at:
            blocks[:, at: at + 2] = rng.uniform(1e-4, 3e-3, (len(blocks), 1)).astype(
                np.float16).view(np.uint8)
        data = blocks.reshape(rows, -1)
    return RawTensor("blk.0.ffn_up.weight", qtype, (rows, cols), data)


def _bound(x: torch.Tensor, w: torch.Tensor, block: int, bits: int = 16) -> torch.Tensor:
    """The error bound above, (M, N), for x (M, K) and w (N, K) in float64."""
    m, k = x.shape
    amax = x.abs().view(m, k // block, block).amax(-1)  # (M, K/block)
    levels = 16383 if bits == 16 else 127
    half_step = (amax / levels / 2).repeat_interleave(block, dim=1)  # (M, K)
    return half_step @ w.abs().T * (1 + 1e-3) + 1e-5 * (x.abs() @ w.abs().T)


@pytest.mark.parametrize("qtype", SIMPLE + K_QUANTS)
@pytest.mark.parametrize("threads", [1, 2])
def test_dequantize_equals_gguf_bit_for_bit(qtype, threads):
    raw = _tensor(qtype, 24, 512)
    ours = kernels.dequantize(qtype.name, raw.data, 24, 512, threads=threads)
    ref = gguf_quants.dequantize(raw.data, qtype).reshape(24, 512)
    assert np.array_equal(ours.numpy(), ref)


@pytest.mark.parametrize("qtype", SIMPLE + K_QUANTS)
@pytest.mark.parametrize("m", [1, 3, 8, 11])
@pytest.mark.parametrize("bits", [16, 8])
def test_matmul_within_the_activation_rounding_bound(qtype, m, bits):
    n, k = 40, 768
    raw = _tensor(qtype, n, k, seed=m)
    w = torch.from_numpy(gguf_quants.dequantize(raw.data, qtype).reshape(n, k)).double()
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
    x[:, 5] *= 50  # an outlier, as in real hidden states
    y = kernels.matmul(qtype.name, raw.data, n, k, x, bits=bits).double()
    exact = x.double() @ w.T
    block = 256 if qtype in K_QUANTS else 32
    err = (y - exact).abs()
    assert (err <= _bound(x.double(), w, block, bits)).all(), err.max()
    # and the bound is meaningful: int16 within 1e-3 of the outputs' scale; int8 (llama.cpp's
    # scheme) loses up to ~6% here, where the outlier coarsens its 256-value block's grid
    assert err.max() < (1e-3 if bits == 16 else 1e-1) * exact.abs().max()


@pytest.mark.parametrize("qtype", [QT.Q4_K, QT.Q6_K, QT.Q5_0, QT.Q8_0])
@pytest.mark.parametrize("bits", [16, 8])
def test_rows_are_batch_invariant_bit_for_bit(qtype, bits):
    """Row i of an M-row product equals the 1-row product of row i, for any M and thread count:
    verification rows equal one-token decoding exactly."""
    n, k = 64, 512
    raw = _tensor(qtype, n, k)
    x = torch.randn(13, k, generator=torch.Generator().manual_seed(3))
    full = kernels.matmul(qtype.name, raw.data, n, k, x, bits=bits, threads=2)
    for t in (1, 2):
        assert torch.equal(kernels.matmul(qtype.name, raw.data, n, k, x, bits=bits, threads=t),
                           full)
        for i in range(13):
            one = kernels.matmul(qtype.name, raw.data, n, k, x[i: i + 1], bits=bits, threads=t)
            assert torch.equal(one[0], full[i]), (t, i)
        assert torch.equal(kernels.matmul(qtype.name, raw.data, n, k, x[2:7], bits=bits,
                                          threads=t), full[2:7])


@pytest.mark.parametrize("qtype", K_QUANTS)
@pytest.mark.parametrize("bits", [16, 8])
def test_prompt_path_rows_equal_one_row_products_bit_for_bit(qtype, bits):
    """From 16 rows the K-quants take the prompt path (weights unpacked once per block of rows,
    a 4 x 2 micro-kernel, 4 x 4 on AVX-512; int8 activations widened to int16 in the order of
    the int8 kernels' lanes). Its rows must be the 1-row products exactly, or a
    prompt would fill the cache with other values than decoding the same tokens. 37 rows (a
    partial last group of activation rows), 74 weight rows (chunks of 32 handed to whichever
    thread comes free: the last one 10 rows, a partial group of 4), K = 2304 (two unpacked
    chunks), a bias, one to three threads; and still within the rounding bound of the exact
    product. prompt_rows moves the threshold: the prompt kernel for every product (1) or none
    (1 << 62)."""
    n, k, m = 74, 2304, 37
    raw = _tensor(qtype, n, k, seed=5)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(1))
    x[:, 7] *= 40
    bias = torch.randn(n, generator=torch.Generator().manual_seed(2))
    assert m >= kernels.PROMPT_ROWS
    for t in (1, 2, 3):
        full = kernels.matmul(qtype.name, raw.data, n, k, x, bias=bias, threads=t, bits=bits)
        for i in range(m):
            one = kernels.matmul(qtype.name, raw.data, n, k, x[i: i + 1], bias=bias, threads=t,
                                 bits=bits)
            assert torch.equal(one[0], full[i]), (t, i)
        rowwise = kernels.matmul(qtype.name, raw.data, n, k, x, bias=bias, threads=t,
                                 bits=bits, prompt_rows=1 << 62)  # row by row, all 37 rows
        assert torch.equal(rowwise, full)
        for rows in (slice(0, 1), slice(3, 6)):  # a few rows through the prompt kernel
            few = kernels.matmul(qtype.name, raw.data, n, k, x[rows], bias=bias, threads=t,
                                 bits=bits, prompt_rows=1)
            assert torch.equal(few, full[rows]), (t, rows)
    w = torch.from_numpy(gguf_quants.dequantize(raw.data, qtype).reshape(n, k)).double()
    exact = x.double() @ w.T + bias.double()
    assert ((full.double() - exact).abs() <= _bound(x.double(), w, 256, bits)).all()


@pytest.mark.parametrize("qtype", SIMPLE + K_QUANTS)
def test_every_build_gives_the_avx2_bits(kernel_build, qtype):
    """The AVX-512 kernels (512-bit integer sums folded to the AVX2 lanes before any float
    step) give the AVX2 kernels' results bit for bit: every type, both roundings, the
    row-by-row kernels (1, 2, 9, 10, 11 rows) and the prompt kernel (37 rows), 1 and 2
    threads. The SIMDe build runs the same AVX-512 source, emulated, on any x86-64. The
    32-weight types also at an odd number of blocks per row (73): the AVX-512 code takes
    their blocks in pairs, and the last one alone."""
    build = kernel_build
    n = 42
    for k in (2304, 2336) if qtype in SIMPLE else (2304,):
        raw = _tensor(qtype, n, k, seed=7)
        x = torch.randn(37, k, generator=torch.Generator().manual_seed(3)) * 2
        x[:, 11] *= 30
        bias = torch.randn(n, generator=torch.Generator().manual_seed(4))
        for bits in (16, 8):
            for rows in (1, 2, 9, 10, 11, 37):
                for t in (1, 2):
                    want = kernels.matmul(qtype.name, raw.data, n, k, x[:rows], bias,
                                          bits=bits, threads=t, build="avx2")
                    got = kernels.matmul(qtype.name, raw.data, n, k, x[:rows], bias,
                                         bits=bits, threads=t, build=build)
                    assert torch.equal(got, want), (k, bits, rows, t)


@pytest.mark.parametrize("qtype", [QT.Q4_K, QT.Q5_K, QT.Q6_K, QT.Q4_0, QT.Q4_1])
def test_int8_products_are_the_products_of_rounded_activations(qtype):
    """--activations int8 is llama.cpp's Q8 rounding: the product equals that of the rounded
    activations (x~ = amax / 127 * round(127 x / amax) per block) with the exact weights, up to
    float32 summation, offsets (mins) included. With the float sum of x for the offsets
    instead, a Q4_K product was ~3x further from the exact one than this."""
    n, k = 24, 512
    raw = _tensor(qtype, n, k, seed=9)
    x = torch.randn(3, k, generator=torch.Generator().manual_seed(5))
    x[:, 3] *= 25
    block = 256 if qtype in K_QUANTS else 32
    xb = x.double().view(3, -1, block)
    amax = xb.abs().amax(-1, keepdim=True)
    rounded = (torch.round(xb * (127 / amax)) * (amax / 127)).view(3, k)
    w = torch.from_numpy(gguf_quants.dequantize(raw.data, qtype).reshape(n, k)).double()
    want = rounded @ w.T
    got = kernels.matmul(qtype.name, raw.data, n, k, x, bits=8).double()
    assert (got - want).abs().max() <= 1e-5 * (rounded.abs() @ w.abs().T).max()


def test_zero_and_tiny_activations():
    raw = _tensor(QT.Q4_K, 16, 256)
    assert torch.equal(kernels.matmul("Q4_K", raw.data, 16, 256, torch.zeros(2, 256)),
                       torch.zeros(2, 16))
    x = torch.full((1, 256), 1e-30)
    y = kernels.matmul("Q4_K", raw.data, 16, 256, x)
    w = torch.from_numpy(gguf_quants.dequantize(raw.data, QT.Q4_K)).double()
    assert torch.allclose(y.double(), x.double() @ w.T, rtol=1e-3, atol=0)


def test_a_wrong_ctypes_mirror_is_refused_naming_the_field(monkeypatch):
    """The ctypes structs of __init__.py are checked against the C layout (tq_layout) at load:
    a field at another offset or of another size, a field C lacks, a C field the mirror lacks,
    or another struct size makes the library unusable, and the reason names the field."""
    layout = kernels._c_layout(kernels._load())
    assert layout["tq_model"][1] == ctypes.sizeof(kernels._Model)
    assert kernels._layout_error(layout) is None

    def model(change):  # _Model's fields with one changed
        fields = change(list(kernels._Model._fields_))
        return type("BadModel", (ctypes.Structure,), {"_fields_": fields})

    wider_eps = model(lambda f: [(n, ctypes.c_double if n == "eps" else t) for n, t in f])
    swapped = model(lambda f: [f[1], f[0]] + f[2:])  # dim first, n_layers second
    eps_last = model(lambda f: [x for x in f if x[0] != "eps"] + [("eps", ctypes.c_float)])
    no_prompt_rows = model(lambda f: [x for x in f if x[0] != "prompt_rows"])
    extra = model(lambda f: f + [("spare", ctypes.c_int64)])
    eps, scale = layout["tq_model.eps"][0], layout["tq_model.attn_scale"][0]
    cases = [(wider_eps, ["tq_model.eps", f"offset {eps} (size 4) in C",
                          f"offset {eps} (size 8) in the ctypes mirror BadModel"]),
             (swapped, ["tq_model.dim", "offset 8 (size 8) in C", "offset 0 (size 8) in the"]),
             (eps_last, ["tq_model.attn_scale", f"offset {scale} (size 4) in C"]),
             (no_prompt_rows, ["tq_model.prompt_rows", "missing from the ctypes mirror"]),
             (extra, ["tq_model.spare", "not a field of tq_model in C"])]
    for wrong, words in cases:
        msg = kernels._layout_error(layout, [(wrong, "tq_model")])
        assert msg is not None and all(w in msg for w in words), (msg, words)
    # a struct size alone (C padding the mirror lacks)
    padded = {**layout, "tq_linear": (0, layout["tq_linear"][1] + 8)}
    assert "sizeof tq_linear is 64 in C but 56" in kernels._layout_error(padded)
    # and loading refuses the library: unusable, the reason says which field
    monkeypatch.setattr(kernels, "_MIRRORS", ((kernels._Linear, "tq_linear"),
                                              (kernels._Layer, "tq_layer"),
                                              (no_prompt_rows, "tq_model")))
    with pytest.raises(OSError, match=r"tq_model\.prompt_rows"):
        kernels._build()


def test_every_kernel_type_has_a_block_size(monkeypatch):
    """Loading checks choices.KERNEL_TYPES against tq_block_bytes: a type id the C code does not
    know makes the library unusable."""
    lib = kernels._load()
    assert all(lib.tq_block_bytes(i) > 0 for i in kernels.KERNEL_TYPES.values())
    monkeypatch.setattr(kernels, "KERNEL_TYPES", {**kernels.KERNEL_TYPES, "NOT_A_TYPE": 255})
    with pytest.raises(OSError, match="NOT_A_TYPE = 255"):
        kernels._build()


def test_gguf_linear_bias_batch_shape_and_prefill_path():
    raw = _tensor(QT.Q6_K, 48, 512)
    bias = torch.randn(48)
    lin = GGUFLinear(raw, bias)
    w = torch.from_numpy(gguf_quants.dequantize(raw.data, QT.Q6_K)).float()
    x = torch.randn(2, 3, 512)
    y = lin(x)
    assert y.shape == (2, 3, 48) and y.dtype == torch.float32
    ref = torch.nn.functional.linear(x.double(), w.double(), bias.double())
    assert (y.double() - ref).abs().max() < 1e-3 * ref.abs().max()
    yw = lin(x, wide=True)  # prefill: float32 GEMM over the exact weights
    assert torch.allclose(yw, torch.nn.functional.linear(x, w, bias), rtol=1e-5, atol=1e-5)
    # the draft's vocabulary shortlist: some output rows, in place or copied, same bits
    assert torch.equal(lin.rows(slice(0, 10))(x), y[..., :10])
    assert torch.equal(lin.rows([5, 40, 2])(x), y[..., [5, 40, 2]])


def test_embedding_rows_and_make_linear_native_mode():
    raw = _tensor(QT.Q8_0, 50, 64)
    emb = GGUFEmbedding(raw)
    ids = torch.tensor([[3, 49, 0], [7, 7, 1]])
    full = torch.from_numpy(gguf_quants.dequantize(raw.data, QT.Q8_0))
    assert torch.equal(emb[ids], full[ids])
    assert isinstance(make_linear(raw, torch.float32, "native"), GGUFLinear)
    f32 = RawTensor("w", QT.F32, (4, 64), np.ones((4, 64), np.float32))
    assert not isinstance(make_linear(f32, torch.float32, "native"), GGUFLinear)  # stays dense


def test_switches_are_read_from_the_environment_by_the_config_alone():
    """TANDEM_KERNELS=0 (and the other two switches) reach the numerics through EngineConfig;
    the kernels module itself still builds, and --weights auto then means int4."""
    code = ("from tandem import kernels; from tandem.config import EngineConfig;"
            "from tandem.models.loader import resolve_mode; c = EngineConfig();"
            "print(kernels.available(), c.kernels, c.prompt_kernel, c.native_layers,"
            " resolve_mode(c.numerics()))")
    for env, want in (({"TANDEM_KERNELS": "0"}, "True False True True int4"),
                      ({"TANDEM_PROMPT_KERNEL": "0", "TANDEM_NATIVE_LAYERS": "0"},
                       "True True False False native"),
                      ({}, "True True True True native")):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             env={"PATH": "/usr/bin:/bin", **env})
        assert out.stdout.split() == want.split(), out.stderr
    with pytest.raises(TandemError, match="switched off"):
        resolve_mode(Numerics(weights="native", kernels=False))


def test_kernel_build_is_chosen_by_the_config():
    """TANDEM_KERNEL_BUILD=avx2 runs the AVX2 build wherever the CPU has AVX2 (to time that path
    on an AVX-512 machine); a name that is no build is refused with the names that are."""
    code = ("from tandem import kernels; from tandem.config import EngineConfig;"
            "from tandem.models.loader import resolve_mode;"
            "print(resolve_mode(EngineConfig().numerics()), kernels.in_use())")
    for build, want in (("avx2", "native avx2"), ("", f"native {kernels.variant()}")):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             env={"PATH": "/usr/bin:/bin", "TANDEM_KERNEL_BUILD": build})
        assert out.stdout.split() == want.split(), out.stderr
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin", "TANDEM_KERNEL_BUILD": "avx1024"})
    assert out.returncode != 0 and "'avx1024' (TANDEM_KERNEL_BUILD) is not one of avx2" in out.stderr


# ---- Q4_K, Q6_K, Q4_0 and Q5_0 in 16-row groups (rowdotx.c) ------------------------------

REPACKED = [QT.Q4_K, QT.Q6_K, QT.Q4_0, QT.Q5_0]
# (qtype, ablock): the groups also take activation blocks finer than their weights' block:
# the K-quants' 32, 64 or 128 of 256, Q4_0's and Q5_0's 16 of 32
REPACKED_ABLOCKS = [(q, a) for q in REPACKED for a in ((0, 32, 64, 128) if q in K_QUANTS else (0, 16))]


def _rounded8(x: torch.Tensor, block: int = 256) -> torch.Tensor:
    """x with each block of values rounded to its int8 grid (256: llama.cpp's Q8_K), float64;
    the steps in float32 as quantize_row8 takes them (in float64 a value at x * 127 / amax
    near a half rounds the other way now and then: one step of one activation)."""
    xb = x.float().view(x.shape[0], -1, block)
    amax = xb.abs().amax(-1, keepdim=True)
    q = torch.round(xb * (torch.tensor(127.0) / amax))
    return (q.double() * (amax / 127).double()).view(x.shape)


@pytest.mark.parametrize("qtype,ablock", REPACKED_ABLOCKS)
@pytest.mark.parametrize("m", [1, 5, 10, 11, 37])
def test_repacked_is_the_product_of_rounded_activations(qtype, m, ablock):
    """Int8 Q4_K, Q6_K, Q4_0 and Q5_0 products read their weights from 16-row groups made on
    first use (kernels.repack): each row's block sums complete in one lane, one float step for
    16 rows and activation block. The result is still the product of the rounded activations
    (per 256 values for the K-quants, 32 for the others, or per `ablock`: a scale of their own
    for every 32, 64 or 128, or 16 of Q4_0's / Q5_0's 32, finer steps where a block holds an
    outlier) with the exact
    weights, up to float32 summation, with a bias; decode and verification rows (<= 10) and
    prompt rows alike. K = 2336 for the 32-weight types: an odd number of blocks."""
    n, k = 80, 2304 if qtype in K_QUANTS else 2336
    raw = _tensor(qtype, n, k, seed=m)
    kind, packed = kernels.repack(qtype.name, raw.data, n, k, 8)
    assert kind == f"{qtype.name}x16" and packed.shape == raw.data.shape
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
    x[:, 9] *= 30
    bias = torch.randn(n, generator=torch.Generator().manual_seed(1))
    w = torch.from_numpy(gguf_quants.dequantize(raw.data, qtype).reshape(n, k)).double()
    rounded = _rounded8(x, ablock or (256 if qtype in K_QUANTS else 32))
    want = rounded @ w.T + bias.double()
    got = kernels.matmul(kind, packed, n, k, x, bias, bits=8, ablock=ablock, threads=2).double()
    assert (got - want).abs().max() <= 1e-5 * (rounded.abs() @ w.abs().T).max()
    if ablock:  # an outlier in every 256 (32) values: finer blocks are closer to the exact product
        x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
        x[:, 9::256 if qtype in K_QUANTS else 32] *= 30
        exact = x.double() @ w.T + bias.double()
        fine, coarse = (kernels.matmul(kind, packed, n, k, x, bias, bits=8, ablock=b,
                                       threads=2).double() for b in (ablock, 0))
        assert (fine - exact).abs().mean() < (coarse - exact).abs().mean()
        return
    # the GGUF blocks' kernels: the same values to float32 summation, in another order
    plain = kernels.matmul(qtype.name, raw.data, n, k, x, bias, bits=8, threads=2).double()
    assert (got - plain).abs().max() <= 1e-5 * (rounded.abs() @ w.abs().T).max()


@pytest.mark.parametrize("qtype,ablock", REPACKED_ABLOCKS)
def test_repacked_rows_are_batch_invariant_in_every_build(kernel_build, qtype, ablock):
    """Row i of any product of the 16-row groups equals its 1-row product bit for bit, for 1 to
    10 rows and more, 1 to 3 threads (chunks of 32 weight rows handed out as threads come
    free: the last 16 rows alone), row-by-row counts and prompt counts, whatever the
    activation block; and the AVX2 build (maddubs, madd) gives the AVX-512 build's (vpdpbusd,
    vpdpwssd) integers and float steps: the same bits."""
    n, k, m = 80, 1536 if qtype in K_QUANTS else 1568, 23
    raw = _tensor(qtype, n, k, seed=3)
    kind, packed = kernels.repack(qtype.name, raw.data, n, k, 8)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(4)) * 3
    bias = torch.randn(n, generator=torch.Generator().manual_seed(5))
    how = dict(bits=8, ablock=ablock)
    full = kernels.matmul(kind, packed, n, k, x, bias, **how, threads=2, build="avx2")
    for build in ("avx2", kernel_build):
        for t in (1, 2, 3):
            assert torch.equal(kernels.matmul(kind, packed, n, k, x, bias, **how, threads=t,
                                              build=build), full), (build, t)
            # every count of verification rows (the AVX2 build takes them in blocks of 1-4
            # that differ by count), and past one pass's 10 (3..14)
            for rows in [slice(7, 8), *(slice(2, 2 + r) for r in range(1, 11)), slice(3, 14)]:
                got = kernels.matmul(kind, packed, n, k, x[rows], bias, **how, threads=t,
                                     build=build)
                assert torch.equal(got, full[rows]), (build, t, rows)


@pytest.mark.parametrize("qtype", REPACKED)
def test_any_rows_repacked_give_those_rows_bits(qtype):
    """A row's result does not depend on the rows in its group: a linear of some of a matrix's
    rows (the draft's vocabulary shortlist: a prefix and a few copied rows, padded with zero
    rows to a whole group) gives exactly the full product's values at those rows."""
    n, k = 64, 512
    full = GGUFLinear(_tensor(qtype, n, k, seed=2), bits=8)
    x = torch.randn(3, k, generator=torch.Generator().manual_seed(6))
    want = full(x)
    assert full.kernel_blocks()[0] == f"{qtype.name}x16"
    for idx in (slice(0, 16), slice(0, 21), [40, 3, 63]):
        part = full.rows(idx)
        assert torch.equal(part(x), want[:, idx]), idx


def test_repack_takes_what_its_kernels_compute():
    """Only int8 products of the grouped types are repacked (a partial group padded with
    zero rows); the kernels refuse int16 activations for the repacked types (they exist for
    int8 only), naming the call, and activation blocks other than 16 for Q4_0 / Q5_0's."""
    raw = _tensor(QT.Q4_K, 48, 512)
    assert kernels.repack("Q4_K", raw.data, 48, 512, 16) is None
    assert kernels.repack("Q5_0", _tensor(QT.Q5_0, 48, 512).data, 48, 512, 16) is None
    for other in (QT.Q8_0, QT.Q4_1, QT.Q5_1):
        assert kernels.repack(other.name, _tensor(other, 48, 512).data, 48, 512, 8) is None
    kind5, packed5 = kernels.repack("Q5_0", _tensor(QT.Q5_0, 40, 96).data, 40, 96, 8)
    assert kind5 == "Q5_0x16" and packed5.shape == (48, 3 * 22)
    with pytest.raises(TandemError, match="activation blocks of 64 values"):
        kernels.matmul(kind5, packed5, 48, 96, torch.randn(2, 96), bits=8, ablock=64)
    kind, odd = kernels.repack("Q4_K", _tensor(QT.Q4_K, 40, 512).data, 40, 512, 8)
    assert odd.shape == (48, 2 * 144)  # 40 rows and 8 zero rows in whole groups
    kind, packed = kernels.repack("Q4_K", raw.data, 48, 512, 8)
    with pytest.raises(TandemError, match="Q4_Kx16, N=48, K=512"):
        kernels.matmul(kind, packed, 48, 512, torch.randn(2, 512), bits=16)
    # finer activation blocks: int8 products of the grouped types only, 32, 64 or 128 values
    # (16 for Q4_0's and Q5_0's 32)
    x = torch.randn(2, 512)
    for bad in (dict(type_name="Q4_K", blocks=raw.data, ablock=64, bits=8),
                dict(type_name=kind, blocks=packed, ablock=64, bits=16),
                dict(type_name=kind, blocks=packed, ablock=96, bits=8),
                dict(type_name=kind, blocks=packed, ablock=16, bits=8)):
        with pytest.raises(TandemError, match="activation blocks of"):
            kernels.matmul(bad["type_name"], bad["blocks"], 48, 512, x, bits=bad["bits"],
                           ablock=bad["ablock"])


def test_fine_activation_blocks_where_the_kernels_have_them():
    """A linear asked for int8 blocks of 64 (the down projection under --activations
    int8-down64) is rounded finer than its weights' own block: blocks of 64 where its weights
    are K-quants in groups (Q4_K, Q5_K, Q6_K), of 16 where they are Q4_0 / Q5_0 in groups
    (their blocks are 32: llama.cpp's Q8_0 scale), int16 where no grouped kernel reads them
    (Q8_0, Q4_1; IQ2_XXS: tests/test_kernels_xk.py)."""
    x = torch.randn(3, 512, generator=torch.Generator().manual_seed(8))
    x[:, 5] *= 40
    for qtype, want in ((QT.Q4_K, (8, 64)), (QT.Q6_K, (8, 64)), (QT.Q8_0, (16, 0)),
                        (QT.Q4_1, (16, 0)), (QT.Q5_0, (8, 16)), (QT.Q4_0, (8, 16)),
                        (QT.Q5_K, (8, 64))):
        raw = _tensor(qtype, 32, 512, seed=1)
        lin = GGUFLinear(raw, bits=8, act_block=64)
        assert lin.rounding() == want, qtype
        kind, blocks = lin.kernel_blocks()
        assert torch.equal(lin(x), kernels.matmul(kind, blocks, 32, 512, x, bits=want[0],
                                                  ablock=want[1])), qtype
    assert GGUFLinear(_tensor(QT.Q4_K, 32, 512), bits=16, act_block=64).rounding() == (16, 0)
