"""BF16d (kernels/rowdotb.c): BF16 weights in place against activations rounded to bf16, with
AVX512_BF16's vdpbf16ps arithmetic in every build. Each product equals a float32 reference of
the same lane steps bit for bit, every row the same bits at every row count, thread count and
build (avx2, avx512, avx512bf16 where the CPU has it, avx512-simde), and within bf16's
rounding of the exact product."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as QT
from gguf import quants as gguf_quants

from tandem import kernels

pytestmark = pytest.mark.skipif(not kernels.available(),
                                reason=f"native kernels unavailable: {kernels.unavailable_reason()}")


def _weights(n: int, k: int, seed: int) -> np.ndarray:
    values = np.random.default_rng(seed).standard_normal((n, k)).astype(np.float32) * 0.05
    return gguf_quants.quantize(values, QT.BF16)  # (n, 2k) bytes


def _bf16(x: torch.Tensor) -> np.ndarray:
    """x rounded to bf16 (to nearest, ties to even), as float32"""
    return x.to(torch.bfloat16).float().numpy()


def _reference(blocks: np.ndarray, x: torch.Tensor, bias: torch.Tensor | None) -> np.ndarray:
    """The lane steps in float32: per 32 values, lane j += w[2j+1] x[2j+1], then += w[2j] x[2j]
    (each product of two bf16 exact in float32, each sum rounded once: vdpbf16ps on normal
    numbers), lanes 0-7 + lanes 8-15, then rowdotn.c's hsum8 order, then the bias."""
    n, k = blocks.shape[0], blocks.shape[1] // 2
    w = (blocks.view(np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(n, k)
    xr = _bf16(x)
    lanes = np.zeros((x.shape[0], n, 16), np.float32)
    for c in range(0, k, 32):
        wc, xc = w[:, c: c + 32], xr[:, c: c + 32]
        for parity in (1, 0):
            lanes = lanes + xc[:, None, parity::2] * wc[None, :, parity::2]
    v = lanes[..., :8] + lanes[..., 8:]
    s = v[..., :4] + v[..., 4:]
    out = (s[..., 0] + s[..., 2]) + (s[..., 1] + s[..., 3])
    return out if bias is None else out + bias.numpy()


def _builds() -> list[str]:
    """Every build that should load here (avx512, avx512bf16: where the CPU has them;
    avx512-simde: where SIMDe's headers are, as .ci/run installs them); one that does not
    load is a failure."""
    cpu = kernels._cpu_flags()
    out = ["avx2"] + (["avx512-simde"] if Path("/usr/include/simde/x86/avx512.h").exists() else [])
    out += [b for b in ("avx512", "avx512bf16") if all(f in cpu for f in kernels.VARIANTS[b][1])]
    for b in out:
        assert kernels.unavailable_reason(b) is None, (b, kernels.unavailable_reason(b))
    return out


@pytest.mark.parametrize("m", [1, 3, 10, 11, 37])
def test_products_equal_the_float_reference_bit_for_bit(m):
    n, k = 40, 768
    blocks = _weights(n, k, m)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
    x[:, 5] *= 50
    bias = torch.randn(n, generator=torch.Generator().manual_seed(9))
    got = kernels.matmul("BF16d", blocks, n, k, x, bias).numpy()
    assert np.array_equal(got, _reference(blocks, x, bias))
    # and within bf16's rounding of the activations of the exact product
    w = torch.from_numpy(gguf_quants.dequantize(blocks, QT.BF16).reshape(n, k)).double()
    exact = x.double() @ w.T + bias.double()
    assert ((torch.from_numpy(got).double() - exact).abs()
            <= 2 ** -8 * (x.double().abs() @ w.abs().T) + 1e-6).all()


def test_rows_are_batch_invariant_in_every_build():
    """Row i of an M-row product (decode 1..10 rows, prompt chunks of 11 and 100, which take
    the register tiles over several blocks of rows here) equals its one-row product in the
    AVX2 build, on 1 to 3 threads, in every build."""
    n, k = 45, 6144
    blocks = _weights(n, k, 11)
    x = torch.randn(100, k, generator=torch.Generator().manual_seed(8))
    x[:, 9] *= 20
    bias = torch.randn(n, generator=torch.Generator().manual_seed(4))
    one = torch.cat([kernels.matmul("BF16d", blocks, n, k, x[i: i + 1], bias, build="avx2")
                     for i in range(100)])
    assert np.array_equal(one.numpy(), _reference(blocks, x, bias))
    for build in _builds():
        for rows in (1, 2, 9, 10, 11, 100):
            for t in (1, 3):
                got = kernels.matmul("BF16d", blocks, n, k, x[:rows], bias, threads=t,
                                     build=build)
                assert torch.equal(got, one[:rows]), (build, rows, t)
            if rows == 100:  # and the row passes where a prompt chunk takes the tiles
                got = kernels.matmul("BF16d", blocks, n, k, x, bias, build=build,
                                     prompt_rows=kernels.ROW_BY_ROW)
                assert torch.equal(got, one), build


def test_denormals_infinities_and_overflow_give_the_same_bits_in_every_build():
    """Weights and activations at the edges (denormal bf16, products below 2^-126 and above
    the float32 range): vdpbf16ps takes denormal inputs as zero and flushes denormal sums;
    the other builds do the same by fma under DAZ / FTZ, so every build has the same bits."""
    rng = np.random.default_rng(5)
    n, k, m = 24, 256, 12
    # weights: mostly normal, some denormal or tiny; rows 0-3 also huge ones; rows 4-7 all
    # small (products with the small activation rows cross 2^-126), row 8 smaller still
    exps = rng.choice(np.r_[0:40, 100:150, 100:150, 100:150], size=(n, k))
    exps[:4] = rng.choice(np.r_[0:40, 100:150, 200:255], size=(4, k))
    exps[4:8] = rng.integers(40, 70, size=(4, k))
    exps[8] = rng.integers(40, 50, size=k)  # against those: every product below 2^-126
    words = (rng.integers(0, 1 << 16, (n, k)) & 0x807F) | (exps << 7)
    blocks = words.astype(np.uint16).view(np.uint8).reshape(n, 2 * k)
    xe = rng.choice(np.r_[0:40, 110:140, 110:140], size=(m, k))
    xe[:3] = rng.integers(40, 70, size=(3, k))
    xw = (rng.integers(0, 1 << 31, (m, k)) & 0x807FFFFF) | (xe << 23)
    x = torch.from_numpy(xw.astype(np.uint32).view(np.float32))
    ys = {b: kernels.matmul("BF16d", blocks, n, k, x, threads=2, build=b) for b in _builds()}
    base = ys["avx2"]
    assert torch.isfinite(base[:, 4:]).all() and not torch.isfinite(base[:, :4]).all()
    assert (base[:3, 4:8] != 0).all() and (base[:3, 8] == 0).all()  # flushed, not summed
    for b, y in ys.items():
        same = (y.view(torch.int32) == base.view(torch.int32)) | (y.isnan() & base.isnan())
        assert bool(same.all()), b
