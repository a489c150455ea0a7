"""GET /metrics: llama-server's Prometheus metrics under a `tandem:` prefix, plus vLLM-style
speculative decoding counters.

    tandem:prompt_tokens_total                 prompt tokens processed (a reused prefix is not)
    tandem:prompt_seconds_total                time spent on them
    tandem:tokens_predicted_total              tokens generated
    tandem:tokens_predicted_seconds_total      time spent generating
    tandem:n_decode_total                      target forward passes: one per prompt, one per step
    tandem:n_busy_slots_per_decode             mean active slots per step (batching at work)
    tandem:requests_processing                 requests in a slot now
    tandem:requests_deferred                   requests waiting for a slot now
    tandem:spec_decode_num_drafts_total        steps that verified a non-empty draft
    tandem:spec_decode_num_draft_tokens_total  drafted tokens
    tandem:spec_decode_num_accepted_tokens_total
    tandem:spec_decode_num_accepted_tokens_per_pos_total{position="i"}

Counters move when a request finishes (its timings are final then), as in llama-server. The
metrics live in their own CollectorRegistry, so several servers in one process never collide.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

PREFIX = "tandem:"


class Metrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)

        def counter(name: str, doc: str, labels: tuple[str, ...] = ()) -> Counter:
            return Counter(PREFIX + name, doc, labels, registry=r)

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(PREFIX + name, doc, registry=r)

        self.prompt_tokens = counter("prompt_tokens", "Prompt tokens processed.")
        self.prompt_seconds = counter("prompt_seconds", "Prompt processing time.")
        self.tokens_predicted = counter("tokens_predicted", "Generated tokens.")
        self.tokens_predicted_seconds = counter("tokens_predicted_seconds", "Generation time.")
        self.n_decode = counter("n_decode", "Target forward passes (prompts and steps).")
        self.busy_slots_per_decode = gauge("n_busy_slots_per_decode",
                                           "Mean active slots per generation step.")
        self.requests_processing = gauge("requests_processing", "Requests in a slot.")
        self.requests_deferred = gauge("requests_deferred", "Requests waiting for a slot.")
        self.drafts = counter("spec_decode_num_drafts", "Steps that verified a draft.")
        self.draft_tokens = counter("spec_decode_num_draft_tokens", "Drafted tokens.")
        self.accepted_tokens = counter("spec_decode_num_accepted_tokens", "Accepted drafts.")
        self.accepted_per_pos = counter("spec_decode_num_accepted_tokens_per_pos",
                                        "Accepted drafted tokens by position in the draft.",
                                        ("position",))
        self._steps = 0
        self._busy = 0

    def step(self, n_active: int) -> None:
        self.n_decode.inc()
        self._steps += 1
        self._busy += n_active
        self.busy_slots_per_decode.set(self._busy / self._steps)

    def prompt(self) -> None:
        self.n_decode.inc()

    def queue(self, processing: int, deferred: int) -> None:
        self.requests_processing.set(processing)
        self.requests_deferred.set(deferred)

    def finished(self, seq) -> None:
        """Add a finished tandem.engine.Sequence's timings and speculative statistics."""
        t = seq.timings()
        self.prompt_tokens.inc(t["prompt_n"])
        self.prompt_seconds.inc(t["prompt_ms"] / 1e3)
        self.tokens_predicted.inc(t["predicted_n"])
        self.tokens_predicted_seconds.inc(t["predicted_ms"] / 1e3)
        s = seq.stats
        self.drafts.inc(s.n_drafts)
        self.draft_tokens.inc(s.n_drafted)
        self.accepted_tokens.inc(s.n_accepted)
        for pos, n in enumerate(s.accepted_per_pos):
            self.accepted_per_pos.labels(position=str(pos)).inc(n)

    def render(self) -> bytes:
        return generate_latest(self.registry)
