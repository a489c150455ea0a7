"""The native kernels (tandem/kernels/qmatmul.c) against the gguf package and float64 math.

matmul's error model: weights exact; each activation x is rounded to the int16 grid of its
block (s = max|x| / 16383 over 256 values for the K-quants, 32 for the others), so
|x - x~| <= s / 2; the integer sums are exact and the float32 steps after them add a relative
error far below that. Hence |y - x.w| <= sum_k |w_k| s_k / 2 (1 + 1e-3) + 1e-5 sum_k |w_k x_k|.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as QT
from gguf import quants as gguf_quants

from tandem import kernels
from tandem.models.gguf_file import RawTensor
from tandem.models.linear import wide_gemm
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
def test_dequantize_equals_gguf_bit_for_bit(qtype):
    raw = _tensor(qtype, 24, 512)
    ours = kernels.dequantize(qtype.name, raw.data, 24, 512)
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
    full = kernels.matmul(qtype.name, raw.data, n, k, x, bits=bits)
    threads = torch.get_num_threads()
    try:
        for t in (1, 2):
            torch.set_num_threads(t)
            for i in range(13):
                one = kernels.matmul(qtype.name, raw.data, n, k, x[i: i + 1], bits=bits)
                assert torch.equal(one[0], full[i])
            assert torch.equal(kernels.matmul(qtype.name, raw.data, n, k, x[2:7], bits=bits),
                               full[2:7])
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("qtype", K_QUANTS)
def test_prompt_path_rows_equal_one_row_products_bit_for_bit(qtype):
    """From 16 rows the K-quants take the prompt path (weights unpacked once per block of rows,
    a 4 x 2 micro-kernel). Its rows must be the 1-row products exactly, or a prompt would fill
    the cache with other values than decoding the same tokens. 37 rows (an odd last row), 42
    weight rows (a partial group of 4 in each thread's share), K = 2304 (two unpacked chunks),
    a bias, one and two threads; and still within the rounding bound of the exact product."""
    n, k, m = 42, 2304, 37
    raw = _tensor(qtype, n, k, seed=5)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(1))
    x[:, 7] *= 40
    bias = torch.randn(n, generator=torch.Generator().manual_seed(2))
    threads = torch.get_num_threads()
    try:
        for t in (1, 2):
            torch.set_num_threads(t)
            full = kernels.matmul(qtype.name, raw.data, n, k, x, bias=bias)
            for i in range(m):
                one = kernels.matmul(qtype.name, raw.data, n, k, x[i: i + 1], bias=bias)
                assert torch.equal(one[0], full[i]), (t, i)
            was = kernels.set_prompt_rows(1 << 62)  # the row-by-row kernel for all 37 rows
            try:
                rowwise = kernels.matmul(qtype.name, raw.data, n, k, x, bias=bias)
            finally:
                kernels.set_prompt_rows(was)
            assert torch.equal(rowwise, full)
    finally:
        torch.set_num_threads(threads)
    w = torch.from_numpy(gguf_quants.dequantize(raw.data, qtype).reshape(n, k)).double()
    exact = x.double() @ w.T + bias.double()
    assert ((full.double() - exact).abs() <= _bound(x.double(), w, 256)).all()


def test_zero_and_tiny_activations():
    raw = _tensor(QT.Q4_K, 16, 256)
    assert torch.equal(kernels.matmul("Q4_K", raw.data, 16, 256, torch.zeros(2, 256)),
                       torch.zeros(2, 16))
    x = torch.full((1, 256), 1e-30)
    y = kernels.matmul("Q4_K", raw.data, 16, 256, x)
    w = torch.from_numpy(gguf_quants.dequantize(raw.data, QT.Q4_K)).double()
    assert torch.allclose(y.double(), x.double() @ w.T, rtol=1e-3, atol=0)


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
    with wide_gemm():  # prefill: float32 GEMM over the exact weights
        yw = lin(x)
    assert torch.allclose(yw, torch.nn.functional.linear(x, w, bias), rtol=1e-5, atol=1e-5)


def test_embedding_rows_and_make_linear_native_mode():
    raw = _tensor(QT.Q8_0, 50, 64)
    emb = GGUFEmbedding(raw)
    ids = torch.tensor([[3, 49, 0], [7, 7, 1]])
    full = torch.from_numpy(gguf_quants.dequantize(raw.data, QT.Q8_0))
    assert torch.equal(emb[ids], full[ids])
    assert isinstance(make_linear(raw, torch.float32, "native"), GGUFLinear)
    f32 = RawTensor("w", QT.F32, (4, 64), np.ones((4, 64), np.float32))
    assert not isinstance(make_linear(f32, torch.float32, "native"), GGUFLinear)  # stays dense


def test_kernels_can_be_switched_off_and_auto_falls_back():
    code = ("from tandem import kernels; from tandem.models.loader import resolve_mode;"
            "print(kernels.available(), kernels.unavailable_reason(), resolve_mode('auto'))")
    env = {"TANDEM_KERNELS": "0", "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.stdout.split() == ["False", "disabled", "by", "TANDEM_KERNELS=0", "int4"], out.stderr
