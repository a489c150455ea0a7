"""The kernels of rowdoti.c (llama.cpp's i-quants and ternary types, int16 / int8 activations)
against the gguf package and float64 math: weights read exactly as llama.cpp's dequantize_row_*
gives them, products within their activations' rounding (with the largest sub-scales too, where
an int32 lane sum would overflow first), every row the same bits at every row count, thread
count and build."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as QT
from gguf import quants as gguf_quants

from tandem import kernels
from tandem.models.gguf_file import RawTensor
from tandem.models.quant import GGUFEmbedding, GGUFLinear, make_linear

from . import tiny

pytestmark = pytest.mark.skipif(not kernels.available(),
                                reason=f"native kernels unavailable: {kernels.unavailable_reason()}")

TYPES = [QT.IQ2_XXS, QT.IQ2_XS, QT.IQ2_S, QT.IQ3_XXS, QT.IQ3_S, QT.IQ1_S, QT.IQ1_M, QT.TQ1_0,
         QT.TQ2_0]

# the bytes (offsets in a block) that hold each type's integer sub-scales, and the bits of
# theirs to set for the largest ones
MAX_SUBSCALES = {QT.IQ2_XXS: [([9 + 8 * b for b in range(8)], 0xF0)],
                 QT.IQ3_XXS: [([69 + 4 * b for b in range(8)], 0xF0)],
                 QT.IQ3_S: [([106, 107, 108, 109], 0xFF)],
                 QT.IQ2_XS: [(list(range(66, 74)), 0xFF)],
                 QT.IQ2_S: [(list(range(74, 82)), 0xFF)],
                 QT.IQ1_S: [([35 + 2 * b for b in range(8)], 0x70)],
                 QT.IQ1_M: [([48, 50, 52, 54], 0xFF), ([49, 51, 53, 55], 0x0F)]}


def _tensor(qtype: QT, rows: int, cols: int, seed: int = 0) -> RawTensor:
    """Random blocks (every grid index, sign and sub-scale pattern) with fp16 scales from 1e-4
    to 3e-3, in tiny.RANDOM_BLOCKS' layout."""
    rng = np.random.default_rng(seed)
    block, nbytes, f16_at = tiny.RANDOM_BLOCKS[qtype.name]
    blocks = rng.integers(0, 256, size=(rows * cols // block, nbytes), dtype=np.uint8)
    for at in f16_at:
        tiny.put_f16(blocks, qtype.name, at, rng.uniform(1e-4, 3e-3, len(blocks)))
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


@pytest.mark.parametrize("qtype", TYPES)
@pytest.mark.parametrize("threads", [1, 2])
def test_dequantize_equals_gguf_bit_for_bit(qtype, threads):
    raw = _tensor(qtype, 24, 512)
    ours = kernels.dequantize(qtype.name, raw.data, 24, 512, threads=threads)
    assert np.array_equal(ours.numpy(), _weights(raw).float().numpy())


@pytest.mark.parametrize("qtype", TYPES)
@pytest.mark.parametrize("bits", [16, 8])
@pytest.mark.parametrize("m", [1, 3, 10, 11, 37])
def test_products_are_those_of_the_rounded_activations(qtype, bits, m):
    """The product equals that of the activations rounded per 256 (int16: max|x| / 16383
    steps, int8: llama.cpp's / 127) with the exact weights, up to float32 summation. With an
    outlier, as real hidden states have."""
    n, k = 40, 768
    raw = _tensor(qtype, n, k, seed=m)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
    x[:, 5] *= 50
    xr = _rounded(x, 256, 16383 if bits == 16 else 127)
    w = _weights(raw)
    got = kernels.matmul(qtype.name, raw.data, n, k, x, bits=bits).double()
    assert (got - xr @ w.T).abs().max() <= 2e-6 * (xr.abs() @ w.abs().T).max()
    if bits == 16:  # and int16 is within 1e-3 of the exact product's scale
        exact = x.double() @ w.T
        assert (got - exact).abs().max() < 1e-3 * exact.abs().max()


@pytest.mark.parametrize("qtype", TYPES)
def test_the_largest_sub_scales_stay_inside_int32(qtype):
    """Every sub-scale at its largest and activations of the weights' own signs at full scale
    (16383, 127): every lane's sum is as large as the type allows, and still exact."""
    n, k = 6, 1024
    raw = _tensor(qtype, n, k, seed=5)
    if qtype in MAX_SUBSCALES:
        blocks = raw.data.reshape(n * k // 256, -1)
        for at, bits in MAX_SUBSCALES[qtype]:
            blocks[:, at] |= bits
    w = _weights(raw)
    x = torch.sign(w).float()  # row i: every product of weight row i positive
    for bits in (16, 8):
        xr = _rounded(x, 256, 16383 if bits == 16 else 127)
        got = kernels.matmul(qtype.name, raw.data, n, k, x, bits=bits).double()
        want = xr @ w.T
        assert (got - want).abs().max() <= 2e-6 * want.diagonal().max(), bits
        assert (got.diagonal() > 0).all()


@pytest.mark.parametrize("qtype", TYPES)
def test_rows_are_batch_invariant_in_every_build(kernel_build, qtype):
    """Row i of an M-row product equals its 1-row product, for 1, 2, 9, 10, 11 and 37 rows
    (decode, verification, a prompt chunk on the row kernels) and 1 or 2 threads, and every
    build gives the AVX2 build's bits."""
    n, k = 42, 2304
    raw = _tensor(qtype, n, k, seed=7)
    x = torch.randn(37, k, generator=torch.Generator().manual_seed(3)) * 2
    x[:, 11] *= 30
    bias = torch.randn(n, generator=torch.Generator().manual_seed(4))
    for bits in (16, 8):
        one = torch.cat([kernels.matmul(qtype.name, raw.data, n, k, x[i: i + 1], bias,
                                        bits=bits, build="avx2") for i in range(37)])
        for rows in (1, 2, 9, 10, 11, 37):
            for t in (1, 2):
                got = kernels.matmul(qtype.name, raw.data, n, k, x[:rows], bias, bits=bits,
                                     threads=t, build=kernel_build)
                assert torch.equal(got, one[:rows]), (bits, rows, t)
        assert torch.equal(kernels.dequantize(qtype.name, raw.data, n, k, build=kernel_build),
                           kernels.dequantize(qtype.name, raw.data, n, k, build="avx2"))


@pytest.mark.parametrize("qtype", TYPES)
def test_linear_and_embedding_read_the_file_blocks_in_place(qtype):
    """make_linear in native mode reads these types in place (no float copy of the tensor)
    and an embedding takes only the rows asked for."""
    raw = _tensor(qtype, 64, 512, seed=2)
    lin = make_linear(raw, torch.float32, "native")
    assert isinstance(lin, GGUFLinear) and lin.blocks is raw.data
    x = torch.randn(3, 512, generator=torch.Generator().manual_seed(1))
    assert torch.equal(lin(x), kernels.matmul(qtype.name, raw.data, 64, 512, x))
    emb = GGUFEmbedding(raw)
    ids = torch.tensor([[5, 0, 63]])
    assert torch.equal(emb[ids][0].double(), _weights(raw)[[5, 0, 63]])


def test_grid_tables_are_the_gguf_packages():
    """iq_grids.h is written from gguf.quants' tables: IQ2_XXS's entry 1 is weights
    (43, 8, 8, 8, 8, 8, 8, 8), one byte each, weight 0 in the low byte (llama.cpp's own
    iq2xxs_grid[1] is 0x080808080808082b)."""
    text = kernels.grids.header()
    assert "static const uint64_t IQ2XXS_GRID[256] = {" in text
    assert "0x0808080808080808, 0x080808080808082b," in text
    assert "static const uint8_t KSIGNS[128] = {\n    0x00, 0x81, 0x82, 0x03," in text
