#!/usr/bin/env bash
# "Streaming never loses" (issue 13): streaming against non-streaming with the product's
# defaults (fcfs, cost eviction, speculative tier, stability hints, stable document order),
# and the same with those three features off ("before"), each with three arrival seeds.
# Uses the traces of `scripts/bench_paper.sh OUT traces` (made here if missing; PASSAGES=FILE as there).
#
#   bash scripts/bench_never_loses.sh [OUT_DIR] [STEP...]
#   steps: anns anns-before crawler-high crawler-high-before  (default: these four)
#          anns-sweep crawler-sweep    the other QPS levels of the paper's load sweep (fcfs, cost);
#          anns-low anns-high          anns-sweep's two levels (QPS 0.167, 0.667) one at a time
#          pressure-anns pressure-crawler   fcfs under memory pressure, every eviction mode
#          anns-t10                    sensitivity: ANNS with time x10 (windows 3.3x longer than a step)
#   SEEDS="0 1 2" by default; each (step, seed) writes OUT/<step>/seed-<s>/, and
#   OUT/<step>/seeds.md holds the median and min-max spread over the seeds (load_tests/seeds.py).
#   A variant of the defaults: EXTRA="--speculative-share 0.25" TAG=share025 adds those flags to every
#   run and writes OUT/<step>-<TAG>/ instead (the flags come last, so they win).
# Holds /tmp/streamrag-cpu.lock for the whole run (so two benchmarks never share the cores and
# no other job runs between seeds); STREAMRAG_CPU_LOCKED=1 means the caller already holds it.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ "${STREAMRAG_CPU_LOCKED:-}" != 1 ]]; then
  exec flock /tmp/streamrag-cpu.lock env STREAMRAG_CPU_LOCKED=1 bash "$0" "$@"
fi

OUT=${1:-out/never-loses}
shift || true
STEPS=${*:-anns anns-before crawler-high crawler-high-before}
SEEDS=${SEEDS:-0 1 2}
SR=${SR:-.venv/bin/streamrag}
PY=${PY:-.venv/bin/python}
COMMON=(--token-budget 256 --dtype auto --policies fcfs --eviction cost)
BEFORE=(--speculative-share off --stability-hints off --doc-order ranked)
mkdir -p "$OUT"
[[ -f "$OUT/anns.jsonl" && -f "$OUT/crawler-120.jsonl" ]] || bash scripts/bench_paper.sh "$OUT" traces

for step in $STEPS; do
  case $step in
    anns)                args=(--trace "$OUT/anns.jsonl" --qps 0.333) ;;
    anns-before)         args=(--trace "$OUT/anns.jsonl" --qps 0.333 "${BEFORE[@]}") ;;
    crawler-high)        args=(--trace "$OUT/crawler-120.jsonl" --qps 1.333) ;;
    crawler-high-before) args=(--trace "$OUT/crawler-120.jsonl" --qps 1.333 "${BEFORE[@]}") ;;
    anns-sweep)          args=(--trace "$OUT/anns.jsonl" --qps 0.167 --qps 0.667) ;;
    anns-low)            args=(--trace "$OUT/anns.jsonl" --qps 0.167) ;;
    anns-high)           args=(--trace "$OUT/anns.jsonl" --qps 0.667) ;;
    crawler-sweep)       args=(--trace "$OUT/crawler.jsonl" --qps 0.167 --qps 0.333 --qps 0.667) ;;
    # Same pools and stretch as bench_paper.sh's pressure steps; args come after COMMON, so their --eviction wins.
    pressure-anns)       args=(--trace "$OUT/anns.jsonl" --qps 0.667 --kv-device-blocks 160 --delay-multiplier 10
                               --eviction recompute,swap,cost) ;;
    pressure-crawler)    args=(--trace "$OUT/crawler.jsonl" --qps 1.333 --kv-device-blocks 256
                               --eviction recompute,swap,cost) ;;
    anns-t10)
      [[ -f "$OUT/anns-t10.jsonl" ]] || $SR trace synth ${PASSAGES:+--passages "$PASSAGES"} --workload anns --queries 30 --token-scale 0.05 \
        --time-scale 10 --seed 1 --out "$OUT/anns-t10.jsonl"
      args=(--trace "$OUT/anns-t10.jsonl" --qps 0.2) ;;
    *) echo "unknown step: $step" >&2; exit 2 ;;
  esac
  dir=$step${TAG:+-$TAG}
  runs=()
  for seed in $SEEDS; do
    echo "== $step, seed $seed"
    # shellcheck disable=SC2086  # EXTRA is a list of flags
    $SR bench replay "${COMMON[@]}" "${args[@]}" ${EXTRA:-} --seed "$seed" --out "$OUT/$dir/seed-$seed"
    runs+=("$OUT/$dir/seed-$seed")
  done
  $PY -m load_tests.seeds "${runs[@]}" --label "$dir" | tee "$OUT/$dir/seeds.md"
done
