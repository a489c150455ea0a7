"""One EAGLE-3 head, two engines: Tandem's draft-eagle3 and llama.cpp's, same prompts and flags.

Each engine serves the target alone and with the head (--spec-type draft-eagle3, the same
--spec-draft-n-max / -n-min / -p-min on both), greedy, every prompt through /completion in
ChatML. Reported per engine: drafted and accepted tokens (llama.cpp's `timings.draft_n`,
`draft_n_accepted`, which Tandem's /completion also gives), tokens per target pass (n / (n -
accepted): each pass yields the target's token and the drafts it accepted),
decode speed over its own target alone (median and range over prompts), and whether each
answer equals the engine's own target alone. Configurations run in turns (ABBA between the
engines) so a slow spell of the machine falls on both.

    python experiments/eagle3_engines.py --llama-server .../llama-server \\
        --model smollm2-135m --head HEAD.gguf --n-max 4 --out bench/results/eagle3-engines
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from common import ROOT, command_line, cpu_line, free_port, post, serving, spread

sys.path.insert(0, str(ROOT / "src"))
from tandem.registry import resolve  # noqa: E402

PROMPTS = ROOT / "bench" / "prompts" / "specbench-even-validation.jsonl"
CHATML = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"


KINDS = {  # a configuration's speculation: the target alone, the head with fixed flags,
    # Tandem's auto (suffix, then the head or the draft model, each draft sized by its costs)
    "none": "target alone", "head": "draft-eagle3", "auto-head": "auto with the head",
    "auto-draft": "auto with the draft model"}


def command(engine: str, kind: str, a: argparse.Namespace, port: int) -> list[str]:
    head = str(Path(a.head).resolve())
    spec = {"none": ["--spec-type", "none"],
            "head": ["--model-draft", head, "--spec-type", "draft-eagle3",
                     "--spec-draft-n-max", str(a.n_max), "--spec-draft-n-min", "0",
                     "--spec-draft-p-min", f"{a.p_min:g}"],
            "auto-head": ["--model-draft", head, "--spec-type", "auto"],
            "auto-draft": ["--model-draft", str(resolve(a.draft or "default-draft", quiet=True)),
                           "--spec-type", "auto"]}[kind]
    common = ["--threads", str(a.threads), "--ctx-size", str(a.ctx_size), "--port", str(port),
              "--host", "127.0.0.1", *spec]
    target = str(resolve(a.model, quiet=True))
    if engine == "tandem":
        return [a.tandem, "serve", "-m", target, *common]
    return [a.llama_server, "--model", target, *common]


def run_config(engine: str, kind: str, prompts: list[str], a: argparse.Namespace,
               log: Path) -> list[dict]:
    port = free_port()
    with serving(command(engine, kind, a, port), port, log) as url:
        out = []
        for p in prompts:
            r = post(url + "/completion", {"prompt": CHATML.format(p), "n_predict": a.n_predict,
                                            "temperature": 0, "cache_prompt": False})
            t = r.get("timings", {})
            out.append({"content": r.get("content", ""), "n": t.get("predicted_n", 0),
                        "ms": t.get("predicted_ms", 0.0), "drafted": t.get("draft_n", 0),
                        "accepted": t.get("draft_n_accepted", 0)})
        return out


def summary(engine: str, alone: list[dict], spec: list[dict]) -> dict:
    """A configuration against its engine's target alone, prompt by prompt."""
    drafted = sum(r["drafted"] for r in spec)
    accepted = sum(r["accepted"] for r in spec)
    speed = [(s["n"] / s["ms"]) / (b["n"] / b["ms"]) for b, s in zip(alone, spec)
             if s["ms"] and b["ms"]]
    same = sum(b["content"] == s["content"] for b, s in zip(alone, spec))
    return {"engine": engine, "drafted": drafted, "accepted": accepted,
            "acceptance": accepted / drafted if drafted else 0.0,
            "decode_speedup_median": statistics.median(speed) if speed else None,
            "decode_speedup": spread(speed), "same_as_alone": f"{same}/{len(spec)}",
            "tokens": sum(s["n"] for s in spec),
            "decode_tok_s_alone": spread([b["n"] / b["ms"] * 1e3 for b in alone if b["ms"]], 1),
            "decode_tok_s_head": spread([s["n"] / s["ms"] * 1e3 for s in spec if s["ms"]], 1),
            "seconds_head": round(sum(s["ms"] for s in spec) / 1e3, 2),
            # every step yields the target's token plus what it accepted: n / (n - accepted)
            "tokens_per_step": sum(s["n"] for s in spec) / max(1, sum(
                s["n"] - s["accepted"] for s in spec))}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--llama-server", default=None, help="llama.cpp's server (without it, "
                   "only Tandem: llama.cpp cannot run a head on every target)")
    p.add_argument("--tandem", default=str(Path(sys.executable).with_name("tandem")))
    p.add_argument("--model", required=True, help="the target (name or .gguf)")
    p.add_argument("--head", required=True, help="the EAGLE-3 head (.gguf)")
    p.add_argument("--prompts", default=str(PROMPTS))
    p.add_argument("--limit", type=int, default=0, help="first N prompts (0: all)")
    p.add_argument("--n-predict", type=int, default=128)
    p.add_argument("--n-max", type=int, default=4)
    p.add_argument("--p-min", type=float, default=0.0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--ctx-size", type=int, default=4096)
    p.add_argument("--tandem-kinds", default="head",
                   help="Tandem's configurations besides its target alone, comma-separated: "
                        "head (draft-eagle3 with the flags above), auto-head, auto-draft")
    p.add_argument("--draft", default=None, help="auto-draft's draft model (default-draft)")
    p.add_argument("--out", required=True)
    a = p.parse_args()
    prompts = [json.loads(line)["prompt"] for line in open(a.prompts, encoding="utf-8")]
    prompts = prompts[: a.limit] if a.limit else prompts
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    log = out / "servers.log"
    if "auto-draft" in a.tandem_kinds and a.draft is None:
        a.draft = "default-draft"
    runs = {}
    kinds = [k.strip() for k in a.tandem_kinds.split(",") if k.strip()]
    order = [("tandem", "none")] + ([("llama.cpp", "none"), ("llama.cpp", "head")]
                                    if a.llama_server else []) + [("tandem", k) for k in kinds]
    for engine, kind in order:
        runs[engine, kind] = run_config(engine, kind, prompts, a, log)
        print(engine, KINDS[kind], "done", flush=True)
    report = {"command": command_line(), "cpu": cpu_line(), "prompts": a.prompts,
              "n": len(prompts), "n_max": a.n_max, "p_min": a.p_min,
              "configurations": [{"kind": KINDS[k], **summary(e, runs[e, "none"], runs[e, k])}
                                 for e, k in order if k != "none"]}
    if a.llama_server and "head" in kinds:
        report["same_text_across_engines_with_head"] = sum(
            x["content"] == y["content"]
            for x, y in zip(runs["tandem", "head"], runs["llama.cpp", "head"]))
    (out / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    (out / "runs.json").write_text(json.dumps({f"{e} {k}": r for (e, k), r in runs.items()}) + "\n")
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
