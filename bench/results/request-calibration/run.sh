#!/bin/bash
# A/B: Tandem alone, auto at 2553e1a (old tree), auto with this tree; held-out mix, passes rotated
set -u
cd /work/main; . .venv/bin/activate
OUT=${OUT:-/tmp/ab/out}; mkdir -p $OUT
COMMON="--model default --model-draft default-draft --ctx-size 4096 --parallel 1 --threads 2 --host 127.0.0.1"
python -m tandem.cli serve $COMMON --spec-type none --port 8101 > $OUT/alone.server.log 2>&1 &
PYTHONPATH=/tmp/oldtree/src python -m tandem.cli serve $COMMON --spec-type auto --port 8102 > $OUT/old.server.log 2>&1 &
python -m tandem.cli serve $COMMON --spec-type auto --port 8103 > $OUT/new.server.log 2>&1 &
for p in 8101 8102 8103; do until curl -sf http://127.0.0.1:$p/health >/dev/null; do sleep 2; done; done
echo "servers up $(date)"
run() { python -I scripts/speculative-benchmark.py --label $1 --output $OUT/$1.pass$3.json --url http://127.0.0.1:$2 --passes 1 --warmup 0 --n-predict 256 --prompts bench/prompts/held-out-mix.jsonl > /dev/null; echo "$1 pass $3 done $(date +%T)"; }
run alone 8101 0; run old 8102 0; run new 8103 0
run new 8103 1; run old 8102 1; run alone 8101 1
[ "${PASSES:-2}" -gt 2 ] && { run old 8102 2; run alone 8101 2; run new 8103 2; }
pkill -f 'port 810[123]'
echo finished $(date)
