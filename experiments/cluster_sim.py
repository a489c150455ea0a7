"""Beyond one machine, by simulation (issue 58): N Tandem replicas behind a request router, fed
with measured per-replica costs, on a multi-turn trace. Which router keeps time to first token
low as the fleet grows, and why: a conversation's next turn is cheap only on the replica that
still holds its prefix.

The replica model is Tandem's engine in miniature: `--parallel` slots, one packed pass per step
(every generating slot's verification rows, then prompt chunks up to the step's budget), the
pass priced from a measured table of seconds by rows (`spec_policy.measure`: 1..R rows, then
the prompt chunk's seconds per token beyond R); speculation as mean tokens per step and rows per
step (a task's acceptance). Each replica keeps the prefixes of the conversations it served,
least recently used dropped beyond its cache (KV slots + host prompt cache, in tokens); a
request's cached prefix is the longest it shares with one of them (the shared system prompt at
least, once the replica has served anything).

Routers: round-robin; power-of-two-choices on load (queued + running); `prefix`: Tandem's
fleet router, the rule of `tandem.cluster.affinity` itself (the replica sent the longest prefix
of the prompt, in 16-token blocks, unless its queue is more than --imbalance requests longer
than the shortest; two choices otherwise).

    python experiments/cluster_sim.py --measure --out bench/results/cluster-sim/costs.json
    python experiments/cluster_sim.py --measure --measure-together 2,1 --out costs-together.json
        (1 thread measured in two processes at once: what each of 2 x 1 replicas pays beside
        the other on one machine)
    python experiments/cluster_sim.py --costs bench/results/cluster-sim/costs.json \\
        --replicas 2,4,8,16,32,64 --out bench/results/cluster-sim/report.md
    python experiments/cluster_sim.py --costs ... --closed 4 --layouts 1x2,2x1 \
        --batch-prompts 77,45,664,918,43,39,80,126 --batch-answer 64
        (throughput at a fixed concurrency: one replica of 2 threads against two of 1, the
        batch of experiments/replicas_throughput.py --requests 8 --n-predict 64)

Standard library and Tandem's own routing rule (the measuring mode loads the default target).
"""

from __future__ import annotations

import argparse
import heapq
import json
import random
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path


# ---- costs ---------------------------------------------------------------------------------


@dataclass
class Costs:
    """One replica's pass times at its thread count: verify[r] seconds for r rows (1..R), and
    prompt seconds per token for rows beyond R (a prompt chunk)."""

    verify: dict[int, float]
    prompt_token: float

    def step(self, rows: int) -> float:
        top = max(self.verify)
        if rows <= top:
            return self.verify[max(1, rows)]
        return self.verify[top] + (rows - top) * self.prompt_token


def load_costs(path: str, threads: int) -> Costs:
    table = json.loads(Path(path).read_text())["threads"][str(threads)]
    return Costs({int(r): s for r, s in table["verify"].items()}, table["prompt_token"])


def measure(out: str, threads_list: list[int], rows_max: int, together: list[int]) -> None:
    """The default target's pass costs at each thread count (spec_policy.measure), each measured
    in together[i] processes at once (the replicas of a layout on one machine share its memory
    bandwidth and caches: 2 x 1 thread is measured as two 1-thread processes running side by
    side), the per-row medians averaged over the processes."""
    tables = {}
    for t, n in zip(threads_list, together):
        with tempfile.TemporaryDirectory() as tmp:
            runs = [subprocess.Popen([sys.executable, __file__, "--measure-one", str(t),
                                      "--rows-max", str(rows_max), "--out", f"{tmp}/{i}.json"])
                    for i in range(n)]
            if any(r.wait() for r in runs):
                raise SystemExit(f"measuring {t} thread(s) failed")
            got = [json.loads(Path(f"{tmp}/{i}.json").read_text()) for i in range(n)]
        tables[str(t)] = {
            "processes": n,
            "verify": {r: statistics.mean(g["verify"][r] for g in got) for r in got[0]["verify"]},
            "prompt_token": statistics.mean(g["prompt_token"] for g in got)}
        c = tables[str(t)]
        print(f"threads {t}, {n} process(es) at once: 1 row {c['verify']['1'] * 1e3:.1f} ms, "
              f"{rows_max} rows {c['verify'][str(rows_max)] * 1e3:.1f} ms, "
              f"prompt {1 / c['prompt_token']:.0f} tok/s")
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps({"threads": tables}, indent=1))


