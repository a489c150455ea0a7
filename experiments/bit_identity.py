"""Fingerprints of Tandem's numbers, to show that a change of structure changed none of them.

Prints one JSON object of SHA-256 prefixes: every kernel product (8 block types, int16 and int8
activations, 1..64 rows, 1 and 2 threads, the prompt kernel and the row-by-row one) and
dequantization on seeded random blocks; the default target's logits for a 10-row verification
pass and the one-row decode after it (checked equal to each other's last row); the greedy
tokens of the default pair on two chat prompts with speculation none, ngram-simple, auto and
draft-simple; and (the engine's scheduling) greedy and seeded outputs on three prompts with
speculation none, ngram-simple, suffix, auto, draft-simple and draft-simple with rejection
sampling, one slot, then three slots at once with staggered starts and prompts read in chunks,
with and without --kv-unified. It uses only the engine's public API (Engine, Request, add, step,
release), so it runs at older revisions too (`PYTHONPATH=OLD/src`). Run it before and after a
change and compare:

    python experiments/bit_identity.py > /tmp/before.json     # at the old revision
    python experiments/bit_identity.py > /tmp/after.json
    python experiments/bit_identity.py --compare /tmp/before.json /tmp/after.json

`--kernels-only` skips the models (seconds instead of about ten minutes on 2 cores).
"""

from __future__ import annotations

import hashlib
import json
import sys

import numpy as np
import torch
from gguf import GGMLQuantizationType as QT
from gguf import quants as gguf_quants

SIMPLE = [QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.Q8_0]
K_LAYOUT = {QT.Q4_K: (144, (0, 2)), QT.Q5_K: (176, (0, 2)), QT.Q6_K: (210, (208,))}
PROMPTS = ["Rewrite this function with type hints:\n\ndef area(w, h):\n    return w * h\n\n"
           "def perimeter(w, h):\n    return 2 * (w + h)\n",
           "Write a haiku about the sea."]


