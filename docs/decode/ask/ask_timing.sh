#!/bin/bash
# locked: index for a 12-page subset of the Python docs, the local stack, 1 warm-up + 3 asks per mode
cd /work/wt17
S=/work/main/.venv/bin/streamrag
export PYTHONPATH=/work/wt17 STREAMRAG_RUN_DIR=/tmp/ask-run
echo "lock acquired $(date -u +%T) $(uptime)"
$S index build --source /tmp/ask-corpus --out /tmp/ask-index --quiet 2>&1 | tail -3
echo "index built $(date -u +%T)"
$S up --corpus-root /tmp/ask-corpus --index /tmp/ask-index --free-ports 2>&1 | tail -5
echo "stack up $(date -u +%T) $(uptime)"
Q="How do I count how often each word occurs in a list?"
$S ask "$Q" --retriever anns --max-tokens 256 --speculation off --json > out/ask/warmup.json 2>&1
for i in 1 2 3; do
  for m in off auto; do
    $S ask "$Q" --retriever anns --max-tokens 256 --speculation $m --json > out/ask/$m-$i.json 2>&1
    echo "$m $i $(date -u +%T) $(python3 -c "import json,sys;d=json.load(open('out/ask/$m-$i.json'));print(d['total_s'],d['ttft_from_question_s'],len(d['answer']))" 2>&1)"
  done
done
echo "asks end $(date -u +%T) $(uptime)"
$S status > out/ask/status.txt 2>&1 
$S down 2>&1 | tail -2 
echo "end $(date -u +%T) $(uptime)"
