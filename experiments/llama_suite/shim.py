#!/usr/bin/env python3
"""Stand in for the llama-server binary under llama.cpp's own server test suite.

llama.cpp's `tools/server/tests/utils.py` starts the binary named by LLAMA_SERVER_BIN_PATH
with llama-server's flags. This shim passes every flag through to `tandem serve` unchanged,
except the model download flags (`--hf-repo`, `--hf-file`, `--model-url`), which name models
that no machine here can fetch: each suite model is replaced by a local one of the same kind.
Nothing else is dropped or rewritten, so an unsupported flag fails the test as it should.

Usage: LLAMA_SERVER_BIN_PATH=experiments/llama_suite/shim.py pytest ... (see run.sh)
"""
import os
import subprocess
import sys

TANDEM = os.environ.get("TANDEM_BIN", os.path.join(os.path.dirname(sys.executable), "tandem"))

# suite model (hf repo or file substring) -> local model name known to `tandem models`
REPLACE = [
    ("infill", "default-draft"),  # fill-in-the-middle needs FIM tokens: Qwen2.5-Coder-0.5B
    ("tinygemma3", "gemma3-270m"),
    ("Qwen2.5", "default"),  # test_tool_call's slow Qwen2.5 models: Qwen2.5-Coder-1.5B
    ("jina-reranker", "reranker"),  # SmolLM2-135M made a reranker: make_reranker.py
    ("", "smollm2-135m"),  # everything else: stories260K, stories15M_MOE, bert
]
SMOLLM2 = os.path.expanduser("~/.cache/tandem/models/SmolLM2-135M-Instruct.Q4_1.gguf")
RERANKER = os.path.expanduser("~/.cache/tandem/suite/smollm2-135m-reranker.gguf")
MMPROJ = os.path.expanduser("~/.cache/tandem/suite/gemma3-270m-mmproj.gguf")


def mmproj() -> str:
    """A random Gemma 3 projector into Gemma 3 270M (tinygemma3's comes from the hub with its
    model, as llama-server fetches a repo's mmproj): make_mmproj.py, made once."""
    if not os.path.exists(MMPROJ):
        os.makedirs(os.path.dirname(MMPROJ), exist_ok=True)
        python = os.path.join(os.path.dirname(TANDEM), "python")
        subprocess.run([python, os.path.join(os.path.dirname(__file__), "make_mmproj.py"),
                        MMPROJ + ".partial"], check=True)
        os.replace(MMPROJ + ".partial", MMPROJ)
    return MMPROJ


def reranker() -> str:
    """SmolLM2-135M-Instruct with a yes/no classification head, made once."""
    if not os.path.exists(RERANKER):
        os.makedirs(os.path.dirname(RERANKER), exist_ok=True)
        python = os.path.join(os.path.dirname(TANDEM), "python")
        subprocess.run([python, os.path.join(os.path.dirname(__file__), "make_reranker.py"),
                        SMOLLM2, RERANKER + ".partial"], check=True)
        os.replace(RERANKER + ".partial", RERANKER)
    return RERANKER


def main(argv):
    out, model_hint, i = [], None, 0
    while i < len(argv):
        arg = argv[i]
        if arg in ("--hf-repo", "-hfr", "--hf-file", "-hff", "--model-url", "-mu"):
            model_hint = (model_hint or "") + " " + argv[i + 1]
            i += 2
            continue
        out.append(arg)
        i += 1
    if "--model" not in out and "-m" not in out:
        # a download is replaced by its local stand-in; the suite's multi-model "router"
        # preset (no model at all) gets the small model too: Tandem serves one model
        name = next(local for key, local in REPLACE if key in (model_hint or ""))
        name = reranker() if name == "reranker" else name
        out = ["--model", name, *out]
        if name == "gemma3-270m" and "--no-mmproj" not in out:  # the hub's repo has one
            out = ["--mmproj", mmproj(), *out]
    sys.stderr.write(f"shim: tandem serve {' '.join(out)}\n")
    sys.stderr.flush()
    os.execv(TANDEM, [TANDEM, "serve", *out])


if __name__ == "__main__":
    main(sys.argv[1:])
