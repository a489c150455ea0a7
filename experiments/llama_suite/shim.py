#!/usr/bin/env python3
"""Stand in for the llama-server binary under llama.cpp's own server test suite.

llama.cpp's `tools/server/tests/utils.py` starts the binary named by LLAMA_SERVER_BIN_PATH
with llama-server's flags. This shim passes every flag through to `tandem serve` unchanged,
except the model download flags (`--hf-repo`, `--hf-file`, `--model-url`), which name models
that no machine here can fetch: each suite model is replaced by a local one of the same kind.
The suite's router preset (no model at all: llama-server then serves the models of its cache)
gets --models-preset with the cache's model names, each its stand-in (router_preset).
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


# the suite's router tests name the models of llama-server's cache (the hub's, downloaded by
# its other presets): a preset whose sections are those names, each a local stand-in above
CACHE_MODELS = ("ggml-org/tinygemma3-GGUF:Q8_0", "ggml-org/test-model-stories260K:F32",
                "ggml-org/test-model-stories260K-infill:F32")
ROUTER_PRESET = os.path.expanduser("~/.cache/tandem/suite/router-cache.ini")


def router_preset() -> str:
    """llama-server's router with no models given serves its cache; Tandem's serves a preset:
    the cache's names, each its stand-in's file (tinygemma3 with its projector)."""
    python = os.path.join(os.path.dirname(TANDEM), "python")
    stand_in = {m: next(local for key, local in REPLACE if key in m) for m in CACHE_MODELS}
    names = sorted(set(stand_in.values()))
    paths = subprocess.run([python, "-c", "import sys\nfrom tandem.registry import resolve\n"
                            "for n in sys.argv[1:]: print(resolve(n))", *names],
                           check=True, capture_output=True, text=True).stdout.split()
    path = dict(zip(names, paths))
    sections = []
    for model in CACHE_MODELS:
        local = stand_in[model]
        extra = f"mmproj = {mmproj()}\n" if local == "gemma3-270m" else ""
        sections.append(f"[{model}]\nmodel = {path[local]}\n{extra}")
    os.makedirs(os.path.dirname(ROUTER_PRESET), exist_ok=True)
    with open(ROUTER_PRESET + ".partial", "w") as f:
        f.write("\n".join(sections))
    os.replace(ROUTER_PRESET + ".partial", ROUTER_PRESET)
    return ROUTER_PRESET


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
    router = not ({"--model", "-m", "--models-dir", "--models-preset"} & set(out))
    if model_hint is None and router:  # the suite's router preset: no model at all
        out = ["--models-preset", router_preset(), *out]
    elif "--model" not in out and "-m" not in out and model_hint is not None:
        # a download is replaced by its local stand-in
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
