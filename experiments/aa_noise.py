"""An A/A control: two identical servers (the same command, both `--spec-type none`), each
request sent to both back to back in alternating order (ABBA). Their ratio is what this
machine's noise alone does to a side-by-side of two servers: a speed-up measured in a pass
of `tandem bench` is a difference only where it leaves this spread.

    tandem serve -m default --spec-type none --port 8091 --threads 2 &
    tandem serve -m default --spec-type none --port 8092 --threads 2 &
    python experiments/aa_noise.py --prompts bench/prompts/specbench-even-validation.jsonl \\
        --rounds 4 --n-predict 16 --out bench/results/aa-prompt-noise/aa.json

Stdlib only. Prints each pair (prompt ms, decode ms, wall s, B/A) and the spread by prompt
length."""

from __future__ import annotations

import argparse
import json
import statistics
import time

from common import post


def request(port: int, prompt: str, n_predict: int) -> dict:
    t0 = time.perf_counter()
    out = post(f"http://localhost:{port}/completion", {
        "prompt": prompt, "n_predict": n_predict, "cache_prompt": False, "temperature": 0})
    t = out["timings"]
    return {"wall_s": time.perf_counter() - t0, "prompt_ms": t["prompt_ms"],
            "prompt_n": t["prompt_n"], "predicted_ms": t["predicted_ms"],
            "predicted_n": t["predicted_n"], "content": out["content"]}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--ports", default="8091,8092")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--n-predict", type=int, default=16)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    pa, pb = (int(p) for p in a.ports.split(","))
    prompts = [json.loads(line) for line in open(a.prompts) if line.strip()]
    pairs = []
    for rnd in range(a.rounds):
        for p in prompts:
            order = (pa, pb) if rnd % 2 == 0 else (pb, pa)
            got = {port: request(port, p["prompt"], a.n_predict) for port in order}
            A, B = got[pa], got[pb]
            pair = {"task": p["task"], "round": rnd, "first": "A" if order[0] == pa else "B",
                    "A": A, "B": B, "same_text": A["content"] == B["content"],
                    "wall_ratio": A["wall_s"] / B["wall_s"],  # a speed-up of B over A
                    "prompt_ratio": A["prompt_ms"] / B["prompt_ms"]}
            pairs.append(pair)
            print(f"{rnd} {p['task']:28s} prompt {A['prompt_n']:5d} tok  A {A['prompt_ms']:7.0f} "
                  f"B {B['prompt_ms']:7.0f} ms  wall A/B {pair['wall_ratio']:.3f}", flush=True)
    walls = [q["wall_ratio"] for q in pairs]
    summary = {"pairs": len(pairs), "wall_ratio_median": statistics.median(walls),
               "wall_ratio_min": min(walls), "wall_ratio_max": max(walls),
               "below_0.95": sum(w < 0.95 for w in walls),
               "above_1.05": sum(w > 1.05 for w in walls),
               "same_text": sum(q["same_text"] for q in pairs)}
    print(json.dumps(summary))
    json.dump({"settings": vars(a), "summary": summary, "pairs": pairs}, open(a.out, "w"),
              indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
