"""One config dataclass per concern; defaults are defined here once.

The command line (cli.py) and the HTTP server build these; nothing else reads flags.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .errors import TandemError

SPEC_TYPES = ("none", "ngram-simple", "draft-simple", "auto")


@dataclass(slots=True)
class SamplingParams:
    """Per-request sampling, with llama.cpp's defaults and meaning.

    temperature <= 0 means greedy (argmax). top_k <= 0, top_p >= 1 and min_p <= 0 disable
    those filters. seed < 0 picks a random seed. n_predict < 0 means "until EOS or the context
    is full".
    """

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    seed: int = -1
    n_predict: int = -1
    stop: list[str] = field(default_factory=list)
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.temperature, (int, float)) or self.temperature != self.temperature:
            raise TandemError(f"temperature must be a number, got {self.temperature!r}")
        if not isinstance(self.top_k, int) or isinstance(self.top_k, bool):
            raise TandemError(f"top_k must be an integer, got {self.top_k!r}")
        if not isinstance(self.top_p, (int, float)) or not 0.0 <= self.top_p <= 1.0:
            raise TandemError(f"top_p must be between 0 and 1, got {self.top_p!r}")
        if not isinstance(self.min_p, (int, float)) or not 0.0 <= self.min_p <= 1.0:
            raise TandemError(f"min_p must be between 0 and 1, got {self.min_p!r}")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            raise TandemError(f"seed must be an integer, got {self.seed!r}")
        if not isinstance(self.n_predict, int) or isinstance(self.n_predict, bool):
            raise TandemError(f"n_predict must be an integer, got {self.n_predict!r}")
        if self.temperature < 0:
            self.temperature = 0.0

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0 or self.top_k == 1


@dataclass(slots=True)
class SpecConfig:
    """Speculative decoding settings (llama-server's --spec-* flags).

    types: proposers tried in order; the first non-empty draft wins. ["none"] = target alone.
    ["auto"] = n-gram then draft model, with k chosen per step by the controller (adaptive);
    whoever builds the config drops draft-simple when there is no draft model.
    n_max / n_min / p_min: draft-simple drafts at most n_max tokens, stops when the draft's top
    probability falls below p_min, and drops drafts shorter than n_min.
    draft_window: the draft model processes only the last draft_window tokens of the prompt
    (0 = all of it); what it then generates it keeps. Its prompt processing costs a third of
    the target's on this CPU and is paid before the first token; a shorter window trades some
    acceptance for that time (the n-gram proposer still sees the whole prompt).
    draft_vocab: the draft model proposes only among the first draft_vocab token ids plus every
    id of the prompt and output so far (0 = the whole vocabulary): its output projection is
    about a third of what a 0.5B draft reads per token (spec/draft.py Shortlist). With 32768
    the default pair drafted exactly the same tokens on the four benchmark tasks, and a draft
    step took 20.0-20.6 ms instead of 24.7-25.4 (bench/results/draft-options).
    ngram_min / ngram_max / ngram_m: ngram-simple matches suffixes of ngram_min..ngram_max
    tokens and proposes up to ngram_m tokens that followed the most recent earlier occurrence.
    """

    types: list[str] = field(default_factory=lambda: ["none"])
    n_max: int = 4
    n_min: int = 0
    p_min: float = 0.75
    draft_window: int = 0
    draft_vocab: int = 32768
    ngram_min: int = 2
    ngram_max: int = 4
    ngram_m: int = 8
    adaptive: bool = False  # choose k per step from measured costs (spec/controller.py)

    def __post_init__(self) -> None:
        if "auto" in self.types:  # n-gram, then the draft model, with the cost-aware controller
            self.types = ["ngram-simple", "draft-simple"]
            self.adaptive = True
        for t in self.types:
            if t not in SPEC_TYPES:
                raise TandemError(
                    f"unknown spec type {t!r}; supported: {', '.join(SPEC_TYPES)} "
                    "(comma-separated list allowed)"
                )
        if self.n_max < 0 or self.n_min < 0 or self.n_min > max(self.n_max, 0) and self.n_max > 0:
            raise TandemError(
                f"spec-draft-n-min ({self.n_min}) and -n-max ({self.n_max}) must be >= 0 "
                "with n-min <= n-max"
            )
        if not 0.0 <= self.p_min <= 1.0:
            raise TandemError(f"spec-draft-p-min must be between 0 and 1, got {self.p_min}")
        if self.draft_window < 0:
            raise TandemError(f"spec-draft-window must be >= 0 (0 = the whole prompt), "
                              f"got {self.draft_window}")
        if self.draft_vocab < 0:
            raise TandemError(f"spec-draft-vocab must be >= 0 (0 = the whole vocabulary), "
                              f"got {self.draft_vocab}")
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise TandemError(
                f"ngram sizes must satisfy 1 <= min ({self.ngram_min}) <= max ({self.ngram_max})"
            )
        if self.ngram_m < 1:
            raise TandemError(f"spec-ngram-m must be >= 1, got {self.ngram_m}")

    @property
    def enabled(self) -> bool:
        return any(t != "none" for t in self.types)

    @property
    def max_k(self) -> int:
        """The most tokens one iteration may draft (sizes the KV cache's spare room)."""
        k = 0
        if "draft-simple" in self.types:
            k = max(k, self.n_max)
        if "ngram-simple" in self.types:
            k = max(k, self.ngram_m)
        return k

    @property
    def spare_positions(self) -> int:
        """KV positions each slot keeps beyond the context for [last, *draft] (at least 16, so
        per-request overrides of n_max up to 16 fit)."""
        return max(self.max_k, 16)

    @staticmethod
    def parse_types(text: str) -> list[str]:
        types = [t.strip() for t in text.split(",") if t.strip()]
        if not types:
            raise TandemError(f"empty --spec-type {text!r}; supported: {', '.join(SPEC_TYPES)}")
        return types


@dataclass(slots=True)
class EngineConfig:
    """How the engine is laid out: context per slot, slots, threads, dtype and device."""

    ctx_size: int = 4096
    n_parallel: int = 1
    n_threads: int = 0  # 0 = torch's default
    dtype: str = "auto"  # auto | float32 | bfloat16
    device: str = "cpu"
    prefill_chunk: int = 512

    def __post_init__(self) -> None:
        if self.ctx_size < 16:
            raise TandemError(f"ctx-size must be >= 16, got {self.ctx_size}")
        if self.n_parallel < 1:
            raise TandemError(f"parallel must be >= 1, got {self.n_parallel}")
        if self.dtype not in ("auto", "float32", "bfloat16"):
            raise TandemError(f"dtype must be auto, float32 or bfloat16, got {self.dtype!r}")
        if self.prefill_chunk < 1:
            raise TandemError(f"prefill chunk must be >= 1, got {self.prefill_chunk}")
