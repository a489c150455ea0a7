#!/usr/bin/env bash
# Run llama.cpp's own server test suite (tools/server/tests, not committed here) against
# `tandem serve` through shim.py. Usage:
#   experiments/llama_suite/run.sh SUITE_DIR [pytest args...]
# SUITE_DIR is llama.cpp's tools/server/tests (e.g. from the llama-cpp-python 0.3.36 sdist's
# vendor/llama.cpp). Needs a Python with the suite's requirements.txt (SUITE_PYTHON) and
# Tandem's venv first on PATH (TANDEM_BIN, default: `tandem` next to this python).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
suite="$1"; shift
py="${SUITE_PYTHON:-python3}"
export TANDEM_BIN="${TANDEM_BIN:-$(command -v tandem)}"
export LLAMA_SERVER_BIN_PATH="$here/shim.py"
# the API files: fields, status codes, streaming, flags, slots, security, tokenize, infill,
# speculative, context, embeddings, rerank, metrics, templates, agent tools
files="${SUITE_FILES:-test_basic.py test_chat_completion.py test_completion.py test_ctx_shift.py
  test_ignore_eos.py test_infill.py test_security.py test_slot_save.py test_speculative.py
  test_tokenize.py test_template.py test_metrics.py test_kv_keep_only_active.py
  test_embedding.py test_rerank.py test_tools_builtin.py test_compat_anthropic.py
  test_compat_oai_responses.py test_tool_call.py}"
cd "$suite"
mkdir -p tmp
# test_speculative downloads its draft to ./tmp unless the file is there: the shim's target
[ -e tmp/stories15M-q4_0.gguf ] || ln -s "$HOME/.cache/tandem/models/SmolLM2-135M-Instruct.Q4_1.gguf" tmp/stories15M-q4_0.gguf
# the test images the suite downloads, stand-ins made here (plugin.py serves them)
[ -e tmp/stand-in-truck.png ] || "$(dirname "$TANDEM_BIN")/python" -c "
from PIL import Image, ImageOps
ImageOps.mirror(Image.open('../../mtmd/test-1.jpeg')).save('tmp/stand-in-truck.png')"
args=()
for f in $files; do args+=("unit/$f"); done
# as the suite's tests.sh: the slow tests (real models from the hub) only with SLOW_TESTS=1
marks=(); [ "${SLOW_TESTS:-0}" = 1 ] || marks=(-m "not slow")
PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}" exec "$py" -m pytest -p plugin -q -rA "${marks[@]}" "${args[@]}" "$@"
