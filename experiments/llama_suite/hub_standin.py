#!/usr/bin/env python3
"""A stand-in Hugging Face hub on 127.0.0.1 for the three tests of llama.cpp's test_router.py
that need the hub (test_router_remote_preset, test_router_download_model,
test_router_delete_model), so that they run on a machine with no network:

    python experiments/llama_suite/hub_standin.py > /tmp/hub.url &
    MODEL_ENDPOINT=$(head -1 /tmp/hub.url) SUITE_FILES=test_router.py \\
        experiments/llama_suite/run.sh SUITE_DIR -k "remote_preset or download_model or delete_model"

It serves the suite's repo names with local stand-in files (the hub's own are not here):
ggml-org/test-model-router-download's F16 and the preset's models are SmolLM2-135M's GGUF, and
ggml-org/test-preset-ci's preset.ini names the two models the test expects (tinygemma3-preset,
stories260K-test) by hf-repo. It checks Tandem's side of the protocol (the requests, the
events, the cache), not the hub's files. Serves until killed; prints its URL first.
"""
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from tests.hubstub import StandInHub  # noqa: E402

SMOLLM2 = os.path.expanduser("~/.cache/tandem/models/SmolLM2-135M-Instruct.Q4_1.gguf")
PRESET = """version = 1

[tinygemma3-preset]
hf-repo = ggml-org/tinygemma3-GGUF:Q8_0

[stories260K-test]
hf-repo = ggml-org/test-model-stories260K:F32
"""


def main() -> None:
    if not os.path.exists(SMOLLM2):
        sys.exit(f"{SMOLLM2} is not there: tandem models pull smollm2-135m")
    with open(SMOLLM2, "rb") as f:
        model = f.read()
    hub = StandInHub()
    hub.repos["ggml-org/test-model-router-download"] = {
        "test-model-router-download-F16.gguf": model}
    hub.repos["ggml-org/test-preset-ci"] = {"preset.ini": PRESET.encode()}
    hub.repos["ggml-org/tinygemma3-GGUF"] = {"tinygemma3-Q8_0.gguf": model}
    hub.repos["ggml-org/test-model-stories260K"] = {"stories260K-F32.gguf": model}
    print(hub.url, flush=True)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
