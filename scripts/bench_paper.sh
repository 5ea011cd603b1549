#!/usr/bin/env bash
# The Stream2LLM evaluation (paper section 6) re-done on this machine: synthesized crawler and
# ANNS traces, a load sweep for each (streaming vs non-streaming, same run), and the memory-
# pressure ablation (every policy x every eviction mode on a small device KV pool).
#
#   bash scripts/bench_paper.sh [OUT_DIR] [STEP...]
#   steps: traces crawler crawler-high anns pressure-crawler pressure-anns anns-t10 peer peer-t1 anns-vllm
#   (default: all but anns-t10, a sensitivity check, and the peer and *-vllm steps, which need vLLM:
#   SR=/opt/vllm-venv/bin/streamrag, docs/vllm.md). SEED=S sets the arrival seed (default 0).
#
# Scaling (docs/results.md, "Streaming against not streaming"): tokens x0.05 and time x3 keep the
# paper's ratios of prefill time to retrieval time and of step time to chunk gap on this CPU and
# the embedded model; the QPS levels are the paper's divided by 3 (same utilisation); the token
# budget per step is the paper's 2048-8192 x 0.05, a block multiple. About 85 minutes in all
# on a 2-core machine. Every step writes summary.json, report.md, requests.jsonl and PNG plots.
set -euo pipefail
cd "$(dirname "$0")/.."

OUT=${1:-out/paper-study}
shift || true
STEPS=${*:-traces crawler crawler-high anns pressure-crawler pressure-anns}
QUERIES=${QUERIES:-30}
SR=${SR:-.venv/bin/streamrag}
# The traces draw passages from the default index's store; PASSAGES=FILE names another passages.sqlite
# (for example one written without embedding the corpus), which gives the same traces for the same corpus.
SYNTH=(${PASSAGES:+--passages "$PASSAGES"})
COMMON=(--token-budget 256 --dtype auto --seed "${SEED:-0}")   # auto: bf16 where the CPU has it, else fp32
mkdir -p "$OUT"

for step in $STEPS; do
  echo "== $step"
  case $step in
    traces)
      $SR trace synth "${SYNTH[@]}" --workload crawler --queries "$QUERIES" --token-scale 0.05 --time-scale 3 --seed 1 \
        --out "$OUT/crawler.jsonl"
      $SR trace synth "${SYNTH[@]}" --workload anns --queries "$QUERIES" --token-scale 0.05 --time-scale 3 --seed 1 \
        --out "$OUT/anns.jsonl"
      # 120 queries: at high load the arrivals must outlast a query's 30 s retrieval (steady state)
      $SR trace synth "${SYNTH[@]}" --workload crawler --queries 120 --token-scale 0.05 --time-scale 3 --seed 2 \
        --out "$OUT/crawler-120.jsonl"
      # the same queries at the paper's own timing (time x1): the paper's QPS 4 saturates this CPU with it
      $SR trace synth "${SYNTH[@]}" --workload crawler --queries 120 --token-scale 0.05 --time-scale 1 --seed 2 \
        --out "$OUT/crawler-120-t1.jsonl" ;;
    crawler)            # paper QPS 0.5, 1, 2, 4
      $SR bench replay --trace "$OUT/crawler.jsonl" --qps 0.167 --qps 0.333 --qps 0.667 --qps 1.333 \
        --policies fcfs --eviction cost "${COMMON[@]}" --out "$OUT/crawler" ;;
    crawler-high)       # paper QPS 4 and 5, in steady state
      $SR bench replay --trace "$OUT/crawler-120.jsonl" --qps 1.333 --qps 1.667 \
        --policies fcfs --eviction cost "${COMMON[@]}" --out "$OUT/crawler-high" ;;
    anns-t10)           # sensitivity: ANNS with time x10 (windows 3.3x longer against a step), paper QPS 2
      $SR trace synth "${SYNTH[@]}" --workload anns --queries "$QUERIES" --token-scale 0.05 --time-scale 10 --seed 1 \
        --out "$OUT/anns-t10.jsonl"
      $SR bench replay --trace "$OUT/anns-t10.jsonl" --qps 0.2 \
        --policies fcfs --eviction cost "${COMMON[@]}" --out "$OUT/anns-t10" ;;
    peer)               # ours (native, and our fcfs inside vLLM) against vLLM-S and vLLM-NS (vllm + default),
                        # crawler at high load; eviction: cost on native, recompute on vllm (the defaults)
      $SR bench replay --trace "$OUT/crawler-120.jsonl" --qps 1.333 --engine native,vllm \
        --policies default,fcfs "${COMMON[@]}" --out "$OUT/peer" ;;
    peer-t1)            # our fcfs inside vLLM against vLLM-S and vLLM-NS, crawler at the paper's timing:
                        # QPS 4 (the paper's high load: saturating here) and 8 (past saturation)
      $SR bench replay --trace "$OUT/crawler-120-t1.jsonl" --qps 4 --qps 8 --engine vllm \
        --policies default,fcfs "${COMMON[@]}" --out "$OUT/peer-t1" ;;
    anns-vllm)          # the same on ANNS, paper QPS 0.5, 1, 2
      $SR bench replay --trace "$OUT/anns.jsonl" --qps 0.167 --qps 0.333 --qps 0.667 --engine vllm \
        --policies default,fcfs "${COMMON[@]}" --out "$OUT/anns-vllm" ;;
    anns)               # paper QPS 0.5, 1, 2
      $SR bench replay --trace "$OUT/anns.jsonl" --qps 0.167 --qps 0.333 --qps 0.667 \
        --policies fcfs --eviction cost "${COMMON[@]}" --out "$OUT/anns" ;;
    pressure-crawler)   # paper: crawler at QPS 4 under memory pressure (here: a pool below the resident peak)
      $SR bench replay --trace "$OUT/crawler.jsonl" --qps 1.333 --kv-device-blocks "${CRAWLER_BLOCKS:-256}" \
        --policies default,fcfs,lcas,mcps --eviction recompute,swap,cost "${COMMON[@]}" \
        --out "$OUT/pressure-crawler" ;;
    pressure-anns)      # paper: ANNS at QPS 2, gaps x30 under memory pressure (here: gaps x10 and a small pool)
      $SR bench replay --trace "$OUT/anns.jsonl" --qps 0.667 --kv-device-blocks "${ANNS_BLOCKS:-160}" \
        --delay-multiplier "${ANNS_DELAY:-10}" \
        --policies default,fcfs,lcas,mcps --eviction recompute,swap,cost "${COMMON[@]}" \
        --out "$OUT/pressure-anns" ;;
    *) echo "unknown step: $step" >&2; exit 2 ;;
  esac
done