def measure_one(out: str, threads: int, rows_max: int) -> None:
    """One process's table at one thread count (measure's worker)."""
    from spec_policy import measure as pass_costs

    from tandem.config import EngineConfig, SpecConfig
    from tandem.flags import load_engine
    from tandem.registry import resolve

    import torch

    torch.set_num_threads(threads)
    engine = load_engine(str(resolve("default")), None, EngineConfig(
        ctx_size=2048, n_threads=threads), SpecConfig(types=["none"]))
    c = pass_costs(engine, rows_max, 0)
    Path(out).write_text(json.dumps({"verify": {str(r): v for r, v in c["verify"].items()},
                                     "prompt_token": c["prompt_token"]}))


# ---- the trace -----------------------------------------------------------------------------


@dataclass
class Request:
    session: int
    turn: int
    arrival: float
    prompt: int  # tokens
    answer: int  # tokens to generate
    cached: int = 0  # prompt tokens found cached on its replica
    prefilled: int = 0
    generated: int = 0
    first: float | None = None  # first token's time
    done: float | None = None
    replica: int = -1


@dataclass
class Workload:
    system: int = 400  # a system prompt every conversation shares
    user: tuple[int, int] = (40, 400)  # each turn's new user tokens (uniform)
    answer: tuple[int, int] = (64, 256)
    turns: tuple[int, int] = (2, 8)
    think: float = 4.0  # mean seconds between an answer and the next turn (exponential)


# ---- replicas and routers ------------------------------------------------------------------


@dataclass
class Replica:
    idx: int
    costs: Costs
    slots: int
    cache_tokens: int
    tokens_per_step: float
    rows_per_step: float
    chunk: int = 512
    queue: list[Request] = field(default_factory=list)
    running: list[Request] = field(default_factory=list)
    held: dict[int, int] = field(default_factory=dict)  # session -> prefix tokens, LRU order
    busy_until: float | None = None
    served_any: bool = False

    @property
    def load(self) -> int:
        return len(self.queue) + len(self.running)

    def cached_for(self, r: Request, system: int) -> int:
        prefix = self.held.get(r.session, 0)
        return min(r.prompt - 1, max(prefix, system if self.served_any else 0))

    def keep(self, r: Request) -> None:
        """The conversation's prefix (prompt + answer) is held; LRU beyond the cache."""
        self.held.pop(r.session, None)
        self.held[r.session] = r.prompt + r.answer
        while sum(self.held.values()) > self.cache_tokens and len(self.held) > 1:
            self.held.pop(next(iter(self.held)))
        self.served_any = True


def tokens_of(r: Request, system: int) -> list[int]:
    """The request's prompt as token ids: the shared system prompt, then its conversation's
    own tokens (the same ids at the same positions in every turn: a turn extends the last)."""
    return list(range(system)) + [1000 + hash((r.session, p)) % 50000
                                  for p in range(system, r.prompt)]


def choose(router: str, reps: list[Replica], r: Request, rng: random.Random, state: dict,
           system: int, imbalance: int) -> Replica:
    if router == "round-robin":
        state["next"] = (state.get("next", -1) + 1) % len(reps)
        return reps[state["next"]]
    if router == "p2c":
        a, b = rng.sample(reps, 2) if len(reps) > 1 else (reps[0], reps[0])
        return a if a.load <= b.load else b
    # Tandem's fleet router: the rule of tandem.cluster.affinity itself
    from tandem.cluster.affinity import Affinity, Route, block_keys

    aff = state.setdefault("affinity", Affinity(slack=imbalance, rng=rng))
    route = Route(keys=block_keys(tokens_of(r, system)))
    first = aff.choose([str(x.idx) for x in reps], lambda name: reps[int(name)].load, route)[0]
    aff.record(first, route)
    return reps[int(first)]


# ---- the simulation ------------------------------------------------------------------------


