"""Every GGUF type a llama-server user brings: Tandem and llama.cpp's llama-server on the same file.

For each type the file is made from the source model with llama.cpp's
`llama-quantize --allow-requantize SRC OUT TYPE 2` (kept if OUT exists; Q4_K_M of the default
source is the source itself), then served twice at once, target alone, same threads and context:
`tandem serve --spec-type none` and `llama-server`. The same POST /completion (greedy,
cache_prompt false, so every request reads its whole prompt again) goes to both in turns, Tandem
then llama.cpp, so that a noisy neighbour slows them alike; one warm-up request each is not
counted. One type at a time: both servers started, measured, stopped.

    python experiments/gguf_types.py \
        --types Q4_K_M,Q4_0,Q5_K_M,Q8_0,IQ4_XS,Q3_K_M,F16,Q2_K,Q5_0,BF16 \
        --src ~/.cache/tandem/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf \
        --quant-dir /work/quants --llama-bin /work/suite/lbuild/bin \
        --rounds 5 --n-predict 64 --out /tmp/gguf-types

Then (--greedy-check, on by default) Tandem's greedy chat answers to three short prompts with
speculation (`tandem generate -md default-draft`, `auto`) against the target alone: equal?

Per type: median (min-max) decode and prompt tok/s of each server (their own `timings`), the
ratios Tandem / llama.cpp of the medians, Tandem's VmRSS and VmHWM after the warm-up (of the
python process that holds the model), the file's size, whether Tandem's VmHWM stays within the
file + 600 MiB, and whether the two servers' first texts are equal (informational: the two
engines round differently). Writes OUT/results.json (every request's timings), OUT/report.md and
OUT/servers.log (both servers' output).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import statistics
import subprocess
import sys
from pathlib import Path

from common import ROOT, command_line, cpu_line, free_port, post, serving, spread

DEFAULT_SRC = Path.home() / ".cache/tandem/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
SRC_TYPE = "Q4_K_M"  # the default source's own type: served as it is
GIB, MIB = 1024 ** 3, 1024 ** 2
BUDGET = 600 * MIB  # the memory a server may hold beyond its file


def prompt_text() -> str:
    """About 500 tokens of real text: an instruction and the start of a C file of this repo."""
    code = (ROOT / "src/tandem/kernels/matmul.c").read_text()[:2000]
    return f"Explain what this C code does:\n{code}"


def model_file(typ: str, src: Path, quant_dir: Path, llama_bin: Path, log: Path,
               imatrix: Path | None = None) -> Path:
    """The GGUF file of type typ: the source itself for its own type, else quant_dir/qwen-TYPE.gguf,
    made by llama-quantize when it is not there yet (with the importance matrix `imatrix`,
    which llama-quantize requires for IQ1_* and IQ2_*)."""
    if typ == SRC_TYPE and src.resolve() == DEFAULT_SRC.resolve():
        return src
    out = quant_dir / f"qwen-{typ}.gguf"
    if not out.exists():
        quant_dir.mkdir(parents=True, exist_ok=True)
        print(f"{typ}: quantizing {src} -> {out}", flush=True)
        with open(log, "a", encoding="utf-8") as f:
            im = ["--imatrix", str(imatrix)] if imatrix else []
            subprocess.run([str(llama_bin / "llama-quantize"), "--allow-requantize", *im,
                            str(src), str(out), typ, "2"], stdout=f, stderr=subprocess.STDOUT,
                           check=True)
    return out


def model_pid(port: int) -> int:
    """The pid of the tandem serve process listening on port: the python process whose command
    line runs tandem.cli serve with that --port (the model lives in it; no wrapper, no child)."""
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            args = (d / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if "tandem.cli" in args and "serve" in args and str(port) in args:
            return int(d.name)
    raise RuntimeError(f"no tandem serve process on port {port}")


def memory(pid: int) -> dict:
    """VmRSS and VmHWM of pid, in bytes (from /proc/PID/status)."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, val = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(val.split()[0]) * 1024
    return out


def ask(url: str, prompt: str, n_predict: int) -> dict:
    """One /completion request: its timings and text."""
    res = post(url + "/completion", {"prompt": prompt, "n_predict": n_predict, "temperature": 0,
                                      "cache_prompt": False, "seed": 0})
    t = res["timings"]
    return {"timings": {k: t[k] for k in ("prompt_n", "prompt_per_second", "predicted_n",
                                          "predicted_per_second")},
            "content": res["content"]}


