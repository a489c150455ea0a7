"""Q5_K (rowdotx.c), Q2_K, Q3_K and IQ4_XS (rowdotxk.c) in 16-row groups with int8 activations:
repacked at load into the same bytes, the products those of the rounded activations with the
exact weights (llama.cpp's dequantize_row_* via the gguf package), every row the same bits at
every row count, thread count, activation block and build."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as QT
from gguf import quants as gguf_quants

from tandem import kernels
from tandem.models.gguf_file import RawTensor
from tandem.models.quant import GGUFLinear

pytestmark = pytest.mark.skipif(not kernels.available(),
                                reason=f"native kernels unavailable: {kernels.unavailable_reason()}")

# block bytes, where the f16 scales sit (random bytes elsewhere: every nibble, bit and
# sub-scale pattern, the largest sub-scales included)
LAYOUT = {QT.Q5_K: (176, (0, 2)), QT.Q2_K: (84, (80, 82)), QT.Q3_K: (110, (108,)),
          QT.IQ4_XS: (136, (0,))}
TYPES = list(LAYOUT)
ABLOCKS = (0, 32, 64, 128)


def _tensor(qtype: QT, rows: int, cols: int, seed: int = 0) -> RawTensor:
    rng = np.random.default_rng(seed)
    nbytes, f16_at = LAYOUT[qtype]
    blocks = rng.integers(0, 256, size=(rows * cols // 256, nbytes), dtype=np.uint8)
    for at in f16_at:
        blocks[:, at: at + 2] = rng.uniform(1e-4, 3e-3, (len(blocks), 1)).astype(
            np.float16).view(np.uint8)
    return RawTensor("blk.0.ffn_up.weight", qtype, (rows, cols), blocks.reshape(rows, -1))


def _rounded8(x: torch.Tensor, block: int) -> torch.Tensor:
    """x with each block of values rounded to its int8 grid, the steps in float32 as
    quantize_row8 takes them, float64"""
    xb = x.float().view(x.shape[0], -1, block)
    amax = xb.abs().amax(-1, keepdim=True)
    q = torch.round(xb * (torch.tensor(127.0) / amax))
    return (q.double() * (amax / 127).double()).view(x.shape)


@pytest.mark.parametrize("qtype", TYPES)
@pytest.mark.parametrize("ablock", ABLOCKS)
@pytest.mark.parametrize("m", [1, 5, 11, 37])
def test_grouped_product_is_that_of_the_rounded_activations(qtype, ablock, m):
    """The 16-row groups (the same bytes as the file's blocks) give the product of the
    activations rounded per 256 values, or per `ablock`, with the exact weights, up to float32
    summation, with a bias; decode, verification and prompt rows alike. Without finer blocks
    they also agree with the GGUF blocks' own int8 kernels to float32 summation."""
    n, k = 80, 2304
    raw = _tensor(qtype, n, k, seed=m)
    kind, packed = kernels.repack(qtype.name, raw.data, n, k, 8)
    assert kind == f"{qtype.name}x16" and packed.shape == raw.data.shape
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
    x[:, 9] *= 30
    bias = torch.randn(n, generator=torch.Generator().manual_seed(1))
    w = torch.from_numpy(gguf_quants.dequantize(raw.data, qtype).reshape(n, k)).double()
    rounded = _rounded8(x, ablock or 256)
    scale = (rounded.abs() @ w.abs().T).max()
    want = rounded @ w.T + bias.double()
    got = kernels.matmul(kind, packed, n, k, x, bias, bits=8, ablock=ablock, threads=2).double()
    assert (got - want).abs().max() <= 1e-5 * scale
    if not ablock:
        plain = kernels.matmul(qtype.name, raw.data, n, k, x, bias, bits=8, threads=2).double()
        assert (got - plain).abs().max() <= 1e-5 * scale


@pytest.mark.parametrize("qtype", TYPES)
@pytest.mark.parametrize("ablock", (0, 64))
def test_grouped_rows_are_batch_invariant_in_every_build(kernel_build, qtype, ablock):
    """Row i of any product equals its 1-row product bit for bit, for 1 to 10 rows and more,
    1 to 3 threads (chunks of 32 weight rows: the last 16 rows alone), and the AVX2 build
    (maddubs, madd; IQ4_XS: |T| times signed activations) gives the AVX-512 build's (vpdpbusd,
    vpdpwssd / vpmulld; IQ4_XS: T + 128 from -128 times the sums) integers and float steps.
    Random bytes: every sub-scale, Q3_K's negative ones and the largest included."""
    n, k, m = 80, 1536, 23
    raw = _tensor(qtype, n, k, seed=3)
    kind, packed = kernels.repack(qtype.name, raw.data, n, k, 8)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(4)) * 3
    x[:, 7] *= 20
    bias = torch.randn(n, generator=torch.Generator().manual_seed(5))
    how = dict(bits=8, ablock=ablock)
    full = kernels.matmul(kind, packed, n, k, x, bias, **how, threads=2, build="avx2")
    for build in ("avx2", kernel_build):
        for t in (1, 2, 3):
            assert torch.equal(kernels.matmul(kind, packed, n, k, x, bias, **how, threads=t,
                                              build=build), full), (build, t)
            for rows in [slice(7, 8), *(slice(2, 2 + r) for r in range(1, 11)), slice(3, 14)]:
                got = kernels.matmul(kind, packed, n, k, x[rows], bias, **how, threads=t,
                                     build=build)
                assert torch.equal(got, full[rows]), (build, t, rows)


@pytest.mark.parametrize("qtype", TYPES)
def test_linear_reads_the_groups_with_fine_activation_blocks(qtype):
    """An int8 linear of these types reads its 16-row groups (padded to whole groups), in
    place of the file's blocks, and a linear asked for int8 blocks of 64 (the down projection
    under --activations int8-down64) gets them, not int16; a row's bits do not depend on the
    rows grouped with it."""
    n, k = 40, 512
    raw = _tensor(qtype, n, k, seed=2)
    x = torch.randn(3, k, generator=torch.Generator().manual_seed(8))
    x[:, 5] *= 40
    lin = GGUFLinear(raw, bits=8, act_block=64)
    kind, blocks = lin.kernel_blocks()
    assert kind == f"{qtype.name}x16" and blocks.shape == (48, raw.data.shape[1])
    assert lin.rounding() == (8, 64)
    want = kernels.matmul(kind, blocks, 48, k, x, bits=8, ablock=64)[:, :n]
    assert torch.equal(lin(x), want)
    for idx in (slice(0, 16), [33, 3, 39]):
        assert torch.equal(lin.rows(idx)(x), want[:, idx]), idx
    assert kernels.repack(qtype.name, raw.data, n, k, 16) is None  # int16: the GGUF blocks


def test_a_type_without_groups_rounds_finer_blocks_to_int16():
    """IQ2_XXS (blocks of 256) has no 16-row groups: asked for int8 blocks of 64 it rounds to
    int16 instead, never coarser than asked, and reads the file's blocks."""
    rng = np.random.default_rng(0)
    blocks = rng.integers(0, 256, size=(32 * 2, 66), dtype=np.uint8)
    blocks[:, 0:2] = np.array([1e-3], np.float16).view(np.uint8)
    raw = RawTensor("blk.0.ffn_down.weight", QT.IQ2_XXS, (32, 512), blocks.reshape(32, -1))
    lin = GGUFLinear(raw, bits=8, act_block=64)
    assert lin.rounding() == (16, 0) and lin.kernel_blocks()[1] is raw.data
