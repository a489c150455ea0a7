"""Dequantization of GGUF tensors and the exact int4 repack for PyTorch's CPU kernel.

Error bounds used below (u = 2^-8, the unit roundoff of bf16 with its 8-bit significand; e = 2^-24,
float32's):
- the kernel's weights are w' = (q - 8) s + z from bf16 s, z, rounded in float32 (AVX-512: one
  fma; AVX2: fma(q, s, z - 8 s), two roundings, so up to 3 e (8 |s| + |z|) from our w'); x is bf16;
  products accumulate in float32 (K e sum|x||w'|) and the sum is rounded to bf16 once (u |x.w'|).
- rounding s and z to bf16 moves each weight by |w' - w| <= u (8 |s| + |z|) (+ e |z| from forming
  z in float32), so |y - x.w| <= the bound above + sum_k |x_k| u (8 |s| + |z|).
"""

from __future__ import annotations

import functools
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as QT
from gguf import quants as gguf_quants

from tandem.errors import ModelFileError, TandemError
from tandem.models.gguf_file import RawTensor
from tandem.models.linear import Dense
from tandem.models.quant import (
    GROUP_SIZE,
    QuantLinear,
    decode_4bit,
    dequantize,
    kernel_scales_and_zeros,
    kernel_weight,
    make_linear,
    pack_int4,
    unpack_int4_float,
)

U_BF16 = 2.0**-8
U_F32 = 2.0**-24


def _quantized(qtype: QT, rows: int = 80, cols: int = 256) -> tuple[RawTensor, np.ndarray]:
    values = np.random.default_rng(0).standard_normal((rows, cols)).astype(np.float32)
    data = gguf_quants.quantize(values, qtype)
    return RawTensor("blk.0.w.weight", qtype, (rows, cols), data), values


