"""What a long prompt costs the streams already running, and what they cost it (issue 18).

    python experiments/admission.py --modes share,budget16,whole --prompt-tokens 2000 \
        --out bench/results/admission/admission.json

In process, on the default target (and the default draft, auto): two streams generate from the
prompts of bench/prompts/held-out-mix.jsonl; once each has produced `--lead` tokens a
`--prompt-tokens`-token prompt (Python standard library source, `--source`, cut to that many
tokens) arrives and generates 16 tokens. For each mode (--modes) the script records every step's
time, so per stream: the gaps between the steps that gave it tokens (median, largest, largest
over median; and the largest gap while the newcomer's prompt was read over the median gap
otherwise, the stricter reading), and for the newcomer its time to first token against the same prompt alone
(measured first, same engine, nothing else running).
"""

from __future__ import annotations

import argparse
import inspect
import json
import statistics
import time
from pathlib import Path

from common import ROOT, cpu_line


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--modes", default="share,budget16,whole",
                    help="share: the default rule (a prompt chunk takes about twice the time of "
                         "the generating rows, --batch-size 512); budgetN: a plain budget of N "
                         "rows per pass (the prompt takes what the generating rows leave); "
                         "whole: the prompt in chunks of 512 beside them (what streams got "
                         "before: a pass as long as the prompt's chunk)")
    ap.add_argument("--prompt-tokens", type=int, default=2000)
    ap.add_argument("--stream-tokens", type=int, default=400)
    ap.add_argument("--lead", type=int, default=8, help="tokens each stream has before")
    ap.add_argument("--source", default="argparse", help="stdlib module for the long prompt")
    ap.add_argument("--spec", default="auto")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()

    from tandem import registry
    from tandem.config import EngineConfig, SamplingParams, SpecConfig
    from tandem.engine import Engine, Request
    from tandem.flags import load_engine

    target = str(registry.resolve("default"))
    draft = str(registry.resolve("default-draft")) if a.spec == "auto" else None
    spec = SpecConfig(types=[a.spec]).resolved(draft is not None)
    tasks = [json.loads(x) for x in
             (ROOT / "bench/prompts/held-out-mix.jsonl").read_text().splitlines() if x.strip()]
    module = __import__(a.source)
    long_text = ("Explain what this module does.\n\n" + inspect.getsource(module))
    results = {"cpu": cpu_line(), "command": " ".join(["python", *__import__("sys").argv]),
               "runs": []}
    base = load_engine(target, draft, EngineConfig(n_parallel=3, ctx_size=4096), spec)
    tok = base.tok
    long_ids = tok.encode(long_text)[: a.prompt_tokens]
    stream_ids = [tok.encode(t["prompt"]) for t in tasks[:2]]
    greedy = dict(temperature=0.0, ignore_eos=True)

    def alone_ttft(engine: Engine) -> float:
        seq = engine.add(Request(list(long_ids), SamplingParams(n_predict=1, **greedy),
                                 cache_prompt=False))
        t0 = time.perf_counter()
        while not seq.done:
            engine.step()
        engine.release(seq)
        return time.perf_counter() - t0

    import tandem.engine as engine_module

    for mode in a.modes.split(","):
        if mode == "share":
            b, share = 512, 2.0
        elif mode.startswith("budget"):
            b, share = int(mode[len("budget"):]), 1e9
        elif mode == "whole":
            b, share = 512, 1e9
        else:
            raise SystemExit(f"unknown mode {mode!r}")
        base.cfg.batch_size = b
        engine_module.PROMPT_SHARE = share
        base.generate(Request(stream_ids[0][:64], SamplingParams(n_predict=4, **greedy)))  # warm
        ttft_alone = alone_ttft(base)
        streams = [base.add(Request(list(ids), SamplingParams(n_predict=a.stream_tokens,
                                                              **greedy), cache_prompt=False))
                   for ids in stream_ids]
        stamps: list[list[float]] = [[], []]
        newcomer = None
        t_arrive = None
        ttft = None
        t_read = None
        while not all(s.done for s in streams):
            if newcomer is None and all(len(s.output) >= a.lead for s in streams):
                newcomer = base.add(Request(list(long_ids), SamplingParams(n_predict=16, **greedy),
                                            cache_prompt=False))
                t_arrive = time.perf_counter()
            stepped = base.step()
            now = time.perf_counter()
            for i, s in enumerate(streams):
                if s.n_new and any(x is s for x in stepped):
                    stamps[i].append(now)
            if newcomer is not None and ttft is None and newcomer.output:
                ttft = now - t_arrive
            if newcomer is not None and t_read is None and not newcomer.prefilling:
                t_read = now  # the newcomer's prompt is read
            for s in [*streams, newcomer]:
                if s is not None and s.done:
                    base.release(s)
        while newcomer is not None and not newcomer.done:
            base.step()
            if ttft is None and newcomer.output:
                ttft = time.perf_counter() - t_arrive
        if newcomer is not None:
            base.release(newcomer)
        run = {"mode": mode, "batch_size": b, "prompt_share": share,
               "ttft_alone_s": ttft_alone, "ttft_s": ttft,
               "ttft_ratio": ttft / ttft_alone if ttft else None, "streams": []}
        for st in stamps:
            gaps = [y - x for x, y in zip(st, st[1:])]
            med = statistics.median(gaps)
            # the gaps that ended while the newcomer's prompt was read, against the others
            during = [y - x for x, y in zip(st, st[1:]) if t_arrive < y <= (t_read or y)]
            outside = [y - x for x, y in zip(st, st[1:]) if not t_arrive < y <= (t_read or y)]
            out_med = statistics.median(outside) if outside else None
            run["streams"].append({
                "gaps": len(gaps), "median_gap_s": med, "max_gap_s": max(gaps),
                "max_over_median": max(gaps) / med,
                "gaps_while_reading": len(during),
                "max_gap_while_reading_s": max(during) if during else None,
                "median_gap_otherwise_s": out_med,
                "max_while_reading_over_median_otherwise":
                    max(during) / out_med if during and out_med else None})
        print(json.dumps(run), flush=True)
        results["runs"].append(run)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
