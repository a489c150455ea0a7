"""Check a `tandem bench` run over bench/prompts/structured.jsonl: every answer valid (the
extraction answers against their JSON schema, the tool-call answers one parseable call), and
the share of the candidate's output tokens that the grammar forced (drafted for free).

    python experiments/structured_check.py bench/results/structured
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import jsonschema

from tandem.server.tools import parse


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, help="the bench's --out-dir")
    ap.add_argument("--prompts", type=Path, default=Path("bench/prompts/structured.jsonl"))
    args = ap.parse_args()
    tasks = {t["task"]: t for t in map(json.loads, args.prompts.read_text().splitlines())}
    valid = invalid = forced = drafted = out = 0
    for side in ("baseline", "candidate"):
        run = json.loads((args.run / f"{side}.json").read_text())
        for r in run["requests"] + run.get("warmup", []):
            want = tasks[r["task"]]["request"]
            try:
                if "json_schema" in want:
                    jsonschema.validate(json.loads(r["content"]), want["json_schema"])
                else:
                    _, calls = parse(r["content"])
                    assert len(calls) == 1 and r["content"].lstrip().startswith("<tool_call>")
                valid += 1
            except (AssertionError, ValueError, jsonschema.ValidationError) as e:
                invalid += 1
                print(f"invalid: {side} {r['task']}: {e}")
        if side == "candidate":
            for r in run["requests"]:
                t = r["timings"]
                forced += t.get("draft_n_forced", 0)
                drafted += t.get("draft_n", 0)
                out += t["predicted_n"]
    print(f"answers valid: {valid}, invalid: {invalid}")
    print(f"candidate (measured passes): {out} output tokens, {drafted} drafted, {forced} forced "
          f"by the grammar: {forced / max(out, 1):.1%} of the output, "
          f"{forced / max(drafted, 1):.1%} of the drafts")


if __name__ == "__main__":
    main()
