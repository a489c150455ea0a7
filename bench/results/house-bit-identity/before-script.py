"""Hashes of kernel outputs and the real pair's logits/greedy tokens (old API)."""
import hashlib, json, sys
import numpy as np, torch
from gguf import GGMLQuantizationType as QT
from gguf import quants as gguf_quants
from tandem import kernels
from tandem.models.gguf_file import RawTensor

SIMPLE = [QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.Q8_0]
K_LAYOUT = {QT.Q4_K: (144, (0, 2)), QT.Q5_K: (176, (0, 2)), QT.Q6_K: (210, (208,))}

def tensor(qtype, rows, cols, seed=0):
    rng = np.random.default_rng(seed)
    if qtype in SIMPLE:
        return gguf_quants.quantize(rng.standard_normal((rows, cols)).astype(np.float32), qtype)
    nbytes, f16_at = K_LAYOUT[qtype]
    blocks = rng.integers(0, 256, size=(rows * cols // 256, nbytes), dtype=np.uint8)
    for at in f16_at:
        blocks[:, at: at + 2] = rng.uniform(1e-4, 3e-3, (len(blocks), 1)).astype(np.float16).view(np.uint8)
    return blocks.reshape(rows, -1)

def h(t):
    return hashlib.sha256(t.contiguous().numpy().tobytes()).hexdigest()[:16]

def main(matmul, dequant, load_model, Engine, EngineConfig, SpecConfig, Request, SamplingParams):
    out = {}
    for qt in SIMPLE + list(K_LAYOUT):
        w = tensor(qt, 72, 2304, 1)
        rng = np.random.default_rng(2)
        x = torch.from_numpy(rng.standard_normal((64, 2304)).astype(np.float32))
        bias = torch.from_numpy(rng.standard_normal(72).astype(np.float32))
        out[f"deq {qt.name}"] = h(dequant(qt.name, w, 72, 2304))
        for bits in (16, 8):
            for m in (1, 2, 3, 9, 10, 11, 16, 37, 64):
                for th in (1, 2):
                    out[f"mm {qt.name} b{bits} m{m} t{th}"] = h(matmul(qt.name, w, 72, 2304, x[:m], bias, bits, th))
    if "--kernels-only" in sys.argv:
        return out
    tgt = load_model("default", max_len=4096 + 17)
    drf = load_model("default-draft", max_len=4096 + 17, activations="int8")
    from tandem.models.decoder import KVCache
    cache = KVCache(tgt.args, 1, 256, torch.float32)
    ids = tgt.tokenizer.encode("def quicksort(xs):\n    \"\"\"Sort a list of numbers.\"\"\"\n    if len(xs) <= 1:\n        return xs\n", add_special=True, parse_special=True)
    n = len(ids)
    tgt.model(torch.tensor([ids[:n - 10]]), cache, [0], [0], logits="none")
    lg = tgt.model(torch.tensor([ids[n - 10:]]), cache, [0], [n - 10])
    out["target verify 10 rows"] = h(lg)
    lg1 = tgt.model(torch.tensor([[ids[-1]]]), cache, [0], [n - 1])
    out["target decode 1 row"] = h(lg1)
    assert torch.equal(lg1[0, 0], lg[0, -1]), "batch invariance broken"
    prompts = ["Rewrite this function with type hints:\n\ndef area(w, h):\n    return w * h\n\ndef perimeter(w, h):\n    return 2 * (w + h)\n",
               "Write a haiku about the sea."]
    for spec, use_draft in (("none", False), ("ngram-simple", False), ("auto", True), ("draft-simple", True)):
        eng = Engine(tgt, drf if use_draft else None, EngineConfig(ctx_size=4096), SpecConfig(types=SpecConfig.parse_types(spec)))
        for i, p in enumerate(prompts):
            pid = tgt.tokenizer.encode(tgt.tokenizer.apply_chat_template([{"role": "user", "content": p}]), add_special=False, parse_special=True)
            seq = eng.generate(Request(pid, SamplingParams(temperature=0, n_predict=48)))
            out[f"greedy {spec} p{i}"] = hashlib.sha256(json.dumps(seq.output).encode()).hexdigest()[:16]
            out[f"greedy {spec} p{i} drafted"] = seq.stats.n_drafted
    return out

if __name__ == "__main__":
    from tandem.config import EngineConfig, SpecConfig, SamplingParams
    from tandem.engine import Engine, Request
    from tandem.models.loader import load_model
    def matmul(t, w, n, k, x, b, bits, th):
        torch.set_num_threads(th)
        return kernels.matmul(t, w, n, k, x, b, bits)
    def dequant(t, w, n, k):
        return kernels.dequantize(t, w, n, k)
    torch.set_num_threads(2)
    res = main(matmul, dequant, load_model, Engine, EngineConfig, SpecConfig, Request, SamplingParams)
    json.dump(res, sys.stdout, indent=1)
