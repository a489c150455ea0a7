"""GET /metrics (with --metrics, as llama-server): its Prometheus text, series for series.

    llamacpp:prompt_tokens_total                 prompt tokens processed (a reused prefix is not)
    llamacpp:prompt_tokens_cached_total          prompt tokens reused (a slot's cache, --cache-ram's)
    llamacpp:prompt_seconds_total                time spent on prompts
    llamacpp:tokens_predicted_total              tokens generated
    llamacpp:tokens_predicted_seconds_total      time spent generating
    llamacpp:n_decode_total                      target forward passes
    llamacpp:n_tokens_max                        longest sequence seen (prompt + generation)
    llamacpp:spec_decode_num_drafts_total        steps that verified a non-empty draft
    llamacpp:spec_decode_num_draft_tokens_total  drafted tokens
    llamacpp:spec_decode_num_accepted_tokens_total
    llamacpp:prompt_tokens_seconds               prompt tokens/s (gauge, since the last scrape)
    llamacpp:predicted_tokens_seconds            generated tokens/s (gauge, since the last scrape)
    llamacpp:requests_processing                 requests in a slot now
    llamacpp:requests_deferred                   requests waiting for a slot now
    llamacpp:n_busy_slots_per_decode             mean active slots per pass (batching at work)
    llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="i"}

The text is written here, not by prometheus_client: llama-server names its counters with
`_total` in the TYPE line (and n_tokens_max without it), which prometheus_client's exposition
cannot; dashboards and llama.cpp's own tests read those names. tests/test_server.py parses it
with prometheus_client's parser. Counters move when a request finishes (its timings are final
then), as in llama-server. Each server owns its Metrics, so several in one process never mix.
"""

from __future__ import annotations

import threading
import time

PREFIX = "llamacpp:"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Metrics:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.t_start = int(time.time())
        self.prompt_tokens = self.prompt_cached = self.tokens_predicted = 0
        self.prompt_seconds = self.predicted_seconds = 0.0
        self.n_decode = self.n_busy = self.n_tokens_max = 0
        self.drafts = self.draft_tokens = self.accepted_tokens = 0
        self.accepted_per_pos: list[int] = []
        self.processing = self.deferred = 0
        # since the last scrape, for the throughput gauges (llama-server's buckets)
        self._bucket = [0, 0.0, 0, 0.0]  # prompt tokens, seconds, predicted tokens, seconds

    def step(self, n_active: int) -> None:
        with self._lock:
            self.n_decode += 1
            self.n_busy += n_active

    def prompt(self) -> None:
        with self._lock:
            self.n_decode += 1

    def embedded(self, n_tokens: int) -> None:
        """An embedding pass: its prompt tokens and one target pass; nothing predicted."""
        with self._lock:
            self.prompt_tokens += n_tokens
            self.n_decode += 1

    def queue(self, processing: int, deferred: int) -> None:
        self.processing, self.deferred = processing, deferred

    def finished(self, seq) -> None:
        """Add a finished tandem.engine.Sequence's timings and speculative statistics."""
        t, s = seq.timings(), seq.stats
        with self._lock:
            self.prompt_tokens += t["prompt_n"]
            self.prompt_cached += t["cache_n"]
            self.prompt_seconds += t["prompt_ms"] / 1e3
            self.tokens_predicted += t["predicted_n"]
            self.predicted_seconds += t["predicted_ms"] / 1e3
            b = self._bucket
            b[0] += t["prompt_n"]
            b[1] += t["prompt_ms"] / 1e3
            b[2] += seq.gen_steps  # the rate is over the tokens after the first
            b[3] += t["predicted_ms"] / 1e3
            self.n_tokens_max = max(self.n_tokens_max, len(seq.tokens))
            self.drafts += s.n_drafts
            self.draft_tokens += s.n_drafted
            self.accepted_tokens += s.n_accepted
            for pos, n in enumerate(s.accepted_per_pos):
                if pos == len(self.accepted_per_pos):
                    self.accepted_per_pos.append(0)
                self.accepted_per_pos[pos] += n

    def render(self) -> bytes:
        with self._lock:
            b, self._bucket = self._bucket, [0, 0.0, 0, 0.0]
            counters = [
                ("prompt_tokens_total", "Number of prompt tokens processed, excluding cached "
                 "tokens", self.prompt_tokens),
                ("prompt_tokens_cached_total", "Number of prompt tokens reused from the cache",
                 self.prompt_cached),
                ("prompt_seconds_total", "Total time spent processing prompts",
                 self.prompt_seconds),
                ("tokens_predicted_total", "Number of generation tokens processed",
                 self.tokens_predicted),
                ("tokens_predicted_seconds_total", "Total time spent generating tokens",
                 self.predicted_seconds),
                ("n_decode_total", "Total number of target forward passes", self.n_decode),
                ("n_tokens_max", "Largest observed sequence length (prompt + generation)",
                 self.n_tokens_max),
                ("spec_decode_num_draft_tokens_total", "Speculative: Total draft tokens "
                 "generated", self.draft_tokens),
                ("spec_decode_num_accepted_tokens_total", "Speculative: Total draft tokens "
                 "accepted by the target model", self.accepted_tokens),
                ("spec_decode_num_drafts_total", "Speculative: Total speculative decoding "
                 "verification steps", self.drafts),
            ]
            gauges = [
                ("prompt_tokens_seconds", "Average prompt throughput in tokens/s",
                 b[0] / b[1] if b[1] > 0 else 0.0),
                ("predicted_tokens_seconds", "Average generation throughput in tokens/s",
                 b[2] / b[3] if b[3] > 0 else 0.0),
                ("requests_processing", "Number of requests processing", self.processing),
                ("requests_deferred", "Number of requests deferred", self.deferred),
                ("n_busy_slots_per_decode", "Average number of busy slots per target pass",
                 self.n_busy / max(self.n_decode, 1)),
            ]
            per_pos = list(self.accepted_per_pos)
        lines = []
        for kind, items in (("counter", counters), ("gauge", gauges)):
            for name, doc, value in items:
                lines += [f"# HELP {PREFIX}{name} {doc}", f"# TYPE {PREFIX}{name} {kind}",
                          f"{PREFIX}{name} {_number(value)}"]
        if per_pos:
            name = f"{PREFIX}spec_decode_num_accepted_tokens_per_pos_total"
            lines += [f"# HELP {name} Accepted tokens per draft position",
                      f"# TYPE {name} counter"]
            lines += [f'{name}{{position="{i}"}} {n}' for i, n in enumerate(per_pos)]
        return ("\n".join(lines) + "\n").encode()


def _number(v: float) -> str:
    return str(v) if isinstance(v, int) else repr(float(v))
