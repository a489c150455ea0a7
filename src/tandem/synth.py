"""llama-server's synthetic acceptance (--spec-synth-len, --spec-synth-rates), for benchmarking
only: the rate at which each drafted position is accepted, whatever the target says. SpecConfig
resolves its flags here."""

from __future__ import annotations

import math

from .errors import TandemError


def floats(name: str, text: str) -> list[float]:
    try:
        return [float(v) for v in text.split(",")]
    except ValueError:
        raise TandemError(f"{name} must be comma-separated numbers, got {text!r}") from None


def rates_text(rates: list[float]) -> str:
    return ", ".join(f"{r:.6g}" for r in rates)


def synth_rates(length: float, rates: list[float] | None, n_max: int) -> list[float] | None:
    """--spec-synth-len / --spec-synth-rates as llama-server resolves them: the unconditional
    rate of acceptance at each of the n_max draft positions (None = off). A length L gives
    rates p, p^2, ..., p^n_max whose sum is L - 1, found by bisection."""
    if length == -1.0 and not rates:
        return None
    if length != -1.0 and rates:
        raise TandemError("spec-synth-len and spec-synth-rates are mutually exclusive")
    if n_max <= 0:
        raise TandemError("synthetic acceptance needs spec-draft-n-max >= 1")
    if rates:
        if len(rates) != n_max:
            raise TandemError(f"spec-synth-rates must have spec-draft-n-max = {n_max} values, "
                              f"got {len(rates)}")
        for i, r in enumerate(rates):
            if not (math.isfinite(r) and 0.0 <= r <= 1.0):
                raise TandemError(f"spec-synth-rates must be within [0, 1], got {r!r}")
            if i and r > rates[i - 1]:
                raise TandemError(f"spec-synth-rates must not increase: {rates_text(rates)}")
        return list(rates)
    if not (math.isfinite(length) and 1.0 <= length <= n_max + 1):
        raise TandemError(f"spec-synth-len must be within [1, {n_max + 1}] "
                          f"(spec-draft-n-max + 1), got {length!r}")
    p = 1.0 if length == n_max + 1 else 0.0
    if 1.0 < length < n_max + 1:
        lo, hi = 0.0, 1.0
        for _ in range(32):
            mid = 0.5 * (lo + hi)
            if sum(mid ** (j + 1) for j in range(n_max)) < length - 1.0:
                lo = mid
            else:
                hi = mid
        p = 0.5 * (lo + hi)
    return [p ** (j + 1) for j in range(n_max)]
