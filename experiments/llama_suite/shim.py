#!/usr/bin/env python3
"""Stand in for the llama-server binary under llama.cpp's own server test suite.

llama.cpp's `tools/server/tests/utils.py` starts the binary named by LLAMA_SERVER_BIN_PATH
with llama-server's flags. This shim passes every flag through to `tandem serve` unchanged,
except the model download flags (`--hf-repo`, `--hf-file`, `--model-url`), which name models
that no machine here can fetch: each suite model is replaced by a local one of the same kind.
The suite's router preset (no model at all: llama-server then serves the models of its cache)
finds the cache's models, each linked to its stand-in (router_cache), and an empty preset. A
preset repo of the hub (`--hf-repo` of PRESET_REPOS: router mode on its preset.ini) passes
through unchanged: Tandem downloads it as llama-server does, so it needs the hub.
Nothing else is dropped or rewritten, so an unsupported flag fails the test as it should.

Usage: LLAMA_SERVER_BIN_PATH=experiments/llama_suite/shim.py pytest ... (see run.sh)
"""
import hashlib
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
# its other presets): the cache is written with those names, each a link to its stand-in above
CACHE_MODELS = {"ggml-org/tinygemma3-GGUF:Q8_0": "tinygemma3-Q8_0.gguf",
                "ggml-org/test-model-stories260K:F32": "stories260K-F32.gguf",
                "ggml-org/test-model-stories260K-infill:F32": "stories260K-infill-F32.gguf"}
EMPTY_PRESET = os.path.expanduser("~/.cache/tandem/suite/router-empty.ini")
PRESET_REPOS = ("ggml-org/test-preset-ci",)  # test_router_remote_preset's


def router_cache() -> None:
    """llama-server's router with no models given serves its cache ($LLAMA_CACHE, which the
    suite sets to tmp/, in the hub's layout): the cache's names, each linked to its stand-in's
    file (tinygemma3 with its projector), which Tandem's router reads (server/router/hfcache.py)."""
    python = os.path.join(os.path.dirname(TANDEM), "python")
    stand_in = {m: next(local for key, local in REPLACE if key in m) for m in CACHE_MODELS}
    names = sorted(set(stand_in.values()))
    paths = subprocess.run([python, "-c", "import sys\nfrom tandem.registry import resolve\n"
                            "for n in sys.argv[1:]: print(resolve(n))", *names],
                           check=True, capture_output=True, text=True).stdout.split()
    path = dict(zip(names, paths))
    root = os.environ.get("LLAMA_CACHE") or os.path.expanduser("~/.cache/huggingface/hub")
    for model, file in CACHE_MODELS.items():
        repo = model.split(":")[0]
        commit = hashlib.sha1(repo.encode()).hexdigest()
        d = os.path.join(root, "models--" + repo.replace("/", "--"))
        snap = os.path.join(d, "snapshots", commit)
        os.makedirs(snap, exist_ok=True)
        os.makedirs(os.path.join(d, "refs"), exist_ok=True)
        with open(os.path.join(d, "refs", "main"), "w") as f:
            f.write(commit)
        links = {file: path[stand_in[model]]}
        if stand_in[model] == "gemma3-270m":
            links["mmproj-tinygemma3.gguf"] = mmproj()
        for name, target in links.items():
            link = os.path.join(snap, name)
            if not os.path.lexists(link):
                os.symlink(target, link)


def empty_preset() -> str:
    """Tandem's router starts with --models-dir or --models-preset: an empty preset (the
    cache's models only, as llama-server with neither)."""
    os.makedirs(os.path.dirname(EMPTY_PRESET), exist_ok=True)
    with open(EMPTY_PRESET, "w") as f:
        f.write("; llama-server's cache only\n")
    return EMPTY_PRESET


def main(argv):
    out, model_hint, i = [], None, 0
    while i < len(argv):
        arg = argv[i]
        if arg in ("--hf-repo", "-hfr") and argv[i + 1] in PRESET_REPOS:
            out += argv[i:i + 2]
            i += 2
            continue
        if arg in ("--hf-repo", "-hfr", "--hf-file", "-hff", "--model-url", "-mu"):
            model_hint = (model_hint or "") + " " + argv[i + 1]
            i += 2
            continue
        out.append(arg)
        i += 1
    router = not ({"--model", "-m", "--models-dir", "--models-preset", "--hf-repo", "-hfr"}
                  & set(out))
    if model_hint is None and (router or "--models-preset" in out):  # the router preset
        router_cache()
        if router:
            out = ["--models-preset", empty_preset(), *out]
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