def measure(path: Path, a: argparse.Namespace, log: Path) -> dict:
    """Both servers on path at once; a warm-up request each, then a.rounds in turns."""
    pt, pl = free_port(), free_port()
    common = ["-m", str(path), "-t", str(a.threads), "-c", str(a.ctx)]
    tandem = [sys.executable, "-m", "tandem.cli", "serve", *common, "--spec-type", "none",
              *shlex.split(a.tandem_args), "--port", str(pt)]
    llama = [str(a.llama_bin / "llama-server"), *common, "--port", str(pl)]
    os.environ["LD_LIBRARY_PATH"] = ":".join(
        p for p in (str(a.llama_bin), os.environ.get("LD_LIBRARY_PATH")) if p)
    prompt = prompt_text()
    with contextlib.ExitStack() as stack:
        urls = {}
        for name, cmd, port in (("tandem", tandem, pt), ("llama", llama, pl)):
            try:
                urls[name] = stack.enter_context(serving(cmd, port, log))
            except (RuntimeError, TimeoutError) as e:  # say which server
                raise RuntimeError(f"{name}: {e}") from e
        first = {k: ask(u, prompt, a.n_predict) for k, u in urls.items()}
        pid = model_pid(pt)
        mem = memory(pid)
        runs: dict[str, list[dict]] = {k: [] for k in urls}
        for r in range(a.rounds):
            for k, u in urls.items():
                runs[k].append(ask(u, prompt, a.n_predict))
                t = runs[k][-1]["timings"]
                print(f"  round {r + 1}/{a.rounds} {k}: prompt {t['prompt_n']} tok "
                      f"{t['prompt_per_second']:.1f} tok/s, decode {t['predicted_n']} tok "
                      f"{t['predicted_per_second']:.2f} tok/s", flush=True)
    return {"file": str(path), "file_bytes": path.stat().st_size, "tandem_pid": pid,
            "memory": mem, "warmup": first, "runs": runs,
            "same_first_text": first["tandem"]["content"] == first["llama"]["content"]}


GREEDY_PROMPTS = [  # short chat requests for the greedy check (speculation on and off)
    "Write a Python function that merges two sorted lists into one sorted list.",
    "Rename the variable `tmp` to `total` everywhere in this code:\n"
    "def f(xs):\n    tmp = 0\n    for x in xs:\n        tmp += x\n    return tmp\n",
    "List the HTTP methods and what each is for, one line each.",
]


def greedy_check(path: Path, a: argparse.Namespace) -> dict:
    """Tandem's greedy text on path with speculation (`auto` with the default draft model)
    against the target alone, per prompt of GREEDY_PROMPTS: equal, and how much was drafted."""
    out = {}
    for i, prompt in enumerate(GREEDY_PROMPTS):
        texts = {}
        for name, flags in (("alone", ["--spec-type", "none"]), ("spec", ["-md", "default-draft"])):
            cmd = [sys.executable, "-m", "tandem.cli", "generate", "-m", str(path), "-t",
                   str(a.threads), "-n", str(a.n_predict), "--temp", "0", "--chat", "--json",
                   "-p", prompt, *flags]
            res = json.loads(subprocess.run(cmd, capture_output=True, text=True,
                                            check=True).stdout)
            texts[name] = res
        out[f"prompt {i}"] = {"equal": texts["alone"]["content"] == texts["spec"]["content"],
                              "tokens": texts["alone"]["timings"]["predicted_n"],
                              "drafted": texts["spec"]["timings"].get("draft_n")}
    return out


def row(typ: str, res: dict) -> str:
    """The report's table row of one type."""
    if "error" in res:
        return f"| {typ} | | failed: {res['error']} | | | | | | | | | | |"
    med = {}
    cells = []
    for key, digits in (("predicted_per_second", 2), ("prompt_per_second", 1)):
        for k in ("tandem", "llama"):
            xs = [x["timings"][key] for x in res["runs"][k]]
            med[k] = statistics.median(xs)
            cells.append(spread(xs, digits))
        cells.append(f"{med['tandem'] / med['llama']:.2f}" if med["llama"] else "-")
    size, mem = res["file_bytes"], res["memory"]
    met = "yes" if mem["VmHWM"] <= size + BUDGET else "no"
    greedy = res.get("greedy")
    same = (f"{sum(g['equal'] for g in greedy.values())}/{len(greedy)}" if greedy else "-")
    return (f"| {typ} | {size / GIB:.2f} | " + " | ".join(cells)
            + f" | {mem['VmRSS'] / GIB:.2f} | {mem['VmHWM'] / GIB:.2f} | {met} | "
            + ("yes" if res["same_first_text"] else "no") + f" | {same} |")


