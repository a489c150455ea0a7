"""Linear layers, and how a pass picks its GEMM path: by arguments, no hidden state.

Decode and verification passes have a handful of rows: they are bound by reading the weights,
so weights stay compact (int4 groups, GGUF blocks or bf16) and go through the memory-light
kernels. A prefill chunk has hundreds of rows and is bound by arithmetic: on a CPU without
native bf16 (AVX2 here) a float32 GEMM is several times faster than a bf16 one and the int4
kernel re-dequantizes its weights for every 4 rows. So every linear's forward takes two
keywords, set by the decoder for the whole pass (decoder.StepContext):

    wide     a prefill chunk of at least WIDE_MIN_ROWS rows that computes no logits: compact
             weights are expanded to float32 for that one call and run one float32 GEMM.
             Only prefill uses it, so decode and verification numerics never depend on how
             many rows a pass carries.
    rowwise  every output row must be computed exactly as it would be alone (verification):
             PyTorch's bf16 GEMM and the int4 kernel already give each row the same bits
             whatever the number of rows; the float32 GEMM does not (its blocking changes
             with M), so float32 Dense layers go row by row.

`rows(idx)` gives a linear over some of the output rows (the draft's vocabulary shortlist).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

# Below this many rows expanding the weights costs more than it saves (on the 1.5B target,
# 2 threads, a 64-token chunk ran slower expanded and a 512-token chunk faster).
WIDE_MIN_ROWS = 128


class Dense(nn.Module):
    """y = x @ W.T + b with W held at the compute dtype (see the module docstring for wide and
    rowwise)."""

    def __init__(self, weight: Tensor, bias: Tensor | None = None) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)

    def forward(self, x: Tensor, wide: bool = False, rowwise: bool = False) -> Tensor:
        w, b = self.weight, self.bias
        if wide and w.dtype != torch.float32:
            y = F.linear(x.float(), w.float(), None if b is None else b.float())
            return y.to(x.dtype)
        x = x.to(w.dtype)
        if rowwise and w.dtype == torch.float32:
            rows = x.reshape(-1, x.shape[-1])
            if rows.shape[0] > 1:
                y = torch.cat([F.linear(rows[i: i + 1], w, b) for i in range(rows.shape[0])])
                return y.view(*x.shape[:-1], w.shape[0])
        return F.linear(x, w, b)

    def rows(self, idx: slice | list[int]) -> Dense:
        """The layer restricted to output rows idx (a slice is a view, a list a copy)."""
        return Dense(self.weight[idx], None if self.bias is None else self.bias[idx])
