"""The kernels of rowdotn.c (Q2_K, Q3_K, IQ4_NL, IQ4_XS with int16 / int8 activations; F16 and
BF16 with float32 ones) against the gguf package and float64 math: weights read exactly as
llama.cpp's dequantize_row_* gives them, products within their activations' rounding, every row
the same bits at every row count, thread count and build."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as QT
from gguf import quants as gguf_quants

from tandem import kernels
from tandem.models.gguf_file import RawTensor
from tandem.models.quant import GGUFEmbedding, GGUFLinear, make_linear

pytestmark = pytest.mark.skipif(not kernels.available(),
                                reason=f"native kernels unavailable: {kernels.unavailable_reason()}")

# block weights, block bytes, where the f16 scales sit (random bytes elsewhere: every nibble,
# bit and sub-scale pattern)
INT_LAYOUT = {QT.Q2_K: (256, 84, (80, 82)), QT.Q3_K: (256, 110, (108,)),
              QT.IQ4_XS: (256, 136, (0,)), QT.IQ4_NL: (32, 18, (0,))}
INT_TYPES = list(INT_LAYOUT)
FLOAT_TYPES = [QT.F16, QT.BF16]


def _tensor(qtype: QT, rows: int, cols: int, seed: int = 0) -> RawTensor:
    rng = np.random.default_rng(seed)
    if qtype == QT.Q8_0:  # (test_kernels.py covers it; here for the prompt kernel)
        values = rng.standard_normal((rows, cols)).astype(np.float32)
        return RawTensor("blk.0.ffn_up.weight", qtype, (rows, cols),
                         gguf_quants.quantize(values, qtype))
    if qtype in FLOAT_TYPES:
        values = rng.standard_normal((rows, cols)).astype(np.float32) * 0.05
        data = gguf_quants.quantize(values, qtype)  # F16: float16 values; BF16: bytes
        return RawTensor("blk.0.ffn_up.weight", qtype, (rows, cols), data)
    block, nbytes, f16_at = INT_LAYOUT[qtype]
    blocks = rng.integers(0, 256, size=(rows * cols // block, nbytes), dtype=np.uint8)
    for at in f16_at:
        blocks[:, at: at + 2] = rng.uniform(1e-4, 3e-3, (len(blocks), 1)).astype(
            np.float16).view(np.uint8)
    return RawTensor("blk.0.ffn_up.weight", qtype, (rows, cols), blocks.reshape(rows, -1))


def _weights(raw: RawTensor) -> torch.Tensor:
    n, k = raw.shape
    return torch.from_numpy(gguf_quants.dequantize(raw.data, raw.qtype).reshape(n, k)).double()


def _rounded(x: torch.Tensor, block: int, levels: int) -> torch.Tensor:
    """x rounded as the kernels round activations: per block, steps of max|x| / levels"""
    m, k = x.shape
    xb = x.double().view(m, k // block, block)
    amax = xb.abs().amax(-1, keepdim=True)
    step = (amax / levels).float().double()  # the kernels keep the step as a float
    return (torch.round(xb / torch.where(step > 0, step, 1)) * step).view(m, k)


@pytest.mark.parametrize("qtype", INT_TYPES + FLOAT_TYPES)
@pytest.mark.parametrize("threads", [1, 2])
def test_dequantize_equals_gguf_bit_for_bit(qtype, threads):
    raw = _tensor(qtype, 24, 512)
    ours = kernels.dequantize(qtype.name, raw.data, 24, 512, threads=threads)
    assert np.array_equal(ours.numpy(), _weights(raw).float().numpy())


@pytest.mark.parametrize("qtype", INT_TYPES)
@pytest.mark.parametrize("bits", [16, 8])
@pytest.mark.parametrize("m", [1, 3, 10, 11, 37])
def test_integer_products_are_those_of_the_rounded_activations(qtype, bits, m):
    """The product equals that of the activations rounded per block (int16: max|x| / 16383
    steps, int8: llama.cpp's / 127) with the exact weights, up to float32 summation; Q2_K's
    mins meet the same rounded activations. With an outlier, as real hidden states have."""
    n, k = 40, 768
    raw = _tensor(qtype, n, k, seed=m)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
    x[:, 5] *= 50
    block = INT_LAYOUT[qtype][0]
    xr = _rounded(x, block, 16383 if bits == 16 else 127)
    w = _weights(raw)
    want = xr @ w.T
    got = kernels.matmul(qtype.name, raw.data, n, k, x, bits=bits).double()
    assert (got - want).abs().max() <= 2e-6 * (xr.abs() @ w.abs().T).max()
    if bits == 16:  # and int16 is within 1e-3 of the exact product's scale
        exact = x.double() @ w.T
        assert (got - exact).abs().max() < 1e-3 * exact.abs().max()


@pytest.mark.parametrize("qtype", FLOAT_TYPES)
@pytest.mark.parametrize("m", [1, 3, 10, 11, 37])
def test_float_products_are_float32_sums_of_exact_terms(qtype, m):
    """F16 / BF16 weights widened exactly, activations as they are: only float32 summation
    error, whatever `bits` asks for the integer types."""
    n, k = 40, 768
    raw = _tensor(qtype, n, k, seed=m)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
    x[:, 5] *= 50
    w = _weights(raw)
    exact = x.double() @ w.T
    scale = (x.double().abs() @ w.abs().T)
    for bits in (16, 8):
        got = kernels.matmul(qtype.name, raw.data, n, k, x, bits=bits).double()
        assert ((got - exact).abs() <= 1e-6 * scale).all()


@pytest.mark.parametrize("qtype", INT_TYPES + FLOAT_TYPES)
def test_rows_are_batch_invariant_in_every_build(kernel_build, qtype):
    """Row i of an M-row product equals its 1-row product, for 1, 2, 9, 10, 11 and 37 rows
    (decode, verification, a prompt chunk) and 1 or 2 threads, and every build gives the AVX2
    build's bits: verification rows equal one-token decoding exactly, on any CPU."""
    n, k = 42, 2304
    raw = _tensor(qtype, n, k, seed=7)
    x = torch.randn(37, k, generator=torch.Generator().manual_seed(3)) * 2
    x[:, 11] *= 30
    bias = torch.randn(n, generator=torch.Generator().manual_seed(4))
    for bits in (16, 8) if qtype in INT_TYPES else (16,):
        one = torch.cat([kernels.matmul(qtype.name, raw.data, n, k, x[i: i + 1], bias,
                                        bits=bits, build="avx2") for i in range(37)])
        for rows in (1, 2, 9, 10, 11, 37):
            for t in (1, 2):
                got = kernels.matmul(qtype.name, raw.data, n, k, x[:rows], bias, bits=bits,
                                     threads=t, build=kernel_build)
                assert torch.equal(got, one[:rows]), (bits, rows, t)


@pytest.mark.parametrize("qtype", INT_TYPES + FLOAT_TYPES)
def test_linear_and_embedding_read_the_file_blocks_in_place(qtype):
    """make_linear in native mode reads these types in place (no float copy of the tensor)
    and an embedding takes only the rows asked for."""
    raw = _tensor(qtype, 64, 512, seed=2)
    lin = make_linear(raw, torch.float32, "native")
    assert isinstance(lin, GGUFLinear) and lin.blocks is raw.data
    x = torch.randn(3, 512, generator=torch.Generator().manual_seed(1))
    want = kernels.matmul(qtype.name, raw.data, 64, 512, x)
    assert torch.equal(lin(x), want)
    emb = GGUFEmbedding(raw)
    ids = torch.tensor([[5, 0, 63]])
    assert torch.equal(emb[ids][0].double(), _weights(raw)[[5, 0, 63]])


@pytest.mark.parametrize("qtype", FLOAT_TYPES + [QT.Q2_K, QT.Q3_K, QT.IQ4_XS, QT.Q8_0])
def test_prompt_kernels_give_the_row_by_row_bits(qtype):
    """A prompt chunk takes the prompt kernel: F16 / BF16 register tiles over blocks of
    activation rows (as many as fit the L2 for this K: 18 of the 100 rows here, so several
    blocks and a partial one), Q2_K / Q3_K / IQ4_XS / Q8_0 gemm.c's (weights unpacked once per
    chunk of 2048 values: three here; Q8_0 a float step per 32, int8 in rowdot8's lanes of
    four) with int16 and int8 activations; 45 weight rows (a partial tile).
    Each row still equals its one-row product and the row-by-row kernels' product, on 1 to 3
    threads."""
    n, k, m = 45, 6144, 100
    raw = _tensor(qtype, n, k, seed=11)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(8))
    x[:, 9] *= 20
    bias = torch.randn(n, generator=torch.Generator().manual_seed(9))
    for bits in (16,) if qtype in FLOAT_TYPES else (16, 8):
        rowwise = kernels.matmul(qtype.name, raw.data, n, k, x, bias, bits=bits,
                                 prompt_rows=1 << 62)
        for t in (1, 2, 3):
            got = kernels.matmul(qtype.name, raw.data, n, k, x, bias, bits=bits, threads=t)
            assert torch.equal(got, rowwise), (bits, t)
        for i in (0, 17, 18, 99):
            one = kernels.matmul(qtype.name, raw.data, n, k, x[i: i + 1], bias, bits=bits)
            assert torch.equal(one[0], rowwise[i]), (bits, i)
