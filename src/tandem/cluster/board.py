"""The board: one small Ray actor every engine replica reports to twice a second (its counters,
queue depth, KV use, model path, finished answers), read by the ingress for the fleet's
/health and /metrics, and passing the answers on to the other replicas' suffix pools.

A replica that stops reporting for STALE seconds (it died, or Ray is replacing it) is not
ready; its last counters are kept in `retired`, so the fleet's counters never go back.

The fleet's /metrics: every series of one server's. llama-server's `llamacpp:` counters summed
over the replicas (retired ones included), requests_processing / requests_deferred summed,
n_tokens_max the largest, the throughput gauges from the summed counters since the last
scrape, busy slots per pass over the live replicas; and per replica the gauges a scheduler
reads (llm-d's: queue depth, KV cache use):

    tandem:replicas_ready                                replicas reporting now
    tandem:replica_queue_depth{replica="..."}            requests in a slot or waiting for one
    tandem:replica_kv_cache_usage_ratio{replica="..."}   cached tokens / (slots x context)
"""

from __future__ import annotations

import time
from collections import Counter, deque

from ..server.metrics import PREFIX

NAME = "tandem-board"
NAMESPACE = "tandem"
STALE = 3.0

# (llama-server's name, Metrics' attribute, help)
COUNTERS = (
    ("prompt_tokens_total", "prompt_tokens", "Number of prompt tokens processed, excluding "
     "cached tokens"),
    ("prompt_tokens_cached_total", "prompt_cached", "Number of prompt tokens reused from the "
     "cache"),
    ("prompt_seconds_total", "prompt_seconds", "Total time spent processing prompts"),
    ("tokens_predicted_total", "tokens_predicted", "Number of generation tokens processed"),
    ("tokens_predicted_seconds_total", "predicted_seconds", "Total time spent generating "
     "tokens"),
    ("n_decode_total", "n_decode", "Total number of target forward passes"),
    ("spec_decode_num_draft_tokens_total", "draft_tokens", "Speculative: Total draft tokens "
     "generated"),
    ("spec_decode_num_accepted_tokens_total", "accepted_tokens", "Speculative: Total draft "
     "tokens accepted by the target model"),
    ("spec_decode_num_drafts_total", "drafts", "Speculative: Total speculative decoding "
     "verification steps"),
)


class Board:
    """The actor (launch.py starts it as ray.remote(Board), named NAME). It also passes the
    replicas' finished answers on (sharedpool.py): a ring of the latest, at most
    `pool_tokens` tokens, each numbered, so a replica asks for those after the last it saw."""

    def __init__(self, pool_tokens: int = 0) -> None:
        self.live: dict[str, tuple[float, dict]] = {}
        self.retired: Counter = Counter()
        self.pool_tokens, self.held, self.last = pool_tokens, 0, 0
        self.answers: deque[tuple[int, str, list[int]]] = deque()

    def report(self, replica: str, snap: dict, answers: list[list[int]] = (),
               after: int = 0) -> tuple[int, list[list[int]]]:
        """A replica's report and its new answers; the others' answers numbered past `after`
        (a new replica, after=0, gets every one the ring holds), and the last number."""
        self.live[replica] = (time.monotonic(), snap)
        for tokens in answers if self.pool_tokens > 0 else ():
            self.last += 1
            self.answers.append((self.last, replica, tokens))
            self.held += len(tokens)
        while self.held > self.pool_tokens:
            self.held -= len(self.answers.popleft()[2])
        return self.last, [t for n, r, t in self.answers if n > after and r != replica]

    def update(self, replica: str, snap: dict) -> None:
        """A replica's counters as a request ends (before its last bytes leave), so a
        /metrics right after an answer counts it."""
        self.live[replica] = (time.monotonic(), snap)

    def fleet(self) -> dict:
        """{"replicas": {id: snapshot} of those reporting, "retired": summed counters}."""
        now = time.monotonic()
        for rid, (seen, snap) in list(self.live.items()):
            if now - seen > STALE:
                del self.live[rid]
                self.retired.update({k: snap["counters"][k] for _, k, _ in COUNTERS})
                self.retired.update({f"pos{i}": n for i, n in enumerate(snap["per_pos"])})
        return {"replicas": {rid: snap for rid, (_, snap) in self.live.items()},
                "retired": dict(self.retired)}