def _random_q4_k(rows: int, cols: int, seed: int = 0) -> RawTensor:
    """Q4_K blocks with random scale bytes and nibbles; only d and dmin are set to sane f16s."""
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, size=(rows * cols // 256, 144), dtype=np.uint8)
    blocks[:, 0:2] = rng.uniform(1e-4, 3e-3, (len(blocks), 1)).astype(np.float16).view(np.uint8)
    blocks[:, 2:4] = rng.uniform(1e-4, 3e-3, (len(blocks), 1)).astype(np.float16).view(np.uint8)
    return RawTensor("blk.0.ffn_up.weight", QT.Q4_K, (rows, cols), blocks.reshape(rows, -1))


def _check_int4(raw: RawTensor, x: torch.Tensor) -> None:
    """QuantLinear(x) against the kernel's own weights (tight) and the true weights (loose)."""
    blocks = decode_4bit(raw)
    w_true = dequantize(raw).double()  # (N, K)
    w_kernel = kernel_weight(blocks).double()
    sz = kernel_scales_and_zeros(blocks).double().transpose(0, 1).repeat_interleave(32, dim=1)
    span = 8 * sz[..., 0].abs() + sz[..., 1].abs()  # (N, K)
    shift = U_BF16 * span + U_F32 * sz[..., 1].abs()
    assert ((w_kernel - w_true).abs() <= shift).all()

    y = QuantLinear(pack_int4(raw))(x).double()  # (..., N)
    xd = x.to(torch.bfloat16).double()
    exact = xd @ w_kernel.T
    accum = raw.shape[1] * U_F32 * (xd.abs() @ w_kernel.abs().T) + xd.abs() @ (3 * U_F32 * span).T
    assert ((y - exact).abs() <= U_BF16 * exact.abs() + accum).all()
    loose = U_BF16 * exact.abs() + accum + xd.abs() @ shift.T
    assert ((y - xd @ w_true.T).abs() <= loose).all()
    # and the result is close in the sense a user cares about: ~1% of the output's scale
    rel = (y - xd @ w_true.T).norm() / (xd @ w_true.T).norm()
    assert rel < 1e-2


@pytest.mark.parametrize("qtype", [QT.Q8_0, QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.BF16])
def test_dequantize_equals_gguf_reference(qtype):
    raw, values = _quantized(qtype, rows=48)
    out = dequantize(raw)
    assert out.dtype == torch.float32 and out.shape == (48, 256)
    assert np.array_equal(out.numpy(), gguf_quants.dequantize(raw.data, qtype))
    # the values are the weights that were quantized, within one quantization step
    assert np.abs(out.numpy() - values).max() < 0.5


@pytest.mark.parametrize("qtype,np_dtype", [(QT.F32, np.float32), (QT.F16, np.float16)])
def test_float_tensors_are_read_exactly(qtype, np_dtype):
    values = np.random.default_rng(1).standard_normal((5, 7)).astype(np_dtype)
    out = dequantize(RawTensor("w", qtype, (5, 7), values))
    assert out.dtype == torch.float32
    assert np.array_equal(out.numpy(), values.astype(np.float32))
    norm_values = values[0].astype(np.float32)
    norm = dequantize(RawTensor("blk.0.attn_norm.weight", QT.F32, (7,), norm_values))
    assert norm.shape == (7,)


def test_unsupported_type_names_tensor_type_and_supported_types():
    raw = RawTensor("blk.3.attn_q.weight", QT.I32, (2, 2), np.zeros((2, 2), np.int32))
    with pytest.raises(ModelFileError) as e:
        dequantize(raw)
    msg = str(e.value)
    assert "blk.3.attn_q.weight" in msg and "I32" in msg and "Q4_K" in msg and "BF16" in msg


@pytest.mark.parametrize("qtype", [QT.Q4_0, QT.Q4_1])
def test_4bit_decoding_reproduces_gguf_bit_for_bit(qtype):
    raw, _ = _quantized(qtype)
    assert np.array_equal(decode_4bit(raw).weight(), gguf_quants.dequantize(raw.data, qtype))


def test_q4_k_decoding_reproduces_gguf_bit_for_bit():
    raw = _random_q4_k(32, 512)
    blocks = decode_4bit(raw)
    assert blocks.q.max() == 15 and blocks.q.min() == 0
    assert np.array_equal(blocks.weight(), gguf_quants.dequantize(raw.data, QT.Q4_K))


@pytest.mark.parametrize("qtype", [QT.Q4_0, QT.Q4_1])
@pytest.mark.parametrize("m", [1, 3, 5])
def test_int4_matmul_matches_dense(qtype, m):
    torch.manual_seed(0)
    raw, _ = _quantized(qtype)  # 80 rows: one full 64-row kernel block and a 16-row tail
    _check_int4(raw, torch.randn(m, 256))


def test_int4_matmul_q4_k_and_batched_input():
    torch.manual_seed(0)
    raw = _random_q4_k(96, 512)
    _check_int4(raw, torch.randn(2, 3, 512))


def test_quant_linear_keeps_input_dtype_and_adds_bias():
    torch.manual_seed(0)
    raw, _ = _quantized(QT.Q4_0, rows=32, cols=64)
    bias = RawTensor("blk.0.attn_q.bias", QT.F32, (32,), np.linspace(-3, 3, 32, dtype=np.float32))
    layer = make_linear(raw, torch.bfloat16, "int4", bias=bias)
    assert isinstance(layer, QuantLinear)
    x = torch.randn(4, 64)
    y32, y16 = layer(x), layer(x.bfloat16())
    assert y32.dtype == torch.float32 and y16.dtype == torch.bfloat16
    without = QuantLinear(pack_int4(raw))(x)
    bias_bf16 = dequantize(bias).bfloat16().float()  # held in the layer's dtype, like nn.Linear's
    assert torch.allclose(y32 - without, bias_bf16.expand(4, -1), atol=1e-5)


def test_chunked_packing_gives_the_same_bytes():
    raw, _ = _quantized(QT.Q4_1, rows=208, cols=64)  # 3 chunks of 64 + a 16-row tail
    whole, chunked = pack_int4(raw), pack_int4(raw, chunk_rows=64)
    assert torch.equal(whole.packed, chunked.packed)
    assert torch.equal(whole.scales_and_zeros, chunked.scales_and_zeros)


def test_make_linear_modes_and_fallbacks():
    torch.manual_seed(0)
    x = torch.randn(2, 64)
    q8, _ = _quantized(QT.Q8_0, rows=32, cols=64)
    q4, _ = _quantized(QT.Q4_0, rows=32, cols=64)
    odd, _ = _quantized(QT.Q4_0, rows=40, cols=64)  # 40 % 16 != 0: the kernel cannot take it
    assert pack_int4(q8) is None and pack_int4(odd) is None
    for raw, mode in [(q8, "int4"), (odd, "int4"), (q4, "dense")]:
        layer = make_linear(raw, torch.float32, mode)
        assert isinstance(layer, Dense) and layer.weight.dtype == torch.float32
        assert torch.equal(layer(x), torch.nn.functional.linear(x, dequantize(raw)))
    assert make_linear(q8, torch.bfloat16, "dense").weight.dtype == torch.bfloat16
    with pytest.raises(TandemError, match="'int8'.*int4, dense"):
        make_linear(q4, torch.bfloat16, "int8")


@pytest.mark.parametrize("qtype", [QT.Q4_0, QT.Q4_1])
def test_wide_gemm_uses_the_kernels_own_weights(qtype):
    """Prefill's float32 path expands the packed int4 weight to exactly the values the int4
    kernel uses (up to one float32 rounding), and a bf16 Dense weight to its float32 value."""
    torch.manual_seed(1)
    # 80 rows: the packed layout's row blocks (32 on AVX2, 64 on AVX-512) and a last part of
    # 16 rows packed another way; 4 groups per row
    raw, _ = _quantized(qtype, rows=80, cols=128)
    packed = pack_int4(raw)
    want = kernel_weight(decode_4bit(raw))
    got = unpack_int4_float(packed.packed, packed.scales_and_zeros, GROUP_SIZE)
    assert torch.allclose(got, want, rtol=2**-22, atol=1e-7)
    layer = QuantLinear(packed)
    x = torch.randn(5, 128).bfloat16()
    y = layer(x, wide=True)
    ref = (x.float() @ want.T).bfloat16()
    assert (y.float() - ref.float()).abs().max() <= 2**-7 * ref.float().abs().max()
    dense = make_linear(raw, torch.bfloat16, "dense")
    yd = dense(x, wide=True)
    assert torch.allclose(yd.float(), (x.float() @ dense.weight.float().T).bfloat16().float())


# ---- real model files -------------------------------------------------------------------------


@functools.cache
def _model(name: str):
    from tandem.models.gguf_file import GGUFFile
    from tandem.registry import pull

    return GGUFFile(pull(name))  # opened once per file for all tests


def _rows(model: str, name: str, n: int) -> RawTensor:
    t = _model(model).tensors[name]
    return RawTensor(t.name, t.qtype, (n, t.shape[1]), t.data[:n])


@pytest.mark.real
def test_real_k_quants_and_q4_k_repack():
    q4k = _rows("default", "blk.0.ffn_gate.weight", 128)
    q6k = _rows("default", "output.weight", 16)
    assert q4k.qtype == QT.Q4_K and q6k.qtype == QT.Q6_K
    for raw in (q4k, q6k):
        out = dequantize(raw).numpy()
        assert np.array_equal(out, gguf_quants.dequantize(raw.data, raw.qtype))
        assert np.isfinite(out).all() and 1e-3 < np.abs(out).mean() < 1
    assert np.array_equal(decode_4bit(q4k).weight(), dequantize(q4k).numpy())
    torch.manual_seed(0)
    _check_int4(q4k, torch.randn(4, q4k.shape[1]))


@pytest.mark.real
def test_real_draft_types_dequantize():
    for name, qtype in [("blk.0.attn_q.weight", QT.Q5_0), ("blk.2.ffn_down.weight", QT.Q4_K),
                        ("blk.1.ffn_down.weight", QT.Q6_K), ("output.weight", QT.Q8_0)]:
        raw = _rows("default-draft", name, 16)
        assert raw.qtype == qtype, name
        out = dequantize(raw).numpy()
        assert out.shape == raw.shape
        assert np.array_equal(out, gguf_quants.dequantize(raw.data, qtype))


@pytest.mark.real
def test_real_q4_1_repack():
    raw = _rows("smollm2-135m", "blk.0.ffn_up.weight", 256)
    assert raw.qtype == QT.Q4_1
    torch.manual_seed(0)
    _check_int4(raw, torch.randn(3, raw.shape[1]))
