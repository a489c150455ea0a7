"""Fingerprints of Tandem's numbers, to show that a change of structure changed none of them.

Prints one JSON object of SHA-256 prefixes: every kernel product (8 block types, int16 and int8
activations, 1..64 rows, 1 and 2 threads, the prompt kernel and the row-by-row one) and
dequantization on seeded random blocks; the default target's logits for a 10-row verification
pass and the one-row decode after it (checked equal to each other's last row); and the greedy
tokens of the default pair on two chat prompts with speculation none, ngram-simple, auto and
draft-simple. Run it before and after a change and compare:

    python experiments/bit_identity.py > /tmp/before.json     # at the old revision
    python experiments/bit_identity.py > /tmp/after.json
    python experiments/bit_identity.py --compare /tmp/before.json /tmp/after.json

`--kernels-only` skips the models (seconds instead of about a minute).
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