def simulate(reps: list[Replica], router: str, arrivals: list[tuple[float, int, int]],
             wl: Workload, rng: random.Random, imbalance: int = 2,
             closed: int = 0, horizon: float = 0.0,
             batch: list[tuple[int, int]] | None = None) -> list[Request]:
    """arrivals: (time, session, turns) of each conversation; closed > 0: that many clients
    instead, each sending its next request when the last is answered, until `horizon`, or
    until `batch` ((prompt, answer) tokens of each request, in order) is used up."""
    events: list[tuple[float, int, str, object]] = []
    seq = 0

    def push(t, kind, obj):
        nonlocal seq
        seq += 1
        heapq.heappush(events, (t, seq, kind, obj))

    history: dict[int, int] = {}
    turns_left: dict[int, int] = {}
    done: list[Request] = []
    state: dict = {}

    todo = list(batch or [])

    def new_request(t, session):
        if batch is not None:
            if not todo:
                return
            prompt, answer = todo.pop(0)
            push(t, "arrive", Request(session, 0, t, prompt, answer))
            return
        prompt = history.get(session, wl.system) + rng.randint(*wl.user)
        req = Request(session, 0, t, prompt, rng.randint(*wl.answer))
        push(t, "arrive", req)

    for t, s, turns in arrivals:
        turns_left[s] = turns
        new_request(t, s)
    fresh = [10**9]  # closed loop: each request a new conversation, ids above the trace's
    for _ in range(closed):
        fresh[0] += 1
        turns_left[fresh[0]] = 1
        new_request(0.0, fresh[0])

    def start_step(rep: Replica, now: float):
        while rep.queue and len(rep.running) < rep.slots:
            rep.running.append(rep.queue.pop(0))
        if not rep.running:
            rep.busy_until = None
            return
        rows, budget = 0, rep.chunk
        plan = []
        for q in rep.running:
            if q.prefilled < q.prompt - q.cached:
                take = min(budget, q.prompt - q.cached - q.prefilled)
                budget -= take
                rows += take
                plan.append((q, "prompt", take))
            else:
                rows += round(rep.rows_per_step)
                plan.append((q, "decode", 0))
        dt = rep.costs.step(max(rows, 1))
        rep.busy_until = now + dt
        push(now + dt, "step", (rep, plan))

    while events:
        now, _, kind, obj = heapq.heappop(events)
        if horizon and now > horizon:
            break
        if kind == "arrive":
            req = obj
            rep = choose(router, reps, req, rng, state, wl.system, imbalance)
            req.replica, req.cached = rep.idx, rep.cached_for(req, wl.system)
            rep.queue.append(req)
            if rep.busy_until is None:
                start_step(rep, now)
            continue
        rep, plan = obj
        for q, what, n in plan:
            if what == "prompt":
                q.prefilled += n
                continue
            if q.first is None:
                q.first = now
            q.generated += rep.tokens_per_step
            if q.generated >= q.answer:
                q.done = now
                rep.running.remove(q)
                rep.keep(q)
                done.append(q)
                history[q.session] = q.prompt + q.answer
                turns_left[q.session] -= 1
                if closed:  # the client's next request: a new conversation
                    fresh[0] += 1
                    turns_left[fresh[0]] = 1
                    new_request(now, fresh[0])
                elif turns_left[q.session] > 0:
                    new_request(now + rng.expovariate(1 / wl.think), q.session)
        start_step(rep, now)
    return done


# ---- reports -------------------------------------------------------------------------------


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))] if xs else float("nan")


def summary(done: list[Request]) -> dict:
    ttft = [q.first - q.arrival for q in done]
    span = max(q.done for q in done) - min(q.arrival for q in done)
    prompt = sum(q.prompt for q in done)
    return {"requests": len(done), "ttft_p50": pct(ttft, 0.5), "ttft_p99": pct(ttft, 0.99),
            "throughput": sum(q.answer for q in done) / span,
            "hit_rate": sum(q.cached for q in done) / prompt}


def make_replicas(n: int, costs: Costs, a) -> list[Replica]:
    return [Replica(i, costs, a.parallel, a.cache_tokens, a.tokens_per_step, a.rows_per_step)
            for i in range(n)]


def conversation_seconds(costs: Costs, wl: Workload, a) -> float:
    """One conversation's busy seconds on a replica holding its prefixes (no batching)."""
    turns = sum(wl.turns) / 2
    user, answer = sum(wl.user) / 2, sum(wl.answer) / 2
    per_turn = (user * costs.prompt_token
                + answer / a.tokens_per_step * costs.step(round(a.rows_per_step)))
    return turns * per_turn + wl.system * costs.prompt_token


