"""`tandem generate`: one prompt, text streamed to stdout (or llama.cpp's /completion JSON)."""

from __future__ import annotations

import argparse
import json
import sys

from . import flags
from .engine import Request
from .server.results import completion_json


def add_arguments(p: argparse.ArgumentParser) -> None:
    flags.add_model_args(p)
    flags.add_spec_args(p)
    flags.add_sampling_args(p)
    p.add_argument("-p", "--prompt", required=True)
    p.add_argument("--chat", action="store_true",
                   help="wrap the prompt as one user message with the model's chat template")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object with llama.cpp's /completion fields")


def run(a: argparse.Namespace) -> int:
    sampling = flags.sampling_params(a)
    spec = flags.spec_config(a)
    engine = flags.load_engine(a.model, a.model_draft, flags.engine_config(a), spec)
    tok = engine.tok
    if a.chat:
        text = tok.apply_chat_template([{"role": "user", "content": a.prompt}])
        ids = tok.encode(text, add_special=False, parse_special=True)
    else:
        ids = tok.encode(a.prompt, add_special=True, parse_special=True)

    def out(s: str) -> None:
        sys.stdout.write(s)
        sys.stdout.flush()

    seq = engine.generate(Request(ids, sampling), on_text=None if a.json else out)
    result = completion_json(seq)
    if a.json:
        print(json.dumps(result, ensure_ascii=False))
        return 0
    sys.stdout.write("\n")
    t = result["timings"]
    print(f"tandem: {t['prompt_n']} prompt tokens in {t['prompt_ms']:.0f} ms "
          f"({t['prompt_per_second']:.1f} tok/s), {t['predicted_n']} generated in "
          f"{t['predicted_ms']:.0f} ms ({t['predicted_per_second']:.1f} tok/s), "
          f"stop: {result['stop_type']}", file=sys.stderr)
    if seq.spec.enabled:
        print(f"tandem: {seq.stats.summary()}", file=sys.stderr)
    return 0