def prompt_note(results: dict) -> str:
    """Which prompt token counts each server reported: one count per server, the same in every
    request, means no request reused a cached prefix (cache_prompt false honoured)."""
    seen = {k: sorted({x["timings"]["prompt_n"] for r in results.values() if "runs" in r
                       for x in [r["warmup"][k], *r["runs"][k]]}) for k in ("tandem", "llama")}
    return ("Prompt tokens read per request (every request, warm-up included): "
            + "; ".join(f"{k}: {', '.join(map(str, v)) or '-'}" for k, v in seen.items()) + ".")


def report(a: argparse.Namespace, results: dict, cmd: str) -> str:
    lines = ["# Every GGUF type: Tandem against llama-server, target alone", "",
             f"CPU: {cpu_line()}", "", f"Command: `{cmd}`", "",
             f"Source: `{a.src}`; {a.threads} threads, context {a.ctx}; {a.n_predict} tokens "
             f"generated, greedy, cache_prompt false; {a.rounds} rounds after 1 warm-up each, "
             "the servers in turns (Tandem, llama.cpp, ...), both running at once.", "",
             prompt_note(results), "",
             "Speeds: median (min-max) tok/s of the servers' own `timings`; ratios: Tandem / "
             "llama.cpp of the medians. RSS: Tandem's model process after the warm-up; budget: "
             "VmHWM within file + 600 MiB. Same text: the warm-up outputs of the two engines "
             "equal (informational: they round differently). Greedy: Tandem's chat answers "
             "with speculation (the default draft model, `auto`) equal to the target alone's, "
             "per prompt (`--greedy-check`).", "",
             "| type | file GiB | Tandem decode | llama decode | decode ratio | Tandem prompt | "
             "llama prompt | prompt ratio | Tandem RSS GiB | VmHWM GiB | file+600MiB met | "
             "same text | greedy |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    lines += [row(typ, res) for typ, res in results.items()]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--types", default="Q4_K_M,Q4_0,Q5_K_M,Q8_0,IQ4_XS,Q3_K_M,F16,Q2_K,Q5_0,BF16")
    ap.add_argument("--src", type=Path, default=DEFAULT_SRC)
    ap.add_argument("--quant-dir", type=Path, default=Path("/work/quants"))
    ap.add_argument("--llama-bin", type=Path, default=Path("/work/suite/lbuild/bin"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--n-predict", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--greedy-check", action=argparse.BooleanOptionalAction, default=True,
                    help="also compare Tandem's greedy text with and without speculation")
    ap.add_argument("--imatrix", type=Path, default=None,
                    help="an importance matrix for llama-quantize (llama-imatrix's output; "
                         "IQ1_* and IQ2_* need one)")
    ap.add_argument("--tandem-args", default="",
                    help="more flags for tandem serve, e.g. \"--activations mixed\"")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    a.src, a.quant_dir = a.src.expanduser(), a.quant_dir.expanduser()
    a.out.mkdir(parents=True, exist_ok=True)
    log, cmd = a.out / "servers.log", command_line()
    results: dict[str, dict] = {}
    for typ in a.types.split(","):
        print(f"{typ}:", flush=True)
        try:
            path = model_file(typ, a.src, a.quant_dir, a.llama_bin, log, a.imatrix)
            results[typ] = measure(path, a, log)
            if a.greedy_check:
                results[typ]["greedy"] = greedy_check(path, a)
                print(f"  greedy: {results[typ]['greedy']}", flush=True)
        except (OSError, RuntimeError, KeyError, ValueError,
                subprocess.CalledProcessError) as e:  # one type failing leaves the others
            results[typ] = {"error": f"{type(e).__name__}: {e}"}
            print(f"  {typ} failed: {results[typ]['error']}", flush=True)
        (a.out / "results.json").write_text(json.dumps(
            {"command": cmd, "cpu": cpu_line(), "src": str(a.src), "threads": a.threads,
             "ctx": a.ctx, "n_predict": a.n_predict, "rounds": a.rounds,
             "prompt": prompt_text(), "types": results}, indent=1))
        (a.out / "report.md").write_text(report(a, results, cmd))
    print(report(a, results, cmd))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
