"""Peak resident memory of `tandem serve` against what `tandem check` planned, per configuration.

For each configuration: runs `tandem check` with the server's flags (the plan's total), starts
`tandem serve` with them, sends one short request (warm-up), then fills every slot's context
(a prompt of ctx-size - 64 tokens of this repository's source, 32 tokens generated, greedy, all
slots at once), then reads the server's VmHWM (peak resident set), RssAnon and RssFile from /proc.

    python experiments/memory_check.py --out bench/results/memory [--config NAME ...]

Configurations (--config, repeatable; default all): pair (the default target and draft), target
(alone), parallel4 (the pair, --parallel 4), gemma-mmproj (Gemma 3 270M with a random projector
of Gemma 3's SigLIP shape), head (the target with a random EAGLE-3 head of its shape), and
type-T for each GGUF type file /work/quants/qwen-T.gguf made by experiments/gguf_types.py
(--quants DIR). Writes OUT/report.md and OUT/result.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from common import ROOT, command_line, cpu_line, free_port, post, wait_healthy

GiB, MiB = 1 << 30, 1 << 20
TYPES = ("Q4_K_M", "Q4_0", "Q5_0", "Q5_K_M", "Q8_0", "IQ4_XS", "Q3_K_M", "Q2_K", "F16", "BF16")


def configs(quants: Path, work: Path) -> dict[str, list[str]]:
    """name -> flags for both tandem check and tandem serve (built lazily: some write files)."""
    out = {"pair": ["-m", "default", "-md", "default-draft"],
           "target": ["-m", "default"],
           "parallel4": ["-m", "default", "-md", "default-draft", "--parallel", "4"],
           "gemma-mmproj": ["-m", "gemma3-270m", "--mmproj", str(work / "gemma3-mmproj.gguf")],
           "head": ["-m", "default", "-md", str(work / "head.gguf")]}
    for t in TYPES:  # (Q4_K_M: the default target itself)
        out[f"type-{t}"] = ["-m", "default" if t == "Q4_K_M" else str(quants / f"qwen-{t}.gguf")]
    return out


def make_files(name: str, work: Path) -> None:
    """The random projector or head a configuration names, written once into work."""
    if name == "gemma-mmproj" and not (work / "gemma3-mmproj.gguf").exists():
        subprocess.run([sys.executable, str(ROOT / "experiments/llama_suite/make_mmproj.py"),
                        str(work / "gemma3-mmproj.gguf"), "--siglip"], check=True)
    if name == "head" and not (work / "head.gguf").exists():
        sys.path.insert(0, str(ROOT))
        from types import SimpleNamespace

        from tests import tiny_eagle

        from tandem.models.gguf_file import GGUFFile
        from tandem.models.loader import args_from_gguf
        from tandem.registry import resolve

        g = GGUFFile(resolve("default"))
        a = args_from_gguf(g)
        target = SimpleNamespace(hidden_size=a.dim, num_hidden_layers=a.n_layers,
                                 vocab_size=a.vocab_size)
        # a head of the shape SpecForge trains for this target: one layer of its width
        cfg = tiny_eagle.head_config(target, draft_vocab=32000, intermediate_size=a.ffn_dim,
                                     num_attention_heads=a.n_heads,
                                     num_key_value_heads=a.n_kv_heads, head_dim=a.head_dim,
                                     max_position_embeddings=32768)
        tiny_eagle.write_gguf(cfg, tiny_eagle.head_weights(cfg), work / "head.gguf",
                              tokens=list(g.metadata["tokenizer.ggml.tokens"]))


def random_png(side: int = 896) -> str:
    """A base64 PNG of random pixels."""
    import base64
    import io

    import numpy as np
    from PIL import Image

    px = np.random.default_rng(0).integers(0, 256, (side, side, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(px).save(buf, "PNG")
    return base64.b64encode(buf.getvalue()).decode()


def planned(flags: list[str]) -> tuple[int, str]:
    out = subprocess.run([sys.executable, "-m", "tandem.cli", "check", *flags],
                         capture_output=True, text=True)
    text = out.stdout + out.stderr
    m = re.search(r"^\s*total\s+([\d.]+) (GiB|MiB)", text, re.M)
    if m is None:
        raise SystemExit(f"no total in tandem check's output:\n{text}")
    return int(float(m[1]) * (GiB if m[2] == "GiB" else MiB)), text


def status(pid: int) -> dict[str, int]:
    keys = ("VmHWM", "VmRSS", "RssAnon", "RssFile")
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        k = line.split(":")[0]
        if k in keys:
            out[k] = int(line.split()[1]) * 1024
    return out


def fill(url: str, slots: int, ctx: int, text: str) -> None:
    """Every slot's context filled at once: ctx - 64 prompt tokens, 32 generated."""
    # (a slice: tokenizing the whole text would itself cost the server memory)
    ids = post(url + "/tokenize", {"content": text[:6 * ctx]})["tokens"]
    n = ctx - 64
    ids = (ids * (n // len(ids) + 1))[:n]

    def one(i: int) -> None:
        post(url + "/completion", {"prompt": [(x + i) % 1000 + 100 for x in ids[:1]] + ids[1:],
                                   "n_predict": 32, "temperature": 0, "cache_prompt": False})

    threads = [threading.Thread(target=one, args=(i,)) for i in range(slots)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def measure(name: str, flags: list[str], threads: int) -> dict:
    flags = [*flags, "--threads", str(threads)]
    predicted, check_text = planned(flags)
    slots = int(flags[flags.index("--parallel") + 1]) if "--parallel" in flags else 1
    ctx = int(re.search(r"ctx-size (\d+)", check_text)[1])
    port = free_port()
    srv = subprocess.Popen([sys.executable, "-m", "tandem.cli", "serve", *flags, "--port",
                            str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           env={**os.environ, "LLAMA_MEDIA_MARKER": "<__media__>"})
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, srv, timeout=900)
        loaded = status(srv.pid)
        post(url + "/completion", {"prompt": "def add(a, b):", "n_predict": 16,
                                   "temperature": 0})
        if "--mmproj" in flags:  # one image through the projector
            post(url + "/completion", {"prompt": {"prompt_string": "<__media__>What is this?",
                                                  "multimodal_data": [random_png()]},
                                       "n_predict": 8, "temperature": 0})
        text = "\n".join(p.read_text() for p in sorted((ROOT / "src/tandem").rglob("*.py")))
        fill(url, slots, ctx, text)
        after = status(srv.pid)
    finally:
        srv.terminate()
        srv.wait(timeout=60)
    peak = after["VmHWM"]
    return {"config": name, "flags": flags, "planned": predicted, "peak": peak,
            "loaded": loaded, "after": after, "error": (predicted - peak) / peak,
            "check": check_text}


def report(rows: list[dict], cmd: str) -> str:
    lines = ["# Planned memory against the server's peak", "", f"Command: `{cmd}`", "",
             f"CPU: {cpu_line()}", "",
             "After a warm-up request and every slot's context filled (ctx-size - 64 prompt "
             "tokens, 32 generated). VmHWM: the process's peak resident set; at the end its "
             "anonymous and file-backed parts.", "",
             "| configuration | planned | VmHWM | plan - peak | RSS at load | anon / file at end |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        a = r["after"]
        lines.append(f"| {r['config']} | {r['planned'] / GiB:.2f} GiB | {r['peak'] / GiB:.2f} GiB"
                     f" | {100 * r['error']:+.1f}% | {r['loaded']['VmRSS'] / GiB:.2f} GiB | "
                     f"{a['RssAnon'] / GiB:.2f} / {a['RssFile'] / GiB:.2f} GiB |")
    for r in rows:
        lines += ["", f"## {r['config']}", "", f"`tandem serve {' '.join(r['flags'])}`", "",
                  "```", r["check"].strip(), "```"]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--config", action="append", help="a configuration's name (default: all)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--quants", default="/work/quants", help="where qwen-TYPE.gguf files are")
    a = ap.parse_args()
    work = Path(tempfile.gettempdir()) / "tandem-memory-check"
    work.mkdir(exist_ok=True)
    table = configs(Path(a.quants), work)
    names = a.config or list(table)
    rows = []
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    for name in names:
        make_files(name, work)
        rows.append(measure(name, table[name], a.threads))
        r = rows[-1]
        print(f"{name}: planned {r['planned'] / GiB:.2f} GiB, VmHWM {r['peak'] / GiB:.2f} GiB "
              f"({100 * r['error']:+.1f}%), at load {r['loaded']['VmHWM'] / GiB:.2f}, anon "
              f"{r['after']['RssAnon'] / GiB:.2f}, file {r['after']['RssFile'] / GiB:.2f}",
              flush=True)
        (out / "result.json").write_text(json.dumps(rows, indent=1))
        (out / "report.md").write_text(report(rows, command_line()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
