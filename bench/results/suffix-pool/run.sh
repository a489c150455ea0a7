#!/bin/bash
set -u
cd /work/main; . .venv/bin/activate
OUT=/tmp/pool; mkdir -p $OUT
COMMON="--model default --model-draft default-draft --ctx-size 4096 --parallel 1 --threads 2 --host 127.0.0.1"
python -m tandem.cli serve $COMMON --spec-type auto --spec-suffix-pool 32768 --port 8114 > $OUT/pool.server.log 2>&1 &
until curl -sf http://127.0.0.1:8114/health >/dev/null; do sleep 2; done
python -m tandem.cli serve $COMMON --spec-type none --port 8111 > $OUT/alone.server.log 2>&1 &
until curl -sf http://127.0.0.1:8111/health >/dev/null; do sleep 2; done
run() { python -I scripts/speculative-benchmark.py --label $1 --output $OUT/$1.pass$3.json --url http://127.0.0.1:$2 --passes 1 --warmup 0 --n-predict 256 --prompts bench/prompts/held-out-mix.jsonl > /dev/null; echo "$1 pass $3 done $(date +%T)"; }
run pool 8114 0; run alone 8111 0; run alone 8111 1; run pool 8114 1
pkill -f 'port 811[14]'
echo finished $(date)
