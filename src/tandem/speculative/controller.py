"""Choosing how many tokens to draft from measured costs and measured acceptance.

Speculation pays only when an iteration costs less than the tokens it yields would cost one at
a time:  speed-up(k) = E[tokens | k] x t_plain / (k x t_draft + t_verify(k + 1)).

Worked example: a plain step takes 170 ms, verifying 5 rows 400 ms, a draft token 60 ms, and
the draft's tokens are accepted with probability 0.8 each (given the ones before were):
E[tokens | 4] = 1 + .8 + .64 + .512 + .41 = 3.36 tokens for 4 x 60 + 400 = 640 ms, i.e.
5.25 tok/s against 5.88 tok/s plain: k = 4 loses (k = 1 still wins: 1.8 tokens for
60 + 210 ms, verifying 2 rows interpolated between 1 and 3). With an n-gram draft (t_draft ~ 0) and
k = 2: 1 + .8 + .64 = 2.44 tokens in t_verify(3) = 250 ms = 9.8 tok/s: k = 2 wins. The
controller evaluates every k from 0 (no speculation) to n_max and keeps the best.
"""

from __future__ import annotations

from dataclasses import dataclass, field


PREFILL_MEASURE_MIN = 16  # draft reads averaged into the per-token cost (CostModel)


@dataclass(slots=True)
class CostModel:
    """Seconds per target pass by number of rows, and per draft token; running averages.

    A pass is measured only at the row count a step used, but this shared machine speeds up
    and slows down for all row counts at once. So a measurement moves every row count's cost
    by the same factor (the machine's drift) and its own row count a little more (its shape):
    otherwise costs calibrated in a slow spell would stay stale for the row counts the
    controller stopped using, and lock it into a short k."""

    verify: dict[int, float] = field(default_factory=dict)  # rows -> seconds
    draft_token: float | None = None
    # one draft pass of one row (the engine's calibration, then the passes of draft calls):
    # what a draft token costs at least, and what drafting one more costs (Controller.extend)
    draft_step: float | None = None
    draft_prefill_token: float | None = None  # the draft reading prompt tokens, per token
    prompt_token: float | None = None  # the target reading a prompt chunk, per row
    alpha: float = 0.2  # weight of a new measurement
    _pending: float = 0.0  # seconds of draft calls that gave no token yet to verify

    def _mix(self, old: float | None, new: float) -> float:
        return new if old is None else (1 - self.alpha) * old + self.alpha * new

    def record_verify(self, rows: int, seconds: float) -> None:
        old = self.verify.get(rows)
        if old is None or old <= 0:
            self.verify[rows] = seconds
            return
        drift = 1 + self.alpha / 2 * (seconds / old - 1)  # half the step for every row count
        for r in self.verify:
            self.verify[r] *= drift
        self.verify[rows] = self._mix(old, seconds)  # the full step for the one measured

    def record_draft(self, tokens: int, seconds: float, passes: int = 0) -> None:
        """A draft call of `seconds` that gave `tokens` tokens to verify. A call that gave
        none (the draft model below p-min at its first token, or a draft cut to nothing) still
        cost its passes: that time is carried into the next call that gives tokens, so the
        cost per token is per token verified, what the controller's k pays for. passes: the
        draft model's passes in the call (one per token drafted, before any cut): they move
        `draft_step`, so that what one more pass costs follows the machine's speed."""
        if passes > 0:
            self.draft_step = self._mix(self.draft_step, seconds / passes)
        self._pending += seconds
        if tokens > 0:
            self.draft_token = self._mix(self.draft_token, self._pending / tokens)
            self._pending = 0.0

    def record_prompt(self, rows: int, seconds: float) -> None:
        if rows > 0:
            self.prompt_token = self._mix(self.prompt_token, seconds / rows)

    def record_draft_prefill(self, tokens: int, seconds: float) -> None:
        """The draft model read `tokens` tokens (a prompt, or the output it skipped) in
        `seconds`. A pass streams the draft's weights once however few rows it has, so a
        catch-up of a few tokens costs about a draft step and says nothing of the cost per
        token of a long one: only reads of PREFILL_MEASURE_MIN tokens or more are averaged
        (`draft_prefill` prices the short ones)."""
        if tokens >= PREFILL_MEASURE_MIN:
            self.draft_prefill_token = self._mix(self.draft_prefill_token, seconds / tokens)

    def draft_prefill(self, tokens: int) -> float | None:
        """Seconds for the draft model to read `tokens` tokens: per token at the measured rate,
        and never less than one draft step (a pass over its weights). None: unmeasured."""
        if self.draft_prefill_token is None:
            return None
        return max(tokens * self.draft_prefill_token, self.draft_step or self.draft_token or 0.0)

    def verify_time(self, rows: int) -> float | None:
        """Measured, or interpolated linearly between the nearest measured row counts."""
        if rows in self.verify:
            return self.verify[rows]
        known = sorted(self.verify)
        lo = [r for r in known if r < rows]
        hi = [r for r in known if r > rows]
        if lo and hi:
            a, b = lo[-1], hi[0]
            w = (rows - a) / (b - a)
            return (1 - w) * self.verify[a] + w * self.verify[b]
        if len(lo) >= 2:  # extrapolate from the last two
            a, b = lo[-2], lo[-1]
            return self.verify[b] + (rows - b) * (self.verify[b] - self.verify[a]) / (b - a)
        return None