def blocks(qtype: QT, rows: int, cols: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if qtype in SIMPLE:
        return gguf_quants.quantize(rng.standard_normal((rows, cols)).astype(np.float32), qtype)
    nbytes, f16_at = K_LAYOUT[qtype]
    b = rng.integers(0, 256, size=(rows * cols // 256, nbytes), dtype=np.uint8)
    for at in f16_at:
        b[:, at: at + 2] = rng.uniform(1e-4, 3e-3, (len(b), 1)).astype(np.float16).view(np.uint8)
    return b.reshape(rows, -1)


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def kernel_prints() -> dict[str, str]:
    from tandem import kernels

    out = {}
    for qt in SIMPLE + list(K_LAYOUT):
        w = blocks(qt, 72, 2304, 1)
        rng = np.random.default_rng(2)
        x = torch.from_numpy(rng.standard_normal((64, 2304)).astype(np.float32))
        bias = torch.from_numpy(rng.standard_normal(72).astype(np.float32))
        out[f"deq {qt.name}"] = digest(kernels.dequantize(qt.name, w, 72, 2304).numpy().tobytes())
        for bits in (16, 8):
            for m in (1, 2, 3, 9, 10, 11, 16, 37, 64):
                for th in (1, 2):
                    y = kernels.matmul(qt.name, w, 72, 2304, x[:m], bias, bits=bits, threads=th)
                    out[f"mm {qt.name} b{bits} m{m} t{th}"] = digest(y.numpy().tobytes())
                    rows = kernels.matmul(qt.name, w, 72, 2304, x[:m], bias, bits=bits,
                                          threads=th, prompt_rows=kernels.ROW_BY_ROW)
                    assert torch.equal(rows, y), f"prompt kernel differs: {qt.name} m{m}"
    return out


def model_prints() -> dict[str, object]:
    from tandem.config import EngineConfig, Numerics, SamplingParams, SpecConfig
    from tandem.engine import Engine, Request
    from tandem.models.decoder import KVCache
    from tandem.models.loader import load_model

    out: dict[str, object] = {}
    tgt = load_model("default", Numerics(threads=2), max_len=4096 + 17)
    drf = load_model("default-draft", Numerics(threads=2, activations="int8"), max_len=4096 + 17)
    cache = KVCache(tgt.args, 1, 256, torch.float32)
    ids = tgt.tokenizer.encode('def quicksort(xs):\n    """Sort a list of numbers."""\n    if '
                               'len(xs) <= 1:\n        return xs\n', add_special=True,
                               parse_special=True)
    n = len(ids)
    tgt.model(torch.tensor([ids[:n - 10]]), cache, [0], [0], logits="none")
    verify = tgt.model(torch.tensor([ids[n - 10:]]), cache, [0], [n - 10])
    decode = tgt.model(torch.tensor([[ids[-1]]]), cache, [0], [n - 1])
    assert torch.equal(decode[0, 0], verify[0, -1]), "a verification row differs from decoding"
    out["target verify 10 rows"] = digest(verify.numpy().tobytes())
    out["target decode 1 row"] = digest(decode.numpy().tobytes())
    for spec, draft in (("none", None), ("ngram-simple", None), ("auto", drf),
                        ("draft-simple", drf)):
        engine = Engine(tgt, draft, EngineConfig(ctx_size=4096, n_threads=2),
                        SpecConfig(types=spec))
        for i, p in enumerate(PROMPTS):
            text = tgt.tokenizer.apply_chat_template([{"role": "user", "content": p}])
            pid = tgt.tokenizer.encode(text, add_special=False, parse_special=True)
            seq = engine.generate(Request(pid, SamplingParams(temperature=0, n_predict=48)))
            out[f"greedy {spec} p{i}"] = digest(json.dumps(seq.output).encode())
            out[f"greedy {spec} p{i} drafted"] = seq.stats.n_drafted  # not compared: timing
    out.update(engine_prints(tgt, drf))
    return out


SCHED_PROMPTS = PROMPTS + ["Explain what a Python generator is, in three sentences, then repeat "
                           "the three sentences."]
SAMPLINGS = {"greedy": dict(temperature=0), "seeded": dict(temperature=0.8, seed=1234)}


def engine_prints(tgt, drf) -> dict[str, object]:
    """Outputs through the engine's scheduling: one slot, every speculation type, greedy and
    seeded; then three slots at once (prompts read in chunks of 24 between the others'
    tokens, starts staggered), with and without a shared pool (--kv-unified)."""
    from tandem.config import EngineConfig, SamplingParams, SpecConfig
    from tandem.engine import Engine, Request

    tok = tgt.tokenizer
    ids = [tok.encode(tok.apply_chat_template([{"role": "user", "content": p}]),
                      add_special=False, parse_special=True) for p in SCHED_PROMPTS]
    out: dict[str, object] = {}
    for spec, draft, rejection in (("none", None, False), ("ngram-simple", None, False),
                                   ("suffix", None, False), ("auto", drf, False),
                                   ("draft-simple", drf, False), ("draft-simple", drf, True)):
        engine = Engine(tgt, draft, EngineConfig(ctx_size=4096, n_threads=2),
                        SpecConfig(types=spec, draft_rejection=rejection))
        for sname, sp in SAMPLINGS.items():
            if rejection and sname == "greedy":
                continue
            for i, p in enumerate(ids):
                seq = engine.generate(Request(p, SamplingParams(n_predict=40, **sp)))
                out[f"1slot {spec}{'+rej' if rejection else ''} {sname} p{i}"] = \
                    digest(json.dumps(seq.output).encode())
    for spec, draft in (("none", None), ("auto", drf), ("ngram-simple", None)):
        for unified in (False, True):
            cfg = EngineConfig(ctx_size=4096 if unified else 1024, n_threads=2, n_parallel=3,
                               batch_size=24, kv_unified=unified)
            engine = Engine(tgt, draft, cfg, SpecConfig(types=spec))
            for sname, sp in SAMPLINGS.items():
                seqs = []
                for i, p in enumerate(ids):
                    seqs.append(engine.add(Request(p, SamplingParams(n_predict=30 + 5 * i, **sp))))
                    for _ in range(2 + i):
                        engine.step()
                while any(not s.done for s in seqs):
                    engine.step()
                for s in seqs:
                    engine.release(s)
                    out[f"3slot {spec} unified={unified} {sname} p{s.slot}"] = \
                        digest(json.dumps([s.output, s.text]).encode())
    return out


def compare(before: str, after: str) -> int:
    a, b = (json.load(open(p)) for p in (before, after))
    keys = [k for k in a if not k.endswith("drafted")]
    diff = [k for k in keys if a[k] != b.get(k)]
    print(f"{len(keys) - len(diff)} of {len(keys)} fingerprints equal"
          + (f"; different: {', '.join(diff)}" if diff else ""))
    return 1 if diff else 0


def main() -> int:
    if sys.argv[1:2] == ["--compare"]:
        return compare(*sys.argv[2:4])
    res: dict[str, object] = kernel_prints()
    if "--kernels-only" not in sys.argv:
        res.update(model_prints())
    json.dump(res, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