def snapshot(state) -> dict:
    """A replica's report: its server state's counters, queue and KV use (server/state.py)."""
    m, engine = state.metrics, state.engine
    slots = engine.cfg.n_parallel
    cached = sum(engine.cache.length(i) for i in range(slots))
    return {"counters": {k: getattr(m, k) for _, k, _ in COUNTERS}, "t_start": m.t_start,
            "per_pos": list(m.accepted_per_pos), "n_tokens_max": m.n_tokens_max,
            "n_busy": m.n_busy,
            "processing": m.processing, "deferred": m.deferred,
            "kv_used": cached / max(1, slots * engine.cfg.ctx_size),
            "model_path": state.model_path}


def render(view: dict, last: dict) -> bytes:
    """The fleet's Prometheus text from Board.fleet(); `last` is the caller's memory of the
    previous scrape's totals, for the throughput gauges ("since the last scrape", as
    llama-server's), updated here."""
    reps, retired = view["replicas"], view["retired"]
    lines: list[str] = []
    totals = {k: retired.get(k, 0) + sum(s["counters"][k] for s in reps.values())
              for _, k, _ in COUNTERS}
    rates = []
    for name, tokens, seconds, doc in (
            ("prompt_tokens_seconds", "prompt_tokens", "prompt_seconds",
             "Average prompt throughput in tokens/s"),
            ("predicted_tokens_seconds", "tokens_predicted", "predicted_seconds",
             "Average generation throughput in tokens/s")):
        dt = totals[seconds] - last.get(seconds, 0)
        rates.append((name, doc, (totals[tokens] - last.get(tokens, 0)) / dt if dt > 0 else 0.0))
    last.update(totals)

    def series(name: str, kind: str, doc: str, samples: list[tuple[str, float]]) -> None:
        lines.extend([f"# HELP {name} {doc}", f"# TYPE {name} {kind}"])
        lines.extend(f"{name}{labels} {_number(v)}" for labels, v in samples)

    for name, key, doc in COUNTERS:
        series(PREFIX + name, "counter", doc, [("", totals[key])])
    series(PREFIX + "n_tokens_max", "counter", "Largest observed sequence length (prompt + "
           "generation)", [("", max((s["n_tokens_max"] for s in reps.values()), default=0))])
    for name, key, doc in (("requests_processing", "processing", "Number of requests "
                            "processing"), ("requests_deferred", "deferred", "Number of "
                                            "requests deferred")):
        series(PREFIX + name, "gauge", doc, [("", sum(s[key] for s in reps.values()))])
    for name, doc, rate in rates:
        series(PREFIX + name, "gauge", doc, [("", rate)])
    busy = sum(s["n_busy"] for s in reps.values())
    series(PREFIX + "n_busy_slots_per_decode", "gauge", "Average number of busy slots per "
           "target pass", [("", busy / max(1, sum(s["counters"]["n_decode"]
                                                   for s in reps.values())))])
    per_pos: Counter = Counter({int(k[3:]): v for k, v in retired.items()
                                if k.startswith("pos")})
    for s in reps.values():
        per_pos.update(dict(enumerate(s["per_pos"])))
    if per_pos:
        series(PREFIX + "spec_decode_num_accepted_tokens_per_pos_total", "counter",
               "Accepted tokens per draft position",
               [(f'{{position="{i}"}}', per_pos[i]) for i in sorted(per_pos)])
    series("tandem:replicas_ready", "gauge", "Engine replicas reporting now",
           [("", len(reps))])
    series("tandem:replica_queue_depth", "gauge", "Requests in a slot or waiting for one",
           [(f'{{replica="{r}"}}', s["processing"] + s["deferred"])
            for r, s in sorted(reps.items())])
    series("tandem:replica_kv_cache_usage_ratio", "gauge", "Cached tokens over the slots' "
           "context", [(f'{{replica="{r}"}}', s["kv_used"]) for r, s in sorted(reps.items())])
    return ("\n".join(lines) + "\n").encode()


def _number(v: float) -> str:
    return str(v) if isinstance(v, int) else repr(float(v))