@dataclass(slots=True)
class AcceptanceTracker:
    """Per draft position j: how often token j was accepted when it was reached.

    A draft of k tokens with n accepted reached positions 0..min(n, k-1) and accepted 0..n-1.
    The estimate starts from a Beta(prior_hits, prior_misses) prior so that a few draws do not
    swing it to 0 or 1; see rates() for positions beyond the first.
    """

    prior_hits: float = 2.0
    prior_misses: float = 1.0
    reached: list[int] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)
    # what every request of this proposer showed: one request's estimate of position j starts
    # from it (with the prior's weight) and its own drafts move it; its updates go there too
    parent: AcceptanceTracker | None = None

    def update(self, k: int, n_accepted: int) -> None:
        if self.parent is not None:
            self.parent.update(k, n_accepted)
        last = min(n_accepted, k - 1)
        while len(self.reached) <= last:
            self.reached.append(0)
            self.accepted.append(0)
        for j in range(last + 1):
            self.reached[j] += 1
            self.accepted[j] += j < n_accepted

    def rates(self, n: int, z: float = 0.0) -> list[float]:
        """Posterior means of positions 0..n-1. Position 0's prior is Beta(prior_hits,
        prior_misses); position j's prior has the same weight around position j - 1's
        estimate, so a position never reached yet is expected to do as well as the one before
        it (a controller that kept k short must still see what a longer k would give). With a
        parent, each position's prior (same weight) is centred on the parent's estimate.
        z > 0: each mean plus z posterior standard deviations (at most 1), an optimistic
        estimate that is near the mean once a position was reached often."""
        weight = self.prior_hits + self.prior_misses
        p = self.prior_hits / weight if weight > 0 else 1.0
        centres = self.parent.rates(n) if self.parent is not None else None
        out = []
        for i in range(n):
            r = self.reached[i] if i < len(self.reached) else 0
            a = self.accepted[i] if i < len(self.accepted) else 0
            if centres is not None:  # around what every request showed at this position
                p = centres[i]
            if r + weight > 0:
                p = (a + weight * p) / (r + weight)
            out.append(p if z <= 0 else min(1.0, p + z * (p * (1 - p) / (r + weight + 1)) ** 0.5))
        return out

    def rate(self, j: int) -> float:
        return self.rates(j + 1)[j]

    def expected_tokens(self, k: int, z: float = 0.0) -> float:
        """1 (the target's own token) + sum over i of P(first i draft tokens accepted);
        z: with `rates`' optimistic estimates."""
        total, p = 1.0, 1.0
        for r in self.rates(k, z):
            p *= r
            total += p
        return total


