"""Speculative statistics for one generation (and summed over many, for /metrics)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class SpecStats:
    """drafts: iterations with a non-empty draft; drafted / accepted: tokens.

    accepted_per_pos[i] counts drafts whose token at position i was accepted, and
    drafted_per_pos[i] drafts that had a token at position i, so their ratio is the acceptance
    rate by position. Mean acceptance length = 1 + accepted / drafts: the tokens one
    speculative iteration yields on average (the target's own token included).
    """

    n_drafts: int = 0
    n_drafted: int = 0
    n_accepted: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)
    drafted_per_pos: list[int] = field(default_factory=list)
    n_forced: int = 0  # drafted tokens that a grammar forced (the grammar's draft)
    t_draft: float = 0.0  # seconds
    t_verify: float = 0.0

    def record(self, k: int, n_accepted: int) -> None:
        self.n_drafts += 1
        self.n_drafted += k
        self.n_accepted += n_accepted
        for counts, n in ((self.drafted_per_pos, k), (self.accepted_per_pos, n_accepted)):
            if len(counts) < n:
                counts.extend([0] * (n - len(counts)))
            for i in range(n):
                counts[i] += 1

    @property
    def acceptance_rate(self) -> float:
        return self.n_accepted / self.n_drafted if self.n_drafted else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        return 1.0 + self.n_accepted / self.n_drafts if self.n_drafts else 1.0

    def as_dict(self) -> dict:
        return {
            "n_drafts": self.n_drafts,
            "n_drafted": self.n_drafted,
            "n_accepted": self.n_accepted,
            "acceptance_rate": round(self.acceptance_rate, 4),
            "mean_acceptance_length": round(self.mean_acceptance_length, 4),
            "accepted_per_pos": list(self.accepted_per_pos),
            "drafted_per_pos": list(self.drafted_per_pos),
            "n_forced": self.n_forced,
            "t_draft_ms": round(1e3 * self.t_draft, 3),
            "t_verify_ms": round(1e3 * self.t_verify, 3),
        }

    def summary(self) -> str:
        return (f"speculative: {self.n_drafts} drafts, {self.n_accepted}/{self.n_drafted} drafted "
                f"tokens accepted ({100 * self.acceptance_rate:.1f}%), mean acceptance length "
                f"{self.mean_acceptance_length:.2f}, drafting {1e3 * self.t_draft:.0f} ms, "
                f"verifying {1e3 * self.t_verify:.0f} ms")