def open_loop(a, costs: Costs, wl: Workload) -> str:
    lines = [f"| replicas | router | TTFT p50 (s) | TTFT p99 (s) | throughput (tok/s) | "
             f"prompt tokens cached |", "|---|---|---|---|---|---|"]
    rate1 = a.load / conversation_seconds(costs, wl, a)  # conversations per second per replica
    for n in a.replicas:
        rng = random.Random(a.seed)
        t, arrivals = 0.0, []
        for s in range(a.conversations_per_replica * n):
            t += rng.expovariate(rate1 * n)
            arrivals.append((t, s, rng.randint(*wl.turns)))
        for router in a.routers:
            done = simulate(make_replicas(n, costs, a), router, arrivals, wl,
                            random.Random(a.seed + 1), a.imbalance)
            m = summary(done)
            lines.append(f"| {n} | {router} | {m['ttft_p50']:.2f} | {m['ttft_p99']:.2f} | "
                         f"{m['throughput']:.0f} | {100 * m['hit_rate']:.0f}% |")
            print(lines[-1], file=sys.stderr)
    return "\n".join(lines)


def closed_loop(a, wl: Workload) -> str:
    """Each layout (replicas x threads) with --closed clients, each replica --closed / replicas
    slots (as replicas_throughput.py serves them); --batch-prompts: a fixed batch instead."""
    lines = ["| layout | throughput (tok/s) | TTFT p50 (s) |", "|---|---|---|"]
    batch = None
    if a.batch_prompts:
        batch = [(int(x), a.batch_answer) for x in a.batch_prompts.split(",")]
    for layout in a.layouts:
        n, threads = (int(x) for x in layout.split("x"))
        costs = load_costs(a.costs, threads)
        a.parallel = max(1, a.closed // n)
        reps = make_replicas(n, costs, a)
        done = simulate(reps, "p2c" if n > 1 else "round-robin", [], wl,
                        random.Random(a.seed), closed=a.closed, horizon=a.horizon,
                        batch=batch)
        m = summary(done)
        lines.append(f"| {n} x {threads} thread(s) | {m['throughput']:.1f} | "
                     f"{m['ttft_p50']:.2f} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--measure", action="store_true", help="measure the costs table (--out)")
    ap.add_argument("--measure-threads", default="1,2")
    ap.add_argument("--measure-together", default="",
                    help="processes measuring at once per thread count (default 1 each; "
                         "\"2,1\": 1 thread as two replicas side by side, 2 threads alone)")
    ap.add_argument("--measure-one", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--rows-max", type=int, default=16)
    ap.add_argument("--costs", help="a costs table written by --measure")
    ap.add_argument("--threads", type=int, default=2, help="threads per replica (open loop)")
    ap.add_argument("--replicas", type=lambda s: [int(x) for x in s.split(",")],
                    default=[2, 4, 8, 16, 32, 64])
    ap.add_argument("--routers", type=lambda s: s.split(","),
                    default=["round-robin", "p2c", "prefix"])
    ap.add_argument("--parallel", type=int, default=4, help="slots per replica")
    ap.add_argument("--cache-tokens", type=int, default=32768,
                    help="tokens of prefixes a replica keeps (KV slots + host prompt cache)")
    ap.add_argument("--tokens-per-step", type=float, default=1.0,
                    help="tokens each verification step gives (acceptance + 1)")
    ap.add_argument("--rows-per-step", type=float, default=1.0,
                    help="rows each verification step takes (drafted + 1)")
    ap.add_argument("--load", type=float, default=0.8,
                    help="offered load per replica, as a fraction of its unbatched capacity")
    ap.add_argument("--conversations-per-replica", type=int, default=40)
    ap.add_argument("--imbalance", type=int, default=2,
                    help="the prefix router's slack (tandem.cluster.affinity.Affinity)")
    ap.add_argument("--closed", type=int, default=0, help="clients (closed loop)")
    ap.add_argument("--batch-prompts", default="",
                    help="closed loop: the prompt tokens of a fixed batch of requests")
    ap.add_argument("--batch-answer", type=int, default=64, help="tokens each answers")
    ap.add_argument("--layouts", type=lambda s: s.split(","), default=["1x2", "2x1"])
    ap.add_argument("--horizon", type=float, default=600.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out")
    a = ap.parse_args()
    if a.measure_one:
        measure_one(a.out, a.measure_one, a.rows_max)
        return 0
    if a.measure:
        threads = [int(x) for x in a.measure_threads.split(",")]
        together = [int(x) for x in a.measure_together.split(",")] if a.measure_together \
            else [1] * len(threads)
        measure(a.out, threads, a.rows_max, together)
        return 0
    wl = Workload()
    if a.closed:
        report = closed_loop(a, wl)
    else:
        report = open_loop(a, load_costs(a.costs, a.threads), wl)
    print(report)
    if a.out:
        Path(a.out).write_text(report + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
