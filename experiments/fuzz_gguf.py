"""Fuzz the GGUF reader and loader, C kernels included: atheris (coverage-guided, libFuzzer) with
a structure-aware mutator that edits a small real file's header fields (version, counts,
metadata value types and values, string lengths, array counts, tensor dimensions, types and
offsets) besides libFuzzer's own byte mutations.

Each input is written to a file and opened as a user would (`load_model`); a file that loads
also runs a two-token forward pass through the kernels. A file may be refused, with a
TandemError; any other exception is a finding, kept (input and traceback) under --findings;
a crash of the process or a run past libFuzzer's -timeout is kept by libFuzzer itself
(artifact_prefix). Each finding, once fixed, becomes a regression case in
tests/data/gguf-fuzz/ (tests/test_model_checks.py runs them all).

    python experiments/fuzz_gguf.py --seconds 600 --out bench/results/fuzz-gguf

Reports (report.json, rewritten every 1,000 executions): executions, files refused and
loaded, findings, the seeds.
"""

from __future__ import annotations

import argparse
import atexit
import hashlib
import json
import os
import random
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

import atheris
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

with atheris.instrument_imports():
    import gguf

    from tandem.config import Numerics
    from tandem.errors import TandemError
    from tandem.models.gguf_file import GGUFFile
    from tandem.models.loader import load_model

STATE = {"execs": 0, "refused": 0, "loaded": 0, "findings": 0}
WORK = Path(tempfile.mkdtemp(prefix="fuzz-gguf-", dir="/dev/shm" if os.path.isdir("/dev/shm")
                             else None))
FINDINGS = Path(".")
REPORT = lambda: None  # noqa: E731  (main sets it: writes report.json)


def seeds(out: Path) -> list[Path]:
    """Small real files: a one-block qwen2 with float32 weights and one with Q8_0 weights."""
    import torch  # noqa: F401  (tests.tiny needs it)

    from tests import tiny

    out.mkdir(parents=True, exist_ok=True)
    small = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                 num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True)
    model = tiny.hf_model("qwen2", seed=5, **small)
    return [tiny.write_gguf(model, out / "seed-f32.gguf", "qwen2"),
            tiny.write_gguf(model, out / "seed-q8_0.gguf", "qwen2",
                            qtype=gguf.GGMLQuantizationType.Q8_0)]


def run_one(data: bytes) -> None:
    STATE["execs"] += 1
    if STATE["execs"] % 1000 == 0:  # libFuzzer ends the process without Python's atexit
        REPORT()
    path = WORK / "input.gguf"
    path.write_bytes(data)
    try:
        m = load_model(path, Numerics(threads=1), max_len=64)
        STATE["loaded"] += 1
        import torch

        with torch.no_grad():
            m.model.forward_packed([1, 2], _cache(m), [0, 0], [0, 1], [0, 1])
    except TandemError:
        STATE["refused"] += 1
    except Exception:
        keep(data, traceback.format_exc())


def _cache(m):
    from tandem.models.decoder import KVCache

    return KVCache(m.args, n_slots=1, max_len=64, dtype=m.dtype)


def keep(data: bytes, trace: str) -> None:
    STATE["findings"] += 1
    digest = hashlib.sha1(data).hexdigest()[:12]
    (FINDINGS / f"finding-{digest}.gguf").write_bytes(data)
    (FINDINGS / f"finding-{digest}.txt").write_text(trace)
    print(f"fuzz_gguf: finding {digest}: {trace.strip().splitlines()[-1]}", file=sys.stderr)


def mutate(data: bytes, max_size: int, seed: int) -> bytes:
    """Half the time libFuzzer's byte mutations; else one header field of a parseable file
    set to an edge value."""
    rng = random.Random(seed)
    if rng.random() < 0.5:
        return atheris.Mutate(data, max_size)
    path = WORK / f"mutate-{os.getpid()}.gguf"
    path.write_bytes(data)
    try:  # gguf's reader has no bounds of its own: only files Tandem's reader takes
        GGUFFile(path)
        r = gguf.GGUFReader(path, "r+")
    except Exception:
        return atheris.Mutate(data, max_size)
    parts = [p for f in r.fields.values() for p in f.parts
             if p.dtype != np.uint8 and p.dtype.kind in "iuf" and p.size]
    parts += [p for t in r.tensors for i, p in enumerate(t.field.parts) if i != 1 and p.size]
    if not parts:
        return atheris.Mutate(data, max_size)
    part = rng.choice(parts)
    i = rng.randrange(part.size)
    kind = part.dtype.kind
    info = np.iinfo(part.dtype) if kind in "iu" else np.finfo(part.dtype)
    old = int(part.flat[i]) if kind in "iu" else float(part.flat[i])
    choices = [0, 1, info.max, info.min, old + 1, old - 1, old * 2, old // 2 if kind in "iu"
               else old / 2, rng.randint(0, 1 << 20)]
    if kind == "f":
        choices += [np.nan, np.inf, -np.inf, 1e-30]
    value = rng.choice(choices)
    try:
        with np.errstate(all="ignore"):
            part.flat[i] = np.array(value).astype(part.dtype)
    except (OverflowError, ValueError):
        part.flat[i] = 0
    r.data.flush()
    del r, parts, part
    out = path.read_bytes()
    return out[:max_size]


def main() -> None:
    global FINDINGS
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=int, default=600)
    ap.add_argument("--out", type=Path, default=Path("bench/results/fuzz-gguf"))
    args, rest = ap.parse_known_args()
    args.out.mkdir(parents=True, exist_ok=True)
    FINDINGS = args.out / "findings"
    FINDINGS.mkdir(exist_ok=True)
    corpus = WORK / "corpus"
    corpus.mkdir()
    seed_files = seeds(WORK / "seeds")
    for s in seed_files:
        shutil.copy(s, corpus / s.name)
    t0 = time.time()

    def report() -> None:
        out = {"seconds": round(time.time() - t0, 1), **STATE,
               "seeds": {s.name: s.stat().st_size for s in seed_files},
               "findings_kept": sorted(p.name for p in FINDINGS.glob("finding-*.gguf")),
               "command": " ".join([sys.executable, *sys.argv])}
        (args.out / "report.json").write_text(json.dumps(out, indent=1) + "\n")

    global REPORT
    REPORT = report
    atexit.register(report)
    max_len = max(s.stat().st_size for s in seed_files) + 4096
    atheris.Setup([sys.argv[0], str(corpus), f"-max_total_time={args.seconds}",
                   "-timeout=30", "-rss_limit_mb=6000", f"-max_len={max_len}",
                   f"-artifact_prefix={FINDINGS}/", *rest],
                  run_one, custom_mutator=mutate)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
