#!/usr/bin/env bash
# The HTTP fuzzing of tests/test_http_fuzz.py with SCALE times its examples (default 20: 240
# per route and mode from the OpenAPI description, 2,400 per endpoint of random field values),
# the counts of answers by status written to OUT (default bench/results/fuzz-http/report.json).
#   experiments/fuzz_http.sh [SCALE] [OUT]
set -euo pipefail
cd "$(dirname "$0")/.."
scale="${1:-20}"; out="${2:-bench/results/fuzz-http/report.json}"
mkdir -p "$(dirname "$out")"
start=$(date +%s)
TANDEM_FUZZ_SCALE="$scale" TANDEM_FUZZ_REPORT="$out" python -m pytest -q -p no:cacheprovider \
  tests/test_http_fuzz.py
echo "fuzz_http: scale $scale, $(( $(date +%s) - start )) s; counts in $out"
