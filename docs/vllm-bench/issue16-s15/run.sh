#!/bin/bash
# usage: run.sh NAME -- bench args...   (sampler + vLLM step log named after NAME)
name=$1; shift; shift
mkdir -p out/s15/$name
$VPY -m load_tests.cpu_sampler record --out out/s15/$name/cpu.jsonl --interval 0.25 --threads-of spawn_main &
sp=$!
STREAMRAG_VLLM_STEP_LOG=out/s15/$name/steps $VSR bench replay "$@" --out out/s15/$name/run > out/s15/$name/bench.log 2>&1
rc=$?
kill $sp; wait $sp
exit $rc