@dataclass(slots=True)
class Calibration:
    """P(a drafted token is accepted | it was reached, its proposer's confidence), in `bins`
    equal bins of confidence, learned in two levels. First one factor for every bin: accepted
    tokens over the sum of their confidences (`scale`, from a prior of weight `weight` at 1),
    so a proposer that is overconfident everywhere is corrected everywhere after a few drafts,
    not bin by bin. Then each bin from a prior of weight `weight` centred on the confidence
    times that factor, corrected by what the target accepted in that bin. Only reached tokens
    count: the first rejected one, and those before it."""

    bins: int = 10
    weight: float = 2.0
    reached: list[int] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)
    conf_sum: float = 0.0  # the base estimates of every reached token (see `base`)
    hits: int = 0  # how many of them were accepted
    # what every request of this proposer showed (a Calibration without parent). One
    # request's calibration starts from it and corrects it by the request's own tokens, in the
    # same two levels: texts differ (a summary copies its source, a story does not), and the
    # same confidence is worth less in a request whose drafts keep failing
    parent: Calibration | None = None
    # without a parent: another calibration whose estimate this one starts from, not teaching
    # it (the suffix pool's drafts start from what the requests' own drafts showed at the same
    # confidence: a match in another request's output says no more than one in its own text)
    prior: Calibration | None = None

    def __post_init__(self) -> None:
        self.reached = self.reached or [0] * self.bins
        self.accepted = self.accepted or [0] * self.bins

    def bin(self, conf: float) -> int:
        return min(self.bins - 1, max(0, int(conf * self.bins)))

    def base(self, conf: float) -> float:
        """The estimate before this calibration's own measurements: the parent's calibrated
        probability for the confidence, else the prior's (at most the confidence), else the
        confidence itself."""
        if self.parent is not None:
            return self.parent.p(conf)
        if self.prior is not None:
            return min(conf, self.prior.p(conf))
        return conf

    @property
    def scale(self) -> float:
        """Accepted tokens per unit of base estimate, over every bin."""
        return (self.hits + self.weight) / (self.conf_sum + self.weight)

    def p(self, conf: float) -> float:
        b = self.bin(conf)
        prior = min(1.0, self.base(conf) * self.scale)
        return (self.accepted[b] + self.weight * prior) / (self.reached[b] + self.weight)

    def seen(self, conf: float) -> int:
        """How many reached tokens this confidence's bin has counted (over every request)."""
        if self.parent is not None:
            return self.parent.seen(conf)
        return self.reached[self.bin(conf)]

    def update(self, conf: list[float], n_accepted: int) -> None:
        reached = conf[:n_accepted + 1]
        base = [self.base(c) for c in reached]  # before the parent learns from them
        if self.parent is not None:
            self.parent.update(conf, n_accepted)
        for j, (c, e) in enumerate(zip(reached, base)):
            b = self.bin(c)
            self.reached[b] += 1
            self.accepted[b] += j < n_accepted
            self.conf_sum += e
            self.hits += j < n_accepted


@dataclass(slots=True)
class Controller:
    """Picks k in 0..n_max for one sequence; k = 0 turns speculation off for that step.

    Every `probe_every` steps spent at k = 0 it tries the best k > 0 once, so that a change in
    the text (a stretch the draft predicts well) is noticed; likewise, every `probe_every`
    steps spent speculating it tries one token more than the best k, so that the cost and the
    acceptance of longer drafts keep being measured rather than remembered. It speculates only when the best
    k is predicted to beat plain decoding by `margin` (5%): costs are measured on a shared,
    noisy machine, and near break-even a wrong guess can only lose.
    """

    costs: CostModel
    n_max: int
    acceptance: AcceptanceTracker = field(default_factory=AcceptanceTracker)
    calibration: Calibration = field(default_factory=Calibration)
    probe_every: int = 16
    margin: float = 0.05
    # > 0: `rate` takes the acceptance this many standard deviations above its estimate
    optimism: float = 0.0
    _idle: int = 0
    _busy: int = 0

    def rate(self, k: int, draft_token: float, rows: int = 0, tokens: int = 0) -> float | None:
        """Tokens per second of a pass where this sequence verifies k drafted tokens and the
        rest of the pass has `rows` rows that yield `tokens` tokens."""
        t = self.costs.verify_time(rows + k + 1)
        if t is None:
            return None
        return (tokens + self.acceptance.expected_tokens(k, self.optimism)) \
            / (k * draft_token + t)

    def choose(self, draft_token: float | None = None, rows: int = 0, tokens: int = 0) -> int:
        """draft_token: seconds per drafted token (0 for n-gram); None = the measured one.
        rows, tokens: the rest of the pass (other sequences, prompt chunks; see `cut`)."""
        d = self.costs.draft_token if draft_token is None else draft_token
        d = d or 0.0
        plain = self.rate(0, d, rows, tokens)
        if plain is None:
            return self.n_max  # nothing measured yet: speculate, and measure
        rates = [(self.rate(k, d, rows, tokens) or 0.0, k) for k in range(1, self.n_max + 1)]
        best_rate, best_k = max(rates, default=(0.0, 0))
        if best_rate > plain * (1 + self.margin):
            self._idle = 0
            self._busy += 1
            if self._busy >= self.probe_every and best_k < self.n_max:
                self._busy = 0
                return best_k + 1
            return best_k
        self._idle += 1
        if self._idle >= self.probe_every:
            self._idle = 0
            return best_k
        return 0

    def cut(self, conf: list[float], rows: int = 0, tokens: int = 0) -> int:
        """How many tokens of a draft already made to verify, from their confidences: the k
        maximizing E[tokens | k] / t_verify(k + 1), each token's acceptance the calibrated
        probability of its confidence (given the tokens before it were accepted). Drafting
        cost is spent already, so only verification counts. 0 when the best k is not
        predicted to beat plain decoding by `margin`; then, every `probe_every` such steps, 1
        if the first token's confidence bin is still unmeasured (fewer than 8 tokens): a probe
        costs one row and is made only where it can still change the calibration.

        In a pass shared with other sequences or prompt chunks (`rows` other rows, yielding
        `tokens` tokens for the other sequences) the rate is the whole pass's:
        (tokens + E[tokens | k]) / t_verify(rows + k + 1). A drafted row then pays when its
        chance of acceptance beats what a row of this pass yields on average: next to a prompt
        chunk (rows that yield nothing) drafts are cheap; in a pass of many generating
        sequences that is already compute-bound each row costs about what it yields and k
        falls to 0."""
        k, gain = self.gain(conf, rows, tokens)
        return self.decide(k, gain, conf)

    def gain(self, conf: list[float], rows: int = 0, tokens: int = 0) -> tuple[int, float]:
        """The k `cut` would take before its margin, and that k's predicted rate over plain
        decoding (1.0: no better; inf: nothing measured yet, verify all of it). Pure: two
        drafts can be weighed (`Speculator`) before one is chosen."""
        t1 = self.costs.verify_time(rows + 1)
        if t1 is None or not conf:
            return len(conf), float("inf")  # nothing measured yet: verify it, and measure
        plain = (tokens + 1.0) / t1
        best_rate, best_k = 0.0, 0
        expected, p = tokens + 1.0, 1.0
        for k, c in enumerate(conf[: self.n_max], start=1):
            p *= self.calibration.p(c)
            expected += p
            t = self.costs.verify_time(rows + k + 1)
            if t is None:
                break
            if expected / t > best_rate:
                best_rate, best_k = expected / t, k
        return best_k, best_rate / plain

    def decide(self, k: int, gain: float, conf: list[float]) -> int:
        """`cut`'s answer from `gain`'s: k when it beats plain decoding by the margin, else 0
        or, every `probe_every` such steps, a 1-token probe of an unmeasured bin."""
        if gain > 1 + self.margin:
            self._idle = 0
            return k
        self._idle += 1
        if conf and self._idle >= self.probe_every and self.calibration.seen(conf[0]) < 8:
            self._idle = 0
            return 1
        return 0

    def extend(self, conf: list[float], rows: int = 0, tokens: int = 0) -> bool:
        """Whether a draft model that has drafted tokens with confidences `conf` should pay
        one more pass to draft on. The objective is `rate`'s, the tokens per second of this
        step: E[tokens] over the draft's passes (one per token drafted, at the calibrated
        `draft_step`) plus the verification. The drafted tokens count at their calibrated
        probabilities; the tokens not drafted yet are each expected as likely as the last one
        (a draft is sure, or unsure, over stretches). It drafts on when some continuation of
        up to n_max tokens is predicted to raise that rate.

        This replaces a fixed floor on the draft's probability (llama.cpp's p_min, which
        auto used at 0.75): the pass that gives a token's probability is paid before the
        token is seen, so a floor at the first token throws a paid pass away, and those calls
        priced the draft model out (its cost per token verified, `record_draft`, counts
        them); and whether one more token pays depends on what a pass costs against what a
        token is worth, not on one probability. Unmeasured costs: yes (measure them)."""
        step = self.costs.draft_step or self.costs.draft_token
        k = len(conf)
        if step is None or k >= self.n_max:
            return step is None and k < self.n_max
        expected, p = tokens + 1.0, 1.0
        for c in conf:
            p *= self.calibration.p(c)
            expected += p
        t = self.costs.verify_time(rows + k + 1)
        if t is None:
            return True
        now = expected / (k * step + t)
        q = self.calibration.p(conf[-1])
        for m in range(1, self.n_max - k + 1):
            p *= q
            expected += p
            t = self.costs.verify_time(rows + k + m + 1)
            if t is None:
                return True
            if expected / ((k + m) * step + t) > now:
                return True
        return False

    def update(self, k: int, n_accepted: int, conf: list[float] | None = None) -> None:
        if k > 0:
            self.acceptance.update(k, n_accepted)
            if conf:
                self.calibration.update(conf[:k], n_accepted)
